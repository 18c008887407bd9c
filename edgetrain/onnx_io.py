"""ModelProto <-> IR. The only module that imports ``onnx``."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.external_data_helper import load_external_data_for_model, uses_external_data

from . import atomic, opset
from .inline import inline_functions
from .errors import ModelLoadError, UnsupportedOpError
from .ir import Graph, Node, SequenceType, TensorType, Value
from .ir.dtypes import to_numpy, to_onnx
from .ops import check_attributes
from .reading import read_regular

# 1-12 are brought to their opset-13 form at load (edgetrain.opset); the newest is what the installed onnx defines
SUPPORTED_ONNX_OPSETS = range(1, onnx.defs.onnx_opset_version() + 1)


def load_model(model) -> onnx.ModelProto:
    """A ModelProto from a path, bytes or a ModelProto (ONNX, or ORT format: ``edgetrain.ortformat``), with
    external data checked and loaded."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        return _parse(bytes(model), "<bytes>")
    path = Path(os.fspath(model))
    try:
        data = read_regular(path)
    except OSError as e:
        raise ModelLoadError(f"cannot read model file '{path}': {e.strerror}") from None
    proto = _parse(data, str(path))
    _load_external_data(proto, path.parent.resolve(), str(path))
    return proto


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    if not data:
        raise ModelLoadError(f"model file '{where}' is empty")
    from . import ortformat       # an ORT-format model (.ort) reads into the same ModelProto
    if ortformat.is_ort_format(data):
        return ortformat.to_model_proto(data, where)
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as e:  # protobuf raises DecodeError, or RuntimeWarning-like errors on truncation
        raise ModelLoadError(f"model file '{where}' is not a valid ONNX model (truncated or corrupt): {e}") from None
    if not proto.HasField("graph") or not proto.opset_import:
        raise ModelLoadError(f"model file '{where}' is not a valid ONNX model: it has no graph or no opset import")
    return proto


def _load_external_data(proto: onnx.ModelProto, folder: Path, where: str):
    tensors = [t for t in _all_tensors(proto.graph) if uses_external_data(t)]
    for t in tensors:
        location = next((e.value for e in t.external_data if e.key == "location"), "")
        target = (folder / location).resolve()
        if not location or os.path.isabs(location) or not target.is_relative_to(folder):
            raise ModelLoadError(f"model '{where}': external data of tensor '{t.name}' points to '{location}', "
                                 f"outside the model's folder '{folder}'; refusing to read it")
        if not target.is_file():
            raise ModelLoadError(f"model '{where}': external data file '{location}' of tensor '{t.name}' is missing")
    if tensors:
        try:
            load_external_data_for_model(proto, str(folder))
        except Exception as e:
            raise ModelLoadError(f"model '{where}': cannot load external data: {e}") from None


def _all_tensors(graph):
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t


def _tensor_type(vi, where: str) -> TensorType | SequenceType:
    tt = vi.type.tensor_type
    if vi.type.HasField("sequence_type") and vi.type.sequence_type.elem_type.HasField("tensor_type"):
        elem = vi.type.sequence_type.elem_type.tensor_type.elem_type
        return SequenceType(to_numpy(elem, f"{where} '{vi.name}'"))
    if not vi.type.HasField("tensor_type"):
        raise UnsupportedOpError(f"{where} '{vi.name}' is not a tensor or a sequence of tensors")
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
    if any(isinstance(d, int) and d < 0 for d in dims):
        raise ModelLoadError(f"{where} '{vi.name}' is declared with shape {list(dims)}: dims must be >= 0")
    return TensorType(to_numpy(tt.elem_type, f"{where} '{vi.name}'"), dims)


def _array(t: onnx.TensorProto, what: str) -> np.ndarray:
    """The tensor's values; data that does not fill its declared dims is the file's error, named."""
    try:
        return numpy_helper.to_array(t)
    except ValueError as e:
        raise ModelLoadError(f"{what} declares dims {list(t.dims)} that its data does not match: {e}") from None


