"""ORT-format model (``.ort``, ONNX Runtime's ``ort.fbs`` flatbuffer, file identifier ``ORTM``) -> ONNX ModelProto.

The file is treated as hostile: every offset, length and alignment is checked before it is followed
(``checkpoint.verify``'s ``Buffer``/``Table``), the reader allocates no more than the file holds, each tensor's
declared shape must match its data, and its size is checked against the memory budget (``edgetrain.budget``)
before it is copied. Errors are ``ModelLoadError``s naming the file and the table.

What edgetrain does not run is refused with a clear error: fused nodes, subgraphs (implicit inputs, graph
attributes), sparse initializers. Runtime-optimization records (an optional replay list for ORT's minimal
builds) are ignored: the graph is complete without them. Nodes are put back in topological order (ORT may
write them in its own order after optimizing).
"""
from __future__ import annotations

import heapq
import struct

import numpy as np
import onnx
from onnx import helper

from . import budget
from . import ortformat_schema as S
from .checkpoint.state import CheckpointError
from .checkpoint.verify import Buffer, Table
from .errors import EdgetrainError, MemoryBudgetError, ModelLoadError

# bytes per element of each ONNX element type (STRING has none: its data are strings)
ITEMSIZE = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 14: 8, 15: 16, 16: 2,
            17: 1, 18: 1, 19: 1, 20: 1}
STRING = 8
MAX_NDIM = 64
_READ_ATTRIBUTES = (S.ATTR_FLOAT, S.ATTR_INT, S.ATTR_STRING, S.ATTR_TENSOR, S.ATTR_FLOATS, S.ATTR_INTS, S.ATTR_STRINGS,
                    S.ATTR_TENSORS)
_SCALAR_VECTORS = {"int64": 8, "int32": 4, "float32": 4}


def is_ort_format(data) -> bool:
    """Whether ``data`` (bytes) starts like an ORT-format model."""
    return len(data) >= 8 and bytes(data[4:8]) == S.FILE_IDENTIFIER


