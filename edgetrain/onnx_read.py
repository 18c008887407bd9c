"""ONNX model bytes -> IR Graph, decoded from the protobuf wire by hand: no ``onnx``, no ``protobuf``.

Importing onnx and protobuf costs a device process 0.15-0.25 s before the first step, and training artifacts
need neither: their nodes are all in the op table, their tensors are raw little-endian bytes. ``read`` decodes
the subset of onnx.proto such a model uses (the counterpart of ``onnx_wire``, which writes it) into exactly the
graph ``onnx_io.to_graph`` builds, and raises ``NeedsOnnx`` for anything outside that subset: an op the table
lacks (a function op to inline, or one to refuse with onnx's schema at hand), model-local functions, external
or typed-but-unusual tensor data, element types beyond numpy's, subgraph or sparse attributes, an opset newer
than every supported onnx defines, an ORT-format file, or bytes that do not parse. ``compact.load_graph`` then
hands the file to ``onnx_io``, so every such case, errors included, behaves as it did.

The bytes are hostile until checked: every length is checked against the message it lies in before it is
used, tensors' byte counts must equal their dims' product times the element size before they are copied out
of the file's bytes (nothing is allocated from a declared size), and nested messages are decoded by fixed
functions of bounded depth (no recursion driven by the file). ``EDGETRAIN_NO_WIRE_READER=1`` switches the reader off.
"""
from __future__ import annotations

import math
import struct

import numpy as np

from . import opset
from .errors import EdgetrainError
from .ir import Graph, Node, SequenceType, TensorType, Value
from .ir.dtypes import ONNX_TO_NUMPY
from .ops import OP_TABLE, check_attributes
from .ortformat_schema import FILE_IDENTIFIER

# the newest ai.onnx opset every onnx edgetrain supports (>= 1.15) defines; newer ones go through onnx_io, which
# asks the installed onnx
NEWEST_OPSET = 20
_BASIC_TYPES = {k: ONNX_TO_NUMPY[k] for k in (1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13)}
_KNOWN_ELEM_TYPES = set(_BASIC_TYPES)       # value_info hints kept, as onnx_io keeps them
_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
# AttributeProto.AttributeType: the kinds read here (GRAPH, SPARSE_TENSOR, TYPE_PROTO and their lists are not)
_FLOAT, _INT, _STRING, _TENSOR, _FLOATS, _INTS, _STRINGS = 1, 2, 3, 4, 6, 7, 8
_F32 = struct.Struct("<f")
_TYPED_FIELDS = {4: np.dtype("<f4"), 10: np.dtype("<f8")}   # TensorProto float_data, double_data (packed)


class NeedsOnnx(EdgetrainError):
    """The model uses something this reader leaves to ``onnx_io`` (the message says what)."""


