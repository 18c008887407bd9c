"""ONNX model -> ORT-format model (``.ort``, ``ort.fbs``), as ONNX Runtime 1.19 writes it, without onnxruntime.

What ORT needs besides the graph itself, and where it comes from here:

- each node's ``since_version`` and ``input_arg_counts`` (how many arguments fill each formal input) and the
  kernel type-string resolver (for each op in the model, which formal inputs and outputs each type string of
  its kernels binds) all come from the op's schema: ONNX's own (``onnx.defs``) for the ONNX domains, and for
  onnxruntime's training and contrib ops the table in ``ort_schemas`` (recorded from ORT 1.19.2);
- every value's type comes from the model's inputs, outputs, initializers and ``value_info`` (edgetrain's
  artifacts declare them all); a value without one is written untyped;
- nodes are not assigned to an execution provider: ORT assigns them when it loads the file.

The opset imports are kept as they are: no op is upgraded, no graph optimization runs.
"""
from __future__ import annotations

import flatbuffers
import numpy as np
import onnx
import onnx.defs
from onnx import numpy_helper

from . import atomic
from . import ortformat_schema as S
from .errors import EdgetrainError
from .onnx_io import load_model
from .ort_schemas import ORT_SCHEMAS

ONNX_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.training", "ai.onnx.preview.training")


class OrtFormatError(EdgetrainError):
    """A model cannot be written in ORT format (an op without a known schema, a string tensor, a subgraph)."""