def _attr_value(a: onnx.AttributeProto):
    kind = a.type
    if kind == onnx.AttributeProto.TENSOR:
        return _array(a.t, f"tensor attribute '{a.name}'")
    if kind == onnx.AttributeProto.STRING:
        return a.s.decode("utf-8")
    if kind == onnx.AttributeProto.STRINGS:
        return tuple(s.decode("utf-8") for s in a.strings)
    value = onnx.helper.get_attribute_value(a)
    return tuple(value) if isinstance(value, list) else value


def to_graph(model) -> Graph:
    """Import an ONNX model (path, bytes or ModelProto) into a verified IR Graph."""
    proto = load_model(model)
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}
    onnx_opset = opsets.get("")
    if onnx_opset is not None and onnx_opset not in SUPPORTED_ONNX_OPSETS:
        raise UnsupportedOpError(f"model imports ai.onnx opset {onnx_opset}; supported opsets are "
                                 f"{SUPPORTED_ONNX_OPSETS.start}-{SUPPORTED_ONNX_OPSETS.stop - 1} "
                                 "(those the installed onnx package defines)")
    proto = inline_functions(proto)     # ops ONNX defines by a function body the table lacks: their body
    g = proto.graph
    initializers = {}
    for t in g.initializer:
        to_numpy(t.data_type, f"initializer '{t.name}'")
        initializers[t.name] = _array(t, f"initializer '{t.name}'")
    inputs = [Value(vi.name, _tensor_type(vi, "graph input")) for vi in g.input if vi.name not in initializers]
    # an output declared without any type (``make_empty_tensor_value_info``) gets its type when planning
    outputs = [Value(vi.name, _tensor_type(vi, "graph output") if vi.type.WhichOneof("value") else None)
               for vi in g.output]
    nodes = []
    for i, n in enumerate(g.node):
        node = Node(n.op_type, list(n.input), list(n.output), {a.name: _attr_value(a) for a in n.attribute},
                    n.name or f"{n.op_type}_{i}", n.domain if n.domain != "ai.onnx" else "")
        nodes.append(node)
    value_types = {}
    for vi in g.value_info:      # hints: one with a negative dim is dropped, not trusted
        dims = vi.type.tensor_type.shape.dim
        if (vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type in _KNOWN_ELEM_TYPES
                and all(d.dim_value >= 0 for d in dims)):
            value_types[vi.name] = _tensor_type(vi, "value")
    graph = Graph(nodes, inputs, outputs, initializers, opsets, value_types, g.name or "graph")
    return check_attributes(opset.upgrade(graph, _schema_changed).verify())


def _schema_changed(op_type: str, old: int, new: int) -> bool:
    return schema_since_version(op_type, old) != schema_since_version(op_type, new)


_KNOWN_ELEM_TYPES = {1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13}


def _value_info(v: Value) -> onnx.ValueInfoProto:
    if v.type is None:
        return onnx.helper.make_empty_tensor_value_info(v.name)
    if isinstance(v.type, SequenceType):
        return onnx.helper.make_tensor_sequence_value_info(v.name, to_onnx(v.type.dtype), None)
    dims = [d if d is not None else None for d in v.type.shape]
    return onnx.helper.make_tensor_value_info(v.name, to_onnx(v.type.dtype), dims)