class _Reader:
    def __init__(self, data, max_memory: int | None):
        self.buf = Buffer(data)
        self.max_memory = max_memory

    def fail(self, message: str):
        raise CheckpointError(message)   # re-raised as ModelLoadError naming the file (to_model_proto)

    def scalars(self, t: Table, fid: int, kind: str, what: str) -> list:
        v = t.vector(fid, _SCALAR_VECTORS[kind], what)
        if v is None:
            return []
        start, count = v
        self.buf.charge(count * _SCALAR_VECTORS[kind], what)
        return np.frombuffer(self.buf.data, np.dtype(kind).newbyteorder("<"), count, start).tolist()

    def strings(self, t: Table, fid: int, what: str) -> list[str]:
        v = t.vector(fid, 4, what)
        if v is None:
            return []
        start, count = v
        self.buf.charge(4 * count, what)
        return [self.buf.string(self.buf.follow(start + 4 * i, f"{what} #{i}"), f"{what} #{i}")
                for i in range(count)]

    def tensor(self, t: Table, what: str) -> onnx.TensorProto:
        name = t.string(S.Tensor.name, f"name of {what}") or ""
        what = f"{what} '{name}'"
        dims = self.scalars(t, S.Tensor.dims, "int64", f"dims of {what}")
        data_type = t.scalar(S.Tensor.data_type, "i32", 0)
        if len(dims) > MAX_NDIM or any(d < 0 for d in dims):
            self.fail(f"{what} has dims {dims[:8]}: at most {MAX_NDIM} dims, each >= 0")
        proto = onnx.TensorProto(name=name, dims=dims, data_type=data_type)
        if data_type == STRING:
            proto.string_data.extend(s.encode() for s in self.strings(t, S.Tensor.string_data, f"strings of {what}"))
            if len(proto.string_data) != int(np.prod(dims, dtype=object)):
                self.fail(f"{what} has dims {dims} but {len(proto.string_data)} strings")
            return proto
        if data_type not in ITEMSIZE:
            self.fail(f"{what} has element type {data_type}, which edgetrain does not read")
        if t.scalar(S.Tensor.external_data_offset, "i64", -1) != S.Tensor.EXTERNAL_DATA_OFFSET_DEFAULT:
            self.fail(f"{what} keeps its data in an external file, which edgetrain does not read")
        nbytes = budget.checked_shape(dims, ITEMSIZE[data_type], what)
        budget.check(nbytes, self.max_memory, what)
        raw = t.vector(S.Tensor.raw_data, 1, f"data of {what}")
        count = 0 if raw is None else raw[1]
        if count != nbytes:
            self.fail(f"{what} has dims {dims} of element type {data_type} ({nbytes} bytes) but {count} bytes of "
                      "data")
        if count:
            self.buf.charge(count, f"data of {what}")
            proto.raw_data = bytes(self.buf.data[raw[0]:raw[0] + count])
        return proto

    def type_proto(self, t: Table, what: str, depth: int = 0) -> onnx.TypeProto | None:
        if depth > 8:
            self.fail(f"{what}: sequence types nest more than 8 deep")
        kind = t.scalar(S.TypeInfo.value_type, "u8", 0)
        value = t.table(S.TypeInfo.value, f"type of {what}")
        if kind == S.TypeInfoValue.NONE or value is None:
            return None
        tp = onnx.TypeProto()
        if kind == S.TypeInfoValue.tensor_type:
            tp.tensor_type.elem_type = value.scalar(S.TensorTypeAndShape.elem_type, "i32", 0)
            shape = value.table(S.TensorTypeAndShape.shape, f"shape of {what}")
            if shape is not None:
                tp.tensor_type.shape.SetInParent()
                for k, dim in enumerate(shape.tables(S.Shape.dim, f"dim of {what}")):
                    if k >= MAX_NDIM:
                        self.fail(f"{what} has more than {MAX_NDIM} dims")
                    d = tp.tensor_type.shape.dim.add()
                    dv = dim.table(S.Dimension.value, f"dim {k} of {what}")
                    if dv is None:
                        continue
                    dim_type = dv.scalar(S.DimensionValue.dim_type, "u8", 0)
                    if dim_type == S.DimensionValue.VALUE:
                        d.dim_value = dv.scalar(S.DimensionValue.dim_value, "i64", 0)
                    elif dim_type == S.DimensionValue.PARAM:
                        d.dim_param = dv.string(S.DimensionValue.dim_param, f"dim {k} of {what}") or ""
        elif kind == S.TypeInfoValue.sequence_type:
            elem = value.table(S.SequenceType.elem_type, f"element type of {what}")
            inner = None if elem is None else self.type_proto(elem, what, depth + 1)
            if inner is None:
                self.fail(f"{what} is a sequence without an element type")
            tp.sequence_type.elem_type.CopyFrom(inner)
        else:
            self.fail(f"{what} has a value type {kind} (edgetrain reads tensors and sequences only)")
        return tp

    def attribute(self, t: Table, what: str) -> onnx.AttributeProto:
        A = S.Attribute
        name = t.string(A.name, f"name of attribute of {what}") or ""
        where = f"attribute '{name}' of {what}"
        kind = t.scalar(A.type, "i32", 0)
        if kind not in _READ_ATTRIBUTES:
            self.fail(f"{where} has type {kind}: graphs, sparse tensors and undefined attributes are not read")
        a = onnx.AttributeProto(name=name, type=kind)
        if kind == S.ATTR_FLOAT:
            a.f = t.scalar(A.f, "f32", 0.0)
        elif kind == S.ATTR_INT:
            a.i = t.scalar(A.i, "i64", 0)
        elif kind == S.ATTR_STRING:
            a.s = (t.string(A.s, where) or "").encode()
        elif kind == S.ATTR_TENSOR:
            tt = t.table(A.t, where)
            if tt is None:
                self.fail(f"{where} is a tensor attribute without a tensor")
            a.t.CopyFrom(self.tensor(tt, where))
        elif kind == S.ATTR_FLOATS:
            a.floats.extend(self.scalars(t, A.floats, "float32", where))
        elif kind == S.ATTR_INTS:
            a.ints.extend(self.scalars(t, A.ints, "int64", where))
        elif kind == S.ATTR_STRINGS:
            a.strings.extend(s.encode() for s in self.strings(t, A.strings, where))
        elif kind == S.ATTR_TENSORS:
            a.tensors.extend(self.tensor(x, where) for x in t.tables(A.tensors, where))
        return a

    def node(self, t: Table, k: int) -> tuple[int, onnx.NodeProto]:
        N = S.Node
        name = t.string(N.name, f"name of node #{k}") or ""
        what = f"node #{k} '{name}'"
        op_type = t.string(N.op_type, f"op type of {what}")
        if not op_type:
            self.fail(f"{what} has no op type")
        what = f"{what} ({op_type})"
        if t.scalar(N.type, "i32", 0) != 0:
            self.fail(f"{what} is a fused node, which only the session that fused it can run")
        if self.strings(t, N.implicit_inputs, f"implicit inputs of {what}"):
            self.fail(f"{what} has implicit inputs (a subgraph), which edgetrain does not run")
        node = helper.make_node(op_type, self.strings(t, N.inputs, f"inputs of {what}"),
                                self.strings(t, N.outputs, f"outputs of {what}"), name=name,
                                domain=t.string(N.domain, f"domain of {what}") or "")
        node.attribute.extend(self.attribute(a, what) for a in t.tables(N.attributes, f"attribute of {what}"))
        return t.scalar(N.index, "u32", 0), node

    def graph(self, t: Table) -> tuple[onnx.GraphProto, int]:
        G = S.Graph
        sparse = t.vector(G.sparse_initializers, 4, "sparse initializers")
        if sparse is not None and sparse[1]:
            self.fail("the graph has sparse initializers, which edgetrain does not read")
        inits = [self.tensor(x, "initializer") for x in t.tables(G.initializers, "initializer")]
        types: dict[str, onnx.TypeProto | None] = {}
        for i, vi in enumerate(t.tables(G.node_args, "node arg")):
            name = vi.string(S.ValueInfo.name, f"name of node arg #{i}")
            if name is None:
                self.fail(f"node arg #{i} has no name")
            ti = vi.table(S.ValueInfo.type, f"type of node arg '{name}'")
            types[name] = None if ti is None else self.type_proto(ti, f"node arg '{name}'")
        nodes = [self.node(x, k) for k, x in enumerate(t.tables(G.nodes, "node"))]
        inputs = self.strings(t, G.inputs, "graph inputs")
        outputs = self.strings(t, G.outputs, "graph outputs")
        init_names = {x.name for x in inits}

        def value_info(name: str, what: str) -> onnx.ValueInfoProto:
            tp = types.get(name)
            if tp is None and name not in init_names:
                self.fail(f"{what} '{name}' has no type")
            vi = onnx.ValueInfoProto(name=name)
            if tp is not None:
                vi.type.CopyFrom(tp)
            return vi

        g = onnx.GraphProto(name="graph")
        g.initializer.extend(inits)
        g.input.extend(value_info(n, "graph input") for n in inputs)
        g.output.extend(value_info(n, "graph output") for n in outputs)
        g.node.extend(self.topological([n for _, n in sorted(nodes, key=lambda p: p[0])], set(inputs) | init_names))
        declared = set(inputs) | set(outputs) | init_names
        g.value_info.extend(value_info(n, "value") for n, tp in types.items() if tp is not None and n not in declared)
        return g, len(nodes)

    def topological(self, nodes: list[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
        """``nodes`` in an order where each reads only values defined before it (stable: index order first)."""
        waiting = {}
        for k, n in enumerate(nodes):
            waiting[k] = {i for i in n.input if i and i not in available}
        produced_by: dict[str, int] = {}
        for k, n in enumerate(nodes):
            for o in n.output:
                if o:
                    if o in produced_by or o in available:
                        self.fail(f"value '{o}' is assigned twice (node '{n.name}')")
                    produced_by[o] = k
        users: dict[str, list[int]] = {}
        for k, need in waiting.items():
            for i in need:
                if i not in produced_by:
                    self.fail(f"node '{nodes[k].name}' ({nodes[k].op_type}) reads '{i}', which nothing defines")
                users.setdefault(i, []).append(k)
        ready = [k for k, need in waiting.items() if not need]
        heapq.heapify(ready)
        order = []
        while ready:
            k = heapq.heappop(ready)
            order.append(nodes[k])
            for o in nodes[k].output:
                for u in users.get(o, ()):
                    waiting[u].discard(o)
                    if not waiting[u]:
                        heapq.heappush(ready, u)
        if len(order) != len(nodes):
            self.fail("the nodes form a cycle")
        return order

    def model(self) -> onnx.ModelProto:
        buf = self.buf
        if buf.size < 8 or bytes(buf.data[4:8]) != S.FILE_IDENTIFIER:
            ident = bytes(buf.data[4:8]) if buf.size >= 8 else b""
            self.fail(f"not an ORT-format model: file identifier {ident!r}, expected {S.FILE_IDENTIFIER!r}")
        root = buf.root("InferenceSession table")
        version = root.string(S.InferenceSession.ort_version, "ORT format version")
        if version != S.ORT_MODEL_VERSION:
            self.fail(f"ORT format version {version!r} is not supported; edgetrain reads version "
                      f"{S.ORT_MODEL_VERSION!r} (written by ONNX Runtime 1.19 and edgetrain)")
        m = root.table(S.InferenceSession.model, "Model table")
        if m is None:
            self.fail("the InferenceSession table holds no model")
        M = S.Model
        g = m.table(M.graph, "Graph table")
        if g is None:
            self.fail("the Model table holds no graph")
        graph, _ = self.graph(g)
        graph.doc_string = m.string(M.graph_doc_string, "graph doc string") or ""
        opsets = []
        for k, o in enumerate(m.tables(M.opset_import, "opset import")):
            opsets.append(helper.make_opsetid(o.string(S.OperatorSetId.domain, f"domain of opset import #{k}") or "",
                                              o.scalar(S.OperatorSetId.version, "i64", 0)))
        if not opsets:
            self.fail("the Model table imports no opset")
        proto = helper.make_model(graph, opset_imports=opsets)
        proto.ir_version = m.scalar(M.ir_version, "i64", 0)
        proto.model_version = m.scalar(M.model_version, "i64", 0)
        for fid, attr in ((M.producer_name, "producer_name"), (M.producer_version, "producer_version"),
                          (M.domain, "domain"), (M.doc_string, "doc_string")):
            setattr(proto, attr, m.string(fid, attr) or "")
        for k, e in enumerate(m.tables(M.metadata_props, "metadata entry")):
            p = proto.metadata_props.add()
            p.key = e.string(S.StringStringEntry.key, f"key of metadata entry #{k}") or ""
            p.value = e.string(S.StringStringEntry.value, f"value of metadata entry #{k}") or ""
        return proto


def to_model_proto(data, source: str = "<bytes>", max_memory: int | None = None) -> onnx.ModelProto:
    """The ONNX ModelProto an ORT-format model's bytes describe; ``ModelLoadError`` naming ``source`` if the
    bytes are not one, are truncated or corrupt, or declare tensors over the memory budget."""
    limit = budget.resolve(max_memory)
    try:
        return _Reader(data, limit).model()
    except CheckpointError as e:
        raise ModelLoadError(f"ORT-format model '{source}': {e}") from None
    except MemoryBudgetError as e:
        raise MemoryBudgetError(f"ORT-format model '{source}': {e}") from None
    except EdgetrainError as e:     # a shape beyond any memory, ...: the file is wrong
        raise ModelLoadError(f"ORT-format model '{source}': {e}") from None
    except (struct.error, ValueError, IndexError, OverflowError, MemoryError, TypeError) as e:
        # a safety net: the checks above should have caught this first
        raise ModelLoadError(f"ORT-format model '{source}': malformed (a check was missed: "
                             f"{type(e).__name__}: {e})") from e
