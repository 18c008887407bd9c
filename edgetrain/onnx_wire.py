"""An IR Graph -> ONNX ModelProto bytes, encoded on the protobuf wire by hand: no ``onnx``, no ``protobuf``.

The trimmed runtime has neither package, yet ``Module.export_model_for_inferencing`` must write an ONNX model
there too. The messages and field numbers are onnx.proto's (proto2); repeated numbers are written packed,
which every protobuf parser accepts. Attribute types follow ``onnx.helper.make_attribute``'s rules for the
Python values the IR holds (int/bool -> INT, float -> FLOAT, str -> STRING, ndarray -> TENSOR, sequences of
ints -> INTS, of numbers -> FLOATS, of str -> STRINGS), so the bytes parse to what ``onnx_io.from_graph``
builds with onnx.
"""
from __future__ import annotations

import struct
from numbers import Integral, Real

import numpy as np

from .errors import EdgetrainError
from .ir import Graph, SequenceType, TensorType, Value
from .ir.dtypes import to_onnx

# onnx.proto field numbers
MODEL_IR_VERSION, MODEL_PRODUCER_NAME, MODEL_GRAPH, MODEL_OPSET_IMPORT = 1, 2, 7, 8
OPSET_DOMAIN, OPSET_VERSION = 1, 2
GRAPH_NODE, GRAPH_NAME, GRAPH_INITIALIZER, GRAPH_INPUT, GRAPH_OUTPUT, GRAPH_VALUE_INFO = 1, 2, 5, 11, 12, 13
NODE_INPUT, NODE_OUTPUT, NODE_NAME, NODE_OP_TYPE, NODE_ATTRIBUTE, NODE_DOMAIN = 1, 2, 3, 4, 5, 7
ATTR_NAME, ATTR_F, ATTR_I, ATTR_S, ATTR_T, ATTR_FLOATS, ATTR_INTS, ATTR_STRINGS, ATTR_TYPE = 1, 2, 3, 4, 5, 7, 8, 9, 20
TENSOR_DIMS, TENSOR_DATA_TYPE, TENSOR_NAME, TENSOR_RAW_DATA = 1, 2, 8, 9
VALUE_INFO_NAME, VALUE_INFO_TYPE = 1, 2
TYPE_TENSOR, TYPE_SEQUENCE = 1, 4
TENSOR_TYPE_ELEM, TENSOR_TYPE_SHAPE = 1, 2
SEQUENCE_ELEM = 1
SHAPE_DIM, DIM_VALUE, DIM_PARAM = 1, 1, 2
# AttributeProto.AttributeType
FLOAT, INT, STRING, TENSOR, FLOATS, INTS, STRINGS = 1, 2, 3, 4, 6, 7, 8

_VARINT, _FIXED32, _LEN = 0, 5, 2


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1          # negative int64s take ten bytes, two's complement
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return varint(field << 3 | wire)


def int_field(field: int, n: int) -> bytes:
    return _key(field, _VARINT) + varint(int(n))


def bytes_field(field: int, data: bytes) -> bytes:
    return _key(field, _LEN) + varint(len(data)) + data


def str_field(field: int, s: str) -> bytes:
    return bytes_field(field, s.encode("utf-8"))


def float_field(field: int, x: float) -> bytes:
    return _key(field, _FIXED32) + struct.pack("<f", float(x))


def packed_ints(field: int, values) -> bytes:
    return bytes_field(field, b"".join(varint(int(v)) for v in values))


def packed_floats(field: int, values) -> bytes:
    return bytes_field(field, np.asarray(values, dtype="<f4").tobytes())


def tensor(name: str, value: np.ndarray) -> bytes:
    value = np.asarray(value)
    try:
        data_type = to_onnx(value.dtype)
    except KeyError:
        raise EdgetrainError(f"tensor '{name}' has dtype {value.dtype}, which ONNX export does not write") from None
    raw = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<")).tobytes()
    return (packed_ints(TENSOR_DIMS, value.shape) + int_field(TENSOR_DATA_TYPE, data_type)
            + (str_field(TENSOR_NAME, name) if name else b"") + bytes_field(TENSOR_RAW_DATA, raw))