def formal_params(domain: str, op_type: str, opset: int) -> tuple[int, tuple, tuple, bool]:
    """(since_version, kernel type string of each formal input, of each formal output, last input variadic).

    A formal parameter's kernel type string is its type constraint's name (``T``) when it has one, else the
    parameter's own name (``axes`` of ReduceSum-13), as ORT's ``KernelTypeStrResolver`` registers schemas.
    """
    versions = ORT_SCHEMAS.get((domain, op_type))
    if versions is not None:
        usable = [v for v in versions if v <= opset]
        if not usable:
            raise OrtFormatError(f"op '{op_type}' of domain '{domain or 'ai.onnx'}' needs opset "
                                 f">= {min(versions)} of its domain; the model imports {opset}")
        since = max(usable)
        ins, outs = versions[since]
        variadic = bool(ins) and ins[-1].endswith("*")
        return since, tuple(s.rstrip("*") for s in ins), tuple(outs), variadic
    if domain not in ONNX_DOMAINS:
        raise OrtFormatError(f"op '{op_type}' of domain '{domain}' has no schema edgetrain knows for the ORT "
                             "format (edgetrain/ort_schemas.py lists onnxruntime's ops)")
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        raise OrtFormatError(f"op '{op_type}' of domain '{domain or 'ai.onnx'}' is not defined at opset {opset}"
                             ) from None
    constraints = {c.type_param_str for c in schema.type_constraints}

    def kernel_type_str(p):
        return p.type_str if p.type_str in constraints else p.name

    variadic = bool(schema.inputs) and schema.inputs[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
    return (int(schema.since_version), tuple(kernel_type_str(p) for p in schema.inputs),
            tuple(kernel_type_str(p) for p in schema.outputs), variadic)


def _arg_counts(node: onnx.NodeProto, n_formal: int, variadic: bool) -> list[int]:
    n = len(node.input)
    if n > n_formal and not variadic:
        raise OrtFormatError(f"node '{node.name}' ({node.op_type}) has {n} inputs; its schema has {n_formal}")
    counts = [1 if i < n else 0 for i in range(n_formal)]
    if variadic and n_formal:
        counts[-1] = max(0, n - (n_formal - 1))
    return counts


def _resolver_entry(since, ins, outs) -> dict[str, list[tuple[int, int]]]:
    entry: dict[str, list[tuple[int, int]]] = {}
    for kind, strs in ((S.ArgTypeAndIndex.INPUT, ins), (S.ArgTypeAndIndex.OUTPUT, outs)):
        for i, s in enumerate(strs):
            entry.setdefault(s, []).append((kind, i))
    return entry


class _Writer:
    def __init__(self, b: flatbuffers.Builder):
        self.b = b
        self._strings: dict[str, int] = {}

    def string(self, s: str) -> int:
        # shared strings: value names repeat across nodes, node args and edges
        off = self._strings.get(s)
        if off is None:
            off = self._strings[s] = self.b.CreateString(s)
        return off

    def offsets(self, items: list[int]) -> int:
        b = self.b
        b.StartVector(4, len(items), 4)
        for off in reversed(items):
            b.PrependUOffsetTRelative(off)
        return b.EndVector()

    def strings(self, items) -> int:
        return self.offsets([self.string(s) for s in items])

    def scalars(self, values, kind: str) -> int:
        arr = np.ascontiguousarray(values, dtype=np.dtype(kind).newbyteorder("<"))
        return self.b.CreateNumpyVector(arr)

    def raw(self, data: np.ndarray) -> int:
        b, src = self.b, data.reshape(-1).view(np.uint8)
        n = src.size
        b.StartVector(1, n, 16)     # aligned, so ORT can read float data in place
        b.head = b.Head() - n
        b.Bytes[b.head:b.head + n] = memoryview(src)
        b.vectorNumElems = n
        return b.EndVector()

    def table(self, nfields: int, fields: list[tuple[str, int, object, object]]) -> int:
        """A table from (kind, field id, value, default) rows; None values are left out."""
        b = self.b
        b.StartObject(nfields)
        for kind, fid, value, default in fields:
            if value is None:
                continue
            if kind == "off":
                b.PrependUOffsetTRelativeSlot(fid, value, 0)
            else:
                getattr(b, f"Prepend{kind}Slot")(fid, value, default)
        return b.EndObject()


def _tensor(w: _Writer, t: onnx.TensorProto, where: str) -> int:
    if t.data_type == onnx.TensorProto.STRING:
        raise OrtFormatError(f"{where} '{t.name}' is a string tensor, which edgetrain does not write")
    try:
        value = numpy_helper.to_array(t)
    except Exception as e:   # external data not loaded, unknown element type
        raise OrtFormatError(f"{where} '{t.name}': cannot read its data ({e})") from None
    data = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
    name = w.string(t.name)
    dims = w.scalars(list(t.dims), "int64")
    raw = w.raw(data)
    return w.table(7, [("off", S.Tensor.name, name, 0), ("off", S.Tensor.dims, dims, 0),
                       ("Int32", S.Tensor.data_type, int(t.data_type), 0), ("off", S.Tensor.raw_data, raw, 0)])


def _type_info(w: _Writer, tp: onnx.TypeProto, where: str) -> int | None:
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        tt = tp.tensor_type
        shape = None
        if tt.HasField("shape"):
            dims = []
            for d in tt.shape.dim:
                if d.HasField("dim_value"):
                    dv = w.table(3, [("Int8", S.DimensionValue.dim_type, S.DimensionValue.VALUE, 0),
                                     ("Int64", S.DimensionValue.dim_value, int(d.dim_value), 0)])
                elif d.HasField("dim_param"):
                    p = w.string(d.dim_param)
                    dv = w.table(3, [("Int8", S.DimensionValue.dim_type, S.DimensionValue.PARAM, 0),
                                     ("off", S.DimensionValue.dim_param, p, 0)])
                else:
                    dv = w.table(3, [])
                dims.append(w.table(2, [("off", S.Dimension.value, dv, 0)]))
            dim_vec = w.offsets(dims)
            shape = w.table(1, [("off", S.Shape.dim, dim_vec, 0)])
        value = w.table(2, [("Int32", S.TensorTypeAndShape.elem_type, int(tt.elem_type), 0),
                            ("off", S.TensorTypeAndShape.shape, shape, 0)])
        tag = S.TypeInfoValue.tensor_type
    elif kind == "sequence_type":
        elem = _type_info(w, tp.sequence_type.elem_type, where)
        value = w.table(1, [("off", S.SequenceType.elem_type, elem, 0)])
        tag = S.TypeInfoValue.sequence_type
    elif kind is None:
        return None
    else:
        raise OrtFormatError(f"{where}: a value of type '{kind}' cannot be written (tensors and sequences only)")
    return w.table(3, [("Uint8", S.TypeInfo.value_type, tag, 0), ("off", S.TypeInfo.value, value, 0)])


def _tensor_type_proto(t: onnx.TensorProto) -> onnx.TypeProto:
    return onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims))