def tensor_proto(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def tensor_value(t: onnx.TensorProto) -> np.ndarray:
    return numpy_helper.to_array(t)


def ir_version_of(model) -> int:
    return load_model(model).ir_version


def save_model(model: onnx.ModelProto, path) -> None:
    """Write a model atomically (``edgetrain.atomic``: random temporary name, fsync, rename)."""
    atomic.write_atomic(path, model.SerializeToString())


def check(model: onnx.ModelProto) -> None:
    """onnx's own checker, for a model edgetrain wrote (a second opinion on our IR)."""
    onnx.checker.check_model(model)


def from_graph(graph: Graph, producer: str = "edgetrain", ir_version: int = 8) -> onnx.ModelProto:
    """Export an IR Graph as a ModelProto (attributes, initializers and opset imports kept)."""
    nodes = []
    for n in graph.nodes:
        attrs = {k: (numpy_helper.from_array(np.asarray(v)) if isinstance(v, np.ndarray) else v)
                 for k, v in n.attrs.items()}
        nodes.append(onnx.helper.make_node(n.op_type, n.inputs, n.outputs, name=n.name, domain=n.domain, **attrs))
    inits = [numpy_helper.from_array(np.asarray(a), name) for name, a in graph.initializers.items()]
    declared = {v.name for v in graph.inputs} | {v.name for v in graph.outputs} | set(graph.initializers)
    value_info = [_value_info(Value(name, t)) for name, t in graph.value_types.items() if name not in declared]
    g = onnx.helper.make_graph(nodes, graph.name, [_value_info(v) for v in graph.inputs],
                               [_value_info(v) for v in graph.outputs], inits, value_info=value_info)
    opsets = [onnx.helper.make_opsetid(d, v) for d, v in sorted(graph.opsets.items())]
    return onnx.helper.make_model(g, opset_imports=opsets, producer_name=producer, ir_version=ir_version)


def schema_since_version(op_type: str, opset: int, domain: str = "") -> int | None:
    """The version of ``op_type``'s ONNX schema in force at ``opset`` (None: ONNX does not define it)."""
    import onnx.defs
    try:
        return int(onnx.defs.get_schema(op_type, opset, domain).since_version)
    except onnx.defs.SchemaError:
        return None


# -- ModelProto editing for onnxblock (whose blocks, as ORT's, build on an ``onnx.ModelProto``) ---------------
def node_proto(op_type: str, inputs: list[str], outputs: list[str], name: str, domain: str = "",
               attrs: dict | None = None) -> onnx.NodeProto:
    attrs = {k: (numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v) for k, v in (attrs or {}).items()}
    return onnx.helper.make_node(op_type, inputs, outputs, name=name, domain=domain or None, **attrs)


def value_info(name: str, t: TensorType | SequenceType | None) -> onnx.ValueInfoProto:
    """A graph input/output declaration for an IR type (symbolic dims kept as dim_param)."""
    return _value_info(Value(name, t))


def opset_id(domain: str, version: int) -> onnx.OperatorSetIdProto:
    return onnx.helper.make_opsetid(domain, version)


def empty_model(opset_version: int | None) -> onnx.ModelProto:
    """An empty model as ORT's ``onnxblock.empty_base`` makes it: graph 'graph', opsets com.microsoft 1 and
    ai.onnx ``opset_version`` (default: the newest onnx defines that edgetrain reads)."""
    model = onnx.ModelProto()
    model.producer_name = "orttraining"
    model.graph.name = "graph"
    newest = min(onnx.defs.onnx_opset_version(), SUPPORTED_ONNX_OPSETS.stop - 1)
    model.opset_import.extend([opset_id("com.microsoft", 1), opset_id("", opset_version or newest)])
    # the lowest IR version for the opset (ORT writes onnx.IR_VERSION, which its pinned onnx keeps at what
    # ORT 1.19 reads; the installed onnx's may be newer than any ORT 1.19 accepts)
    model.ir_version = onnx.helper.find_min_ir_version_for([opset_id("", opset_version or newest)])
    return model


def inferred_types(model: onnx.ModelProto) -> dict[str, TensorType | SequenceType | None]:
    """Types from ``onnx.shape_inference`` (for graphs holding ops edgetrain has no shape rule for)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        try:
            types[vi.name] = _tensor_type(vi, "value")
        except (UnsupportedOpError, ModelLoadError):   # not a tensor, or an element type edgetrain lacks
            types[vi.name] = None
    return types