def attribute(name: str, value, where: str) -> bytes:
    body = str_field(ATTR_NAME, name)
    if isinstance(value, np.ndarray):
        return body + bytes_field(ATTR_T, tensor("", value)) + int_field(ATTR_TYPE, TENSOR)
    if isinstance(value, (bool, Integral)):
        return body + int_field(ATTR_I, int(value)) + int_field(ATTR_TYPE, INT)
    if isinstance(value, Real):
        return body + float_field(ATTR_F, value) + int_field(ATTR_TYPE, FLOAT)
    if isinstance(value, (str, bytes)):
        data = value.encode("utf-8") if isinstance(value, str) else value
        return body + bytes_field(ATTR_S, data) + int_field(ATTR_TYPE, STRING)
    if isinstance(value, (list, tuple)):
        items = list(value)
        if all(isinstance(v, (bool, Integral)) for v in items):
            return body + packed_ints(ATTR_INTS, items) + int_field(ATTR_TYPE, INTS)
        if all(isinstance(v, Real) for v in items):
            return body + packed_floats(ATTR_FLOATS, items) + int_field(ATTR_TYPE, FLOATS)
        if all(isinstance(v, str) for v in items):
            return body + b"".join(str_field(ATTR_STRINGS, v) for v in items) + int_field(ATTR_TYPE, STRINGS)
    raise EdgetrainError(f"{where}: attribute '{name}' holds {type(value).__name__}, which ONNX export does not "
                         "write")


def _type(t: TensorType | SequenceType) -> bytes:
    if isinstance(t, SequenceType):
        elem = bytes_field(TYPE_TENSOR, int_field(TENSOR_TYPE_ELEM, to_onnx(t.dtype)))
        return bytes_field(TYPE_SEQUENCE, bytes_field(SEQUENCE_ELEM, elem))
    dims = b""
    for d in t.shape:
        if isinstance(d, str):
            dims += bytes_field(SHAPE_DIM, str_field(DIM_PARAM, d))
        elif d is None:
            dims += bytes_field(SHAPE_DIM, b"")
        else:
            dims += bytes_field(SHAPE_DIM, int_field(DIM_VALUE, d))
    body = int_field(TENSOR_TYPE_ELEM, to_onnx(t.dtype)) + bytes_field(TENSOR_TYPE_SHAPE, dims)
    return bytes_field(TYPE_TENSOR, body)


def value_info(v: Value) -> bytes:
    body = str_field(VALUE_INFO_NAME, v.name)
    return body if v.type is None else body + bytes_field(VALUE_INFO_TYPE, _type(v.type))


def model_bytes(graph: Graph, producer: str = "edgetrain", ir_version: int = 8) -> bytes:
    """The ModelProto bytes of ``graph``: nodes, initializers, declared inputs/outputs, known value types and
    opset imports (what ``onnx_io.from_graph`` writes, without onnx)."""
    g = b""
    for n in graph.nodes:
        body = b"".join(str_field(NODE_INPUT, i) for i in n.inputs)
        body += b"".join(str_field(NODE_OUTPUT, o) for o in n.outputs)
        body += (str_field(NODE_NAME, n.name) if n.name else b"") + str_field(NODE_OP_TYPE, n.op_type)
        # sorted by name, as onnx.helper.make_node orders them
        body += b"".join(bytes_field(NODE_ATTRIBUTE, attribute(k, v, str(n))) for k, v in sorted(n.attrs.items()))
        body += str_field(NODE_DOMAIN, n.domain)
        g += bytes_field(GRAPH_NODE, body)
    g += str_field(GRAPH_NAME, graph.name)
    g += b"".join(bytes_field(GRAPH_INITIALIZER, tensor(k, a)) for k, a in graph.initializers.items())
    g += b"".join(bytes_field(GRAPH_INPUT, value_info(v)) for v in graph.inputs)
    g += b"".join(bytes_field(GRAPH_OUTPUT, value_info(v)) for v in graph.outputs)
    declared = {v.name for v in graph.inputs} | {v.name for v in graph.outputs} | set(graph.initializers)
    g += b"".join(bytes_field(GRAPH_VALUE_INFO, value_info(Value(k, t)))
                  for k, t in graph.value_types.items() if k not in declared)
    model = int_field(MODEL_IR_VERSION, ir_version) + str_field(MODEL_PRODUCER_NAME, producer)
    model += bytes_field(MODEL_GRAPH, g)
    for domain, version in sorted(graph.opsets.items()):
        model += bytes_field(MODEL_OPSET_IMPORT, str_field(OPSET_DOMAIN, domain) + int_field(OPSET_VERSION, version))
    return model