def _attribute(w: _Writer, a: onnx.AttributeProto, where: str) -> int:
    A = S.Attribute
    rows: list = [("off", A.name, w.string(a.name), 0), ("Int32", A.type, int(a.type), 0)]
    kind = a.type
    if kind == S.ATTR_FLOAT:
        rows.append(("Float32", A.f, float(a.f), 0.0))
    elif kind == S.ATTR_INT:
        rows.append(("Int64", A.i, int(a.i), 0))
    elif kind == S.ATTR_STRING:
        rows.append(("off", A.s, w.b.CreateString(a.s), 0))
    elif kind == S.ATTR_TENSOR:
        rows.append(("off", A.t, _tensor(w, a.t, f"{where}, attribute '{a.name}'"), 0))
    elif kind == S.ATTR_FLOATS:
        rows.append(("off", A.floats, w.scalars(list(a.floats), "float32"), 0))
    elif kind == S.ATTR_INTS:
        rows.append(("off", A.ints, w.scalars(list(a.ints), "int64"), 0))
    elif kind == S.ATTR_STRINGS:
        rows.append(("off", A.strings, w.offsets([w.b.CreateString(s) for s in a.strings]), 0))
    elif kind == S.ATTR_TENSORS:
        rows.append(("off", A.tensors, w.offsets([_tensor(w, t, f"{where}, attribute '{a.name}'")
                                                  for t in a.tensors]), 0))
    else:
        raise OrtFormatError(f"{where}: attribute '{a.name}' has type {kind} (graphs and sparse tensors are "
                             "not written)")
    return w.table(13, rows)


def _edges(nodes) -> list[tuple[list, list]]:
    """Per node: (input edges (src node, src output index, dst input index), output edges (dst node, ...))."""
    producer = {}
    for k, n in enumerate(nodes):
        for j, o in enumerate(n.output):
            if o:
                producer[o] = (k, j)
    ins: list[set] = [set() for _ in nodes]
    outs: list[set] = [set() for _ in nodes]
    for k, n in enumerate(nodes):
        for i, name in enumerate(n.input):
            if name in producer:
                src, j = producer[name]
                ins[k].add((src, j, i))
                outs[src].add((k, j, i))
    return [(sorted(a), sorted(b)) for a, b in zip(ins, outs)]


def _edge_vector(w: _Writer, edges) -> int:
    b = w.b
    b.StartVector(S.EDGE_END_SIZE, len(edges), 4)
    for node, src, dst in reversed(edges):
        b.Prep(4, S.EDGE_END_SIZE)
        b.PrependInt32(dst)
        b.PrependInt32(src)
        b.PrependUint32(node)
    return b.EndVector()


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in model.opset_import}


_CONSTANT_VALUES = {       # Constant's value attributes -> (element type, scalar?)
    "value_float": (onnx.TensorProto.FLOAT, True), "value_floats": (onnx.TensorProto.FLOAT, False),
    "value_int": (onnx.TensorProto.INT64, True), "value_ints": (onnx.TensorProto.INT64, False)}


def _constant_tensor(node: onnx.NodeProto, where: str) -> onnx.TensorProto:
    """The initializer a Constant node stands for: ORT turns Constant nodes into initializers when it loads an
    ONNX model and has no Constant kernel, so an ORT-format file holds them as initializers."""
    if len(node.attribute) != 1 or len(node.output) != 1:
        raise OrtFormatError(f"{where}: a Constant node takes exactly one value attribute and one output")
    a = node.attribute[0]
    if a.name == "value":
        t = onnx.TensorProto()
        t.CopyFrom(a.t)
    elif a.name in _CONSTANT_VALUES:
        elem, scalar = _CONSTANT_VALUES[a.name]
        value = onnx.helper.get_attribute_value(a)
        t = onnx.helper.make_tensor("", elem, [] if scalar else [len(value)], [value] if scalar else value)
    else:
        raise OrtFormatError(f"{where}: Constant attribute '{a.name}' is not written (string and sparse values)")
    t.name = node.output[0]
    return t