class _Msg:
    """One message's fields: field number -> list of values (int for varints and fixed, (start, end) for
    length-delimited), decoded from ``buf[start:end]`` with every length checked against ``end``."""
    __slots__ = ("buf", "fields")

    def __init__(self, buf, start: int, end: int):
        self.buf = buf
        fields: dict[int, list] = {}
        pos = start
        while pos < end:
            key = buf[pos]
            if key < 0x80:          # one-byte keys and lengths are the common case: no call
                pos += 1
            else:
                key, pos = _varint(buf, pos, end)
            field, wire = key >> 3, key & 7
            if wire == _LEN:
                n = buf[pos] if pos < end else 0x80
                if n < 0x80:
                    pos += 1
                else:
                    n, pos = _varint(buf, pos, end)
                if n > end - pos:
                    raise NeedsOnnx(f"a field of {n} bytes runs past its message")
                value, pos = (pos, pos + n), pos + n
            elif wire == _VARINT:
                value, pos = _varint(buf, pos, end)
            elif wire == _FIXED32:
                if pos + 4 > end:
                    raise NeedsOnnx("a fixed32 field runs past its message")
                value, pos = pos, pos + 4
            elif wire == _FIXED64:
                if pos + 8 > end:
                    raise NeedsOnnx("a fixed64 field runs past its message")
                value, pos = pos, pos + 8
            else:
                raise NeedsOnnx(f"wire type {wire} (groups are not in onnx.proto)")
            if field == 0:
                raise NeedsOnnx("field number 0")
            got = fields.get(field)
            if got is None:
                fields[field] = [(wire, value)]
            else:
                got.append((wire, value))
        self.fields = fields

    def _last(self, field: int, wire: int):
        values = self.fields.get(field)
        if not values:
            return None
        got, value = values[-1]
        if got != wire:
            raise NeedsOnnx(f"field {field} has wire type {got}, expected {wire}")
        return value

    def has(self, field: int) -> bool:
        return field in self.fields

    def int(self, field: int, default: int = 0) -> int:
        """A varint scalar as an int64 (the last one wins, as in protobuf)."""
        v = self._last(field, _VARINT)
        return default if v is None else (v - (1 << 64) if v >= 1 << 63 else v)

    def bytes(self, field: int) -> bytes:
        v = self._last(field, _LEN)
        return b"" if v is None else bytes(self.buf[v[0]:v[1]])

    def str(self, field: int) -> str:
        v = self._last(field, _LEN)
        if v is None:
            return ""
        try:
            return str(self.buf[v[0]:v[1]], "utf-8")      # decoded from the view: no bytes copy first
        except UnicodeDecodeError:
            raise NeedsOnnx(f"field {field} is not UTF-8") from None

    def strs(self, field: int) -> list[str]:
        out = []
        for wire, v in self.fields.get(field, ()):
            if wire != _LEN:
                raise NeedsOnnx(f"field {field} has wire type {wire}, expected a string")
            try:
                out.append(str(self.buf[v[0]:v[1]], "utf-8"))
            except UnicodeDecodeError:
                raise NeedsOnnx(f"field {field} is not UTF-8") from None
        return out

    def msg(self, field: int) -> _Msg | None:
        """A singular message field (one occurrence: protobuf would merge repeats, which this does not)."""
        span = self.span(field)
        return None if span is None else _Msg(self.buf, *span)

    def span(self, field: int) -> tuple[int, int] | None:
        """Where a singular message field lies (checked as ``msg`` checks it), without decoding it."""
        values = self.fields.get(field)
        if not values:
            return None
        if len(values) > 1:
            raise NeedsOnnx(f"message field {field} occurs {len(values)} times")
        wire, v = values[0]
        if wire != _LEN:
            raise NeedsOnnx(f"field {field} has wire type {wire}, expected a message")
        return v

    def msgs(self, field: int) -> list[_Msg]:
        out = []
        for wire, v in self.fields.get(field, ()):
            if wire != _LEN:
                raise NeedsOnnx(f"field {field} has wire type {wire}, expected a message")
            out.append(_Msg(self.buf, *v))
        return out

    def ints(self, field: int) -> list[int]:
        """A repeated int64 field, packed or not (protobuf parsers accept both)."""
        out = []
        for wire, v in self.fields.get(field, ()):
            if wire == _VARINT:
                out.append(v)
            elif wire == _LEN:
                pos, end = v
                while pos < end:
                    n, pos = _varint(self.buf, pos, end)
                    out.append(n)
            else:
                raise NeedsOnnx(f"field {field} has wire type {wire}, expected int64s")
        return [n - (1 << 64) if n >= 1 << 63 else n for n in out]

    def floats(self, field: int) -> list[float]:
        out = []
        for wire, v in self.fields.get(field, ()):
            if wire == _FIXED32:
                out.append(_F32.unpack_from(self.buf, v)[0])
            elif wire == _LEN and (v[1] - v[0]) % 4 == 0:
                out.extend(np.frombuffer(self.buf, "<f4", (v[1] - v[0]) // 4, v[0]).tolist())
            else:
                raise NeedsOnnx(f"field {field} is not a list of floats")
        return out


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise NeedsOnnx("a truncated or overlong varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & ((1 << 64) - 1), pos
        shift += 7


# onnx.proto field numbers (the ones read; others are skipped, as any protobuf parser does)
M_OPSET, M_GRAPH, M_FUNCTIONS = 8, 7, 25
G_NODE, G_NAME, G_INIT, G_SPARSE_INIT, G_INPUT, G_OUTPUT, G_VALUE_INFO = 1, 2, 5, 15, 11, 12, 13
N_INPUT, N_OUTPUT, N_NAME, N_OP, N_ATTR, N_DOMAIN = 1, 2, 3, 4, 5, 7
A_NAME, A_F, A_I, A_S, A_T, A_FLOATS, A_INTS, A_STRINGS, A_TYPE, A_REF = 1, 2, 3, 4, 5, 7, 8, 9, 20, 21
T_DIMS, T_TYPE, T_SEGMENT, T_NAME, T_RAW, T_EXTERNAL, T_LOCATION = 1, 2, 3, 8, 9, 13, 14
T_INT32, T_STRING, T_INT64, T_UINT64 = 5, 6, 7, 11
VI_NAME, VI_TYPE = 1, 2
TY_TENSOR, TY_SEQUENCE = 1, 4
TT_ELEM, TT_SHAPE, SHAPE_DIM, DIM_VALUE, DIM_PARAM = 1, 2, 1, 1, 2


def _tensor(t: _Msg, what: str) -> np.ndarray:
    """A TensorProto's values as numpy_helper.to_array gives them, for raw or packed typed data."""
    code = t.int(T_TYPE)
    dtype = _BASIC_TYPES.get(code)
    if dtype is None:
        raise NeedsOnnx(f"{what} has element type {code}")
    if t.has(T_SEGMENT) or t.has(T_EXTERNAL) or t.int(T_LOCATION):
        raise NeedsOnnx(f"{what} is segmented or stored outside the file")
    dims = t.ints(T_DIMS)
    if any(d < 0 for d in dims) or len(dims) > 64:      # numpy's limit on dims
        raise NeedsOnnx(f"{what} has a negative dim or more than 64")
    count = math.prod(dims)
    raw = t._last(T_RAW, _LEN)
    if raw is not None:
        if raw[1] - raw[0] != count * dtype.itemsize:
            raise NeedsOnnx(f"{what}'s raw data does not fill its dims")
        # a copy: a view at the tensor's offset in the file may be misaligned, which BLAS answers with a copy per
        # call and Numba with another specialization; the file's buffer is then freed, as onnx's parse is
        return np.frombuffer(t.buf, dtype.newbyteorder("<"), count, raw[0]).astype(dtype).reshape(dims)
    typed = [f for f in t.fields if f in (*_TYPED_FIELDS, T_INT32, T_STRING, T_INT64, T_UINT64)]
    if not typed:
        if count:
            raise NeedsOnnx(f"{what} has no data")
        return np.zeros(dims, dtype)
    if len(typed) > 1:
        raise NeedsOnnx(f"{what} has data in two fields")
    field = typed[0]
    if field in _TYPED_FIELDS:
        values = np.asarray(t.floats(field) if field == 4 else _doubles(t, field), _TYPED_FIELDS[field])
    elif field in (T_INT32, T_INT64, T_UINT64):
        values = np.array(t.ints(field) if field != T_UINT64 else [v & ((1 << 64) - 1) for v in t.ints(field)],
                          np.int64 if field != T_UINT64 else np.uint64)
    else:
        raise NeedsOnnx(f"{what} holds strings")
    if values.size != count or code not in _TYPED_FOR.get(field, ()):
        raise NeedsOnnx(f"{what}'s typed data does not fit its type or dims")
    if code == 10:                  # float16 values travel as their bit patterns in int32_data
        return values.astype(np.uint16).view(np.float16).reshape(dims)
    return values.astype(dtype).reshape(dims)


# which TensorProto typed field holds each element type (onnx.proto's comments)
_TYPED_FOR = {4: (1,), 10: (11,), T_INT32: (2, 3, 4, 5, 6, 9, 10), T_INT64: (7,), T_UINT64: (12, 13)}


def _doubles(t: _Msg, field: int) -> list[float]:
    out = []
    for wire, v in t.fields.get(field, ()):
        if wire == _FIXED64:
            out.append(struct.unpack_from("<d", t.buf, v)[0])
        elif wire == _LEN and (v[1] - v[0]) % 8 == 0:
            out.extend(np.frombuffer(t.buf, "<f8", (v[1] - v[0]) // 8, v[0]).tolist())
        else:
            raise NeedsOnnx(f"field {field} is not a list of doubles")
    return out


def _cached(decode, vi: _Msg, cache: dict, *args):
    """``decode(TypeProto or None, *args)`` for a ValueInfoProto, once per distinct TypeProto bytes.

    A training model repeats a few dozen types over hundreds of values; the result is a function of the bytes
    alone (``args`` only name the value in errors, and errors are not cached), and types are immutable."""
    span = vi.span(VI_TYPE)
    if span is None:
        return decode(None, *args)
    key = (decode, bytes(vi.buf[span[0]:span[1]]))
    got = cache.get(key, cache)
    if got is cache:
        got = cache[key] = decode(_Msg(vi.buf, *span), *args)
    return got


def _type(vi: _Msg, what: str, cache: dict) -> TensorType | SequenceType | None:
    """A ValueInfoProto's type as onnx_io's ``_tensor_type`` makes it (None: no type given)."""
    return _cached(_type_of, vi, cache, what)


def _type_of(ty: _Msg | None, what: str) -> TensorType | SequenceType | None:
    if ty is None or not ty.fields:
        return None
    seq = ty.msg(TY_SEQUENCE)
    if seq is not None:
        elem = seq.msg(1)
        tensor = elem.msg(TY_TENSOR) if elem is not None else None
        if tensor is None or len(ty.fields) > 1:
            raise NeedsOnnx(f"{what} is a sequence of something other than tensors")
        return SequenceType(_elem(tensor.int(TT_ELEM), what))
    tt = ty.msg(TY_TENSOR)
    if tt is None or len(ty.fields) > 1:
        raise NeedsOnnx(f"{what} is not a tensor")
    shape = tt.msg(TT_SHAPE)
    return _tensor_type(tt, shape.msgs(SHAPE_DIM) if shape is not None else [], what)


def _tensor_type(tt: _Msg, dims_msgs: list[_Msg], what: str) -> TensorType:
    dims = []
    for d in dims_msgs:
        if d.has(DIM_VALUE):
            value = d.int(DIM_VALUE)
            if value < 0:
                raise NeedsOnnx(f"{what} has a negative dim")
            dims.append(value)
        else:
            dims.append(d.str(DIM_PARAM) or None)
    return TensorType(_elem(tt.int(TT_ELEM), what), tuple(dims))


def _elem(code: int, what: str) -> np.dtype:
    dtype = _BASIC_TYPES.get(code)
    if dtype is None:
        raise NeedsOnnx(f"{what} has element type {code}")
    return dtype


def _hint(vi: _Msg, cache: dict) -> TensorType | None:
    """A value_info entry kept as onnx_io keeps it: a tensor of a known type with no negative dim (the rest as
    ``_type`` reads it, from the messages decoded here: training models carry a hint for most values)."""
    return _cached(_hint_of, vi, cache)


def _hint_of(ty: _Msg | None) -> TensorType | None:
    tt = ty.msg(TY_TENSOR) if ty is not None else None
    if tt is None or tt.int(TT_ELEM) not in _KNOWN_ELEM_TYPES:
        return None
    shape = tt.msg(TT_SHAPE)
    dims = shape.msgs(SHAPE_DIM) if shape is not None else []
    if any(d.int(DIM_VALUE) < 0 for d in dims):
        return None
    if len(ty.fields) > 1:
        raise NeedsOnnx("value is not a tensor")
    return _tensor_type(tt, dims, "value")


def _attr(a: _Msg, what: str):
    if a.has(A_REF):
        raise NeedsOnnx(f"{what} refers to a function's attribute")
    kind = a.int(A_TYPE)
    if kind == _FLOAT:
        v = a._last(A_F, _FIXED32)
        return 0.0 if v is None else _F32.unpack_from(a.buf, v)[0]
    if kind == _INT:
        return a.int(A_I)
    if kind == _STRING:
        return a.str(A_S)
    if kind == _TENSOR:
        t = a.msg(A_T)
        if t is None:
            raise NeedsOnnx(f"{what} has no tensor")
        return _tensor(t, what)
    if kind == _FLOATS:
        return tuple(a.floats(A_FLOATS))
    if kind == _INTS:
        return tuple(a.ints(A_INTS))
    if kind == _STRINGS:
        return tuple(a.strs(A_STRINGS))
    raise NeedsOnnx(f"{what} is of attribute type {kind}")


def read(data, where: str = "<bytes>") -> Graph:
    """The IR graph of ONNX model bytes, equal to ``onnx_io.to_graph``'s, or ``NeedsOnnx`` saying why this
    model needs onnx_io."""
    buf = memoryview(data).cast("B")
    if not len(buf):
        raise NeedsOnnx("empty")
    if bytes(buf[4:8]) == FILE_IDENTIFIER:
        raise NeedsOnnx("an ORT-format model")
    model = _Msg(buf, 0, len(buf))
    if model.has(M_FUNCTIONS):
        raise NeedsOnnx("model-local functions")
    g = model.msg(M_GRAPH)
    opsets = {}
    for o in model.msgs(M_OPSET):
        domain = o.str(1)
        opsets["" if domain == "ai.onnx" else domain] = o.int(2)
    if g is None or not opsets:
        raise NeedsOnnx("no graph or no opset import")
    onnx_opset = opsets.get("")
    if onnx_opset is not None and not 1 <= onnx_opset <= NEWEST_OPSET:
        raise NeedsOnnx(f"ai.onnx opset {onnx_opset}")
    if g.has(G_SPARSE_INIT):
        raise NeedsOnnx("sparse initializers")
    initializers = {}
    for t in g.msgs(G_INIT):
        name = t.str(T_NAME)
        initializers[name] = _tensor(t, f"initializer '{name}'")
    inputs = []
    types: dict = {}        # TypeProto bytes -> decoded type (``_cached``)
    for vi in g.msgs(G_INPUT):
        name = vi.str(VI_NAME)
        if name not in initializers:
            t = _type(vi, f"graph input '{name}'", types)
            if t is None:
                raise NeedsOnnx(f"graph input '{name}' has no type")
            inputs.append(Value(name, t))
    outputs = [Value(vi.str(VI_NAME), _type(vi, "graph output", types)) for vi in g.msgs(G_OUTPUT)]
    nodes = []
    for i, n in enumerate(g.msgs(G_NODE)):
        op_type, domain = n.str(N_OP), n.str(N_DOMAIN)
        domain = "" if domain == "ai.onnx" else domain
        if (domain, op_type) not in OP_TABLE:
            raise NeedsOnnx(f"op {domain or 'ai.onnx'}::{op_type} is not in the op table")
        name = n.str(N_NAME) or f"{op_type}_{i}"
        attrs = {}
        for a in n.msgs(N_ATTR):
            key = a.str(A_NAME)
            attrs[key] = _attr(a, f"attribute '{key}' of node '{name}'")
        nodes.append(Node(op_type, n.strs(N_INPUT), n.strs(N_OUTPUT), attrs, name, domain))
    value_types = {}
    for vi in g.msgs(G_VALUE_INFO):
        t = _hint(vi, types)
        if t is not None:
            value_types[vi.str(VI_NAME)] = t
    graph = Graph(nodes, inputs, outputs, initializers, opsets, value_types, g.str(G_NAME) or "graph")
    return check_attributes(opset.upgrade(graph, _schema_changed).verify())


def _schema_changed(op_type: str, old: int, new: int) -> bool:
    raise NeedsOnnx(f"{op_type} at ai.onnx opset {old} needs onnx's schemas to upgrade")