def _graph(w: _Writer, g: onnx.GraphProto, opsets: dict[str, int], resolver: dict) -> int:
    if not g.node and not g.output:
        raise OrtFormatError(f"graph '{g.name}' is empty")
    where = f"graph '{g.name}'"
    constants = [_constant_tensor(n, f"{where}, node '{n.name}'") for n in g.node
                 if n.op_type == "Constant" and n.domain in ("", "ai.onnx")]
    nodes_in = [n for n in g.node if not (n.op_type == "Constant" and n.domain in ("", "ai.onnx"))]
    initializers = list(g.initializer) + constants
    # node args: every value with a type, initializers typed by their data
    types: dict[str, onnx.TypeProto] = {}
    for t in initializers:
        types[t.name] = _tensor_type_proto(t)
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.type.WhichOneof("value") is not None:
            types[vi.name] = vi.type
    # "" (an omitted optional argument) is a node arg too: ORT looks every name a node lists up among them
    names = list(dict.fromkeys([vi.name for vi in g.input] + [t.name for t in initializers]
                               + [x for n in nodes_in for x in list(n.input) + list(n.output)]
                               + [vi.name for vi in g.output]))
    args = []
    for name in names:
        ti = _type_info(w, types[name], f"{where}, value '{name}'") if name in types else None
        args.append(w.table(3, [("off", S.ValueInfo.name, w.string(name), 0), ("off", S.ValueInfo.type, ti, 0)]))
    inits = [_tensor(w, t, "initializer") for t in initializers]
    nodes = []
    for k, n in enumerate(nodes_in):
        domain = "" if n.domain == "ai.onnx" else n.domain
        if domain not in opsets:
            raise OrtFormatError(f"node '{n.name}' ({n.op_type}) is in domain '{domain}', which the model does "
                                 "not import")
        since, ins, outs, variadic = formal_params(domain, n.op_type, opsets[domain])
        if len(n.output) > len(outs):
            raise OrtFormatError(f"node '{n.name}' ({n.op_type}) has {len(n.output)} outputs; its schema has "
                                 f"{len(outs)}")
        resolver.setdefault(f"{domain}:{n.op_type}:{since}", _resolver_entry(since, ins, outs))
        label = f"{where}, node '{n.name}' ({n.op_type})"
        attrs = w.offsets([_attribute(w, a, label) for a in n.attribute])
        counts = w.scalars(_arg_counts(n, len(ins), variadic), "int32")
        inputs, outputs = w.strings(n.input), w.strings(n.output)
        nodes.append(w.table(13, [
            ("off", S.Node.name, w.string(n.name), 0), ("off", S.Node.doc_string, w.string(n.doc_string), 0),
            ("off", S.Node.domain, w.string(domain), 0), ("Int32", S.Node.since_version, since, 0),
            ("Uint32", S.Node.index, k, 0), ("off", S.Node.op_type, w.string(n.op_type), 0),
            ("off", S.Node.inputs, inputs, 0), ("off", S.Node.outputs, outputs, 0),
            ("off", S.Node.attributes, attrs, 0), ("off", S.Node.input_arg_counts, counts, 0),
            ("off", S.Node.implicit_inputs, w.offsets([]), 0)]))
    edges = []
    for k, (ins_e, outs_e) in enumerate(_edges(nodes_in)):
        iv, ov = _edge_vector(w, ins_e), _edge_vector(w, outs_e)
        edges.append(w.table(3, [("Uint32", S.NodeEdge.node_index, k, 0), ("off", S.NodeEdge.input_edges, iv, 0),
                                 ("off", S.NodeEdge.output_edges, ov, 0)]))
    vectors = {S.Graph.initializers: w.offsets(inits), S.Graph.node_args: w.offsets(args),
               S.Graph.nodes: w.offsets(nodes), S.Graph.node_edges: w.offsets(edges),
               S.Graph.inputs: w.strings([vi.name for vi in g.input]),
               S.Graph.outputs: w.strings([vi.name for vi in g.output])}
    rows = [("off", fid, off, 0) for fid, off in vectors.items()]
    rows.append(("Uint32", S.Graph.max_node_index, len(nodes_in), 0))
    return w.table(9, rows)


def _resolver(w: _Writer, resolver: dict) -> int:
    A = S.ArgTypeAndIndex
    entries = []
    # key-sorted vectors (ORT's builder sorts them; lookups may binary-search them)
    for op_id in sorted(resolver, key=lambda s: s.encode()):
        per_str = []
        for type_str in sorted(resolver[op_id], key=lambda s: s.encode()):
            args = [w.table(2, [("Int8", A.arg_type, kind, 0), ("Uint32", A.index, idx, 0)])
                    for kind, idx in resolver[op_id][type_str]]
            argv = w.offsets(args)
            per_str.append(w.table(2, [("off", S.KernelTypeStrArgsEntry.kernel_type_str, w.string(type_str), 0),
                                       ("off", S.KernelTypeStrArgsEntry.args, argv, 0)]))
        vec = w.offsets(per_str)
        entries.append(w.table(2, [("off", S.OpIdKernelTypeStrArgsEntry.op_id, w.string(op_id), 0),
                                   ("off", S.OpIdKernelTypeStrArgsEntry.kernel_type_str_args, vec, 0)]))
    vec = w.offsets(entries)
    return w.table(1, [("off", S.KernelTypeStrResolver.op_kernel_type_str_args, vec, 0)])


def to_ort_bytes(model) -> bytes:
    """The ORT-format bytes of ``model`` (a ModelProto, a path or bytes of an ONNX model)."""
    proto = load_model(model)
    opsets = _opsets(proto)
    size = proto.ByteSize()
    w = _Writer(flatbuffers.Builder(min(2 * size + 4096, 2 ** 31 - 1)))
    try:
        resolver: dict = {}
        graph = _graph(w, proto.graph, opsets, resolver)
        opset_offs = [w.table(2, [("off", S.OperatorSetId.domain, w.string(d), 0),
                                  ("Int64", S.OperatorSetId.version, v, 0)]) for d, v in opsets.items()]
        meta = [w.table(2, [("off", S.StringStringEntry.key, w.string(p.key), 0),
                            ("off", S.StringStringEntry.value, w.string(p.value), 0)])
                for p in proto.metadata_props]
        M = S.Model
        strings = {M.producer_name: proto.producer_name, M.producer_version: proto.producer_version,
                   M.domain: proto.domain, M.doc_string: proto.doc_string, M.graph_doc_string: proto.graph.doc_string}
        rows = [("off", fid, w.string(s), 0) for fid, s in strings.items() if s]
        rows += [("Int64", M.ir_version, int(proto.ir_version), 0), ("off", M.opset_import, w.offsets(opset_offs), 0),
                 ("Int64", M.model_version, int(proto.model_version), 0), ("off", M.graph, graph, 0),
                 ("off", M.metadata_props, w.offsets(meta) if meta else None, 0)]
        model_off = w.table(10, rows)
        resolver_off = _resolver(w, resolver)
        version = w.string(S.ORT_MODEL_VERSION)
        root = w.table(4, [("off", S.InferenceSession.ort_version, version, 0),
                           ("off", S.InferenceSession.model, model_off, 0),
                           ("off", S.InferenceSession.kernel_type_str_resolver, resolver_off, 0)])
        w.b.Finish(root, file_identifier=S.FILE_IDENTIFIER)
    except flatbuffers.builder.BuilderSizeError:
        raise OrtFormatError("the model is larger than a flatbuffer can hold (2 GiB)") from None
    return bytes(w.b.Output())


def save_ort(model, path) -> None:
    """Write ``model`` in ORT format to ``path`` atomically."""
    atomic.write_atomic(path, to_ort_bytes(model))
