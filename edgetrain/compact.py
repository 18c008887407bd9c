"""Compact model files (``.etm``): an ``edgetrain.ir.Graph`` that a device loads with numpy alone.

edgetrain's counterpart of ONNX Runtime's ``.ort`` format: the minimal build ships training, eval and optimizer
models in this form, so the device needs neither ``onnx`` nor protobuf. ``load_graph`` (what
``edgetrain.api`` uses) tells the two kinds of model file apart by content and imports ``edgetrain.onnx_io``
only for ONNX files.

Layout (all integers little-endian)::

    MAGIC                8 bytes  b"EDGETRN\\x01"
    header length        u64
    header               UTF-8 JSON: graph name, opsets, inputs/outputs with (symbolic) types, nodes with
                         their attributes, declared intermediate types, and for every tensor (initializers and
                         tensor-valued attributes) its dtype, shape and offset in the data section
    zero padding         up to a multiple of 64 bytes
    data section         raw C-order little-endian tensor bytes, each tensor at a multiple of 64 bytes

Why JSON plus raw bytes rather than a flatbuffer: the graph structure is small (kilobytes even for the bench
transformer) and parsed once, so the standard library's ``json`` costs nothing worth saving, needs no schema
compiler or generated code, and stays readable with ``head -c``; what is large -- the tensors -- is stored
raw and aligned, so loading them is one read and a ``np.frombuffer`` view each, as a flatbuffer would give.

Loading checks the magic, the lengths, every tensor's dtype, shape and byte range against the file, and the
graph's single-assignment invariants, and raises ``ModelLoadError`` naming the file and what is wrong.
Saving is atomic (temporary file, fsync, rename, fsync folder), as checkpoints are.
"""
from __future__ import annotations

import json
import os
import struct

import numpy as np

from . import atomic
from .budget import checked_shape
from .errors import EdgetrainError, GraphError, ModelLoadError, ShapeError
from .ir import Graph, Node, SequenceType, TensorType, Value
from .ir.dtypes import ONNX_TO_NUMPY

MAGIC = b"EDGETRN\x01"
SUFFIX = ".etm"
VERSION = 1
ALIGN = 64
_PREFIX = struct.Struct("<8sQ")            # magic, header length
DTYPES = {d.name: d for d in ONNX_TO_NUMPY.values()}   # the element types the IR supports, by numpy name


# -- writing ---------------------------------------------------------------------------------------------------
class _Tensors:
    """Collects tensors for the data section, each at a 64-byte aligned offset."""

    def __init__(self):
        self.arrays: list[tuple[int, np.ndarray]] = []
        self.size = 0

    def add(self, array, what: str) -> dict:
        array = np.asarray(array)
        if array.dtype.name not in DTYPES:
            raise EdgetrainError(f"{what} has element type {array.dtype}, which a compact model cannot store; "
                                 f"supported: {', '.join(DTYPES)}")
        little = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False)
        offset = -(-self.size // ALIGN) * ALIGN
        self.arrays.append((offset, little))
        self.size = offset + little.nbytes
        return {"dtype": array.dtype.name, "shape": list(array.shape), "offset": offset}


def _type_json(t) -> dict | None:
    if t is None:
        return None
    if isinstance(t, SequenceType):
        return {"sequence": t.dtype.name}
    return {"tensor": t.dtype.name, "shape": list(t.shape)}


def _attr_json(value, tensors: _Tensors, what: str) -> dict:
    if isinstance(value, np.ndarray):
        return {"tensor": tensors.add(value, what)}
    if isinstance(value, (bool, int, np.integer)):
        return {"int": int(value)}
    if isinstance(value, (float, np.floating)):
        return {"float": float(value)}
    if isinstance(value, str):
        return {"string": value}
    if isinstance(value, (tuple, list)):
        if all(isinstance(v, str) for v in value):
            return {"strings": list(value)} if value else {"ints": []}
        if all(isinstance(v, (bool, int, np.integer)) for v in value):
            return {"ints": [int(v) for v in value]}
        if all(isinstance(v, (bool, int, float, np.integer, np.floating)) for v in value):
            return {"floats": [float(v) for v in value]}
    raise EdgetrainError(f"{what} is a {type(value).__name__} ({value!r:.60}), which a compact model cannot "
                         "store (ints, floats, strings, lists of one of them, or numpy tensors)")


def dumps(graph: Graph) -> bytes:
    """The graph as compact-model bytes (see the module docstring for the layout).

    Raises
    ------
    EdgetrainError
        An initializer or attribute holds something the format cannot store (names it).
    """
    tensors = _Tensors()
    nodes = []
    for n in graph.nodes:
        attrs = [[k, _attr_json(v, tensors, f"attribute '{k}' of {n}")] for k, v in n.attrs.items()]
        nodes.append({"op": n.op_type, "domain": n.domain, "name": n.name, "inputs": list(n.inputs),
                      "outputs": list(n.outputs), "attrs": attrs})
    header = {
        "format": "edgetrain compact model",
        "version": VERSION,
        "name": graph.name,
        "opsets": dict(graph.opsets),
        "inputs": [[v.name, _type_json(v.type)] for v in graph.inputs],
        "outputs": [[v.name, _type_json(v.type)] for v in graph.outputs],
        "initializers": [[k, tensors.add(a, f"initializer '{k}'")] for k, a in graph.initializers.items()],
        "nodes": nodes,
        "value_types": [[k, _type_json(t)] for k, t in graph.value_types.items()],
        "data_bytes": tensors.size,
    }
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    start = -(-(_PREFIX.size + len(text)) // ALIGN) * ALIGN
    out = bytearray(start + tensors.size)
    _PREFIX.pack_into(out, 0, MAGIC, len(text))
    out[_PREFIX.size: _PREFIX.size + len(text)] = text
    for offset, array in tensors.arrays:
        out[start + offset: start + offset + array.nbytes] = array.reshape(-1).view(np.uint8).data
    return bytes(out)


def save(graph: Graph, path) -> None:
    """Write ``graph`` to ``path`` atomically; a crash leaves the old file or the new one, whole."""
    data = dumps(graph)
    try:
        atomic.write_atomic(path, data)
    except OSError as e:
        raise ModelLoadError(f"cannot write model file '{os.fspath(path)}': {e.strerror or e}; the previous file, "
                             "if any, is unchanged") from e


# -- reading ---------------------------------------------------------------------------------------------------
class _Reader:
    """Decodes one header against its data section; every failure names the file."""

    def __init__(self, where: str, data: memoryview):
        self.where, self.data = where, data

    def error(self, what: str) -> ModelLoadError:
        return ModelLoadError(f"{self.where}: {what}")

    def dtype(self, name, what: str) -> np.dtype:
        if not isinstance(name, str) or name not in DTYPES:
            raise self.error(f"{what} has unknown element type {name!r}; known: {', '.join(DTYPES)}")
        return DTYPES[name]

    def shape(self, dims, what: str, symbolic: bool) -> tuple:
        ok = isinstance(dims, list) and all(
            (isinstance(d, int) and not isinstance(d, bool) and d >= 0) or (symbolic and (d is None or
                                                                                          isinstance(d, str)))
            for d in dims)
        if not ok:
            raise self.error(f"{what} has an invalid shape {dims!r}")
        return tuple(dims)

    def tensor(self, spec: dict, what: str) -> np.ndarray:
        dtype = self.dtype(spec["dtype"], what)
        shape = self.shape(spec["shape"], what, symbolic=False)
        offset = spec["offset"]
        try:     # exact: an int64 product could wrap around to a size that fits the file
            nbytes = checked_shape(shape, dtype.itemsize, what)
        except ShapeError as e:
            raise self.error(str(e)) from None
        if not isinstance(offset, int) or offset < 0 or offset % ALIGN:
            raise self.error(f"{what} has an invalid data offset {offset!r} (must be a multiple of {ALIGN})")
        if offset + nbytes > len(self.data):
            raise self.error(f"{what} ({dtype.name}{list(shape)}, {nbytes} bytes at offset {offset}) lies outside "
                             f"the data section of {len(self.data)} bytes: the file is truncated or corrupt")
        if not nbytes:
            return np.empty(shape, dtype)
        return np.frombuffer(self.data, dtype.newbyteorder("<"), nbytes // dtype.itemsize, offset).reshape(shape)

    def type(self, spec, what: str):
        if spec is None:
            return None
        if "sequence" in spec:
            return SequenceType(self.dtype(spec["sequence"], what))
        return TensorType(self.dtype(spec["tensor"], what), self.shape(spec["shape"], what, symbolic=True))

    def attr(self, spec: dict, what: str):
        (kind, value), = spec.items()
        if kind == "tensor":
            return self.tensor(value, what)
        checks = {"int": lambda v: isinstance(v, int), "float": lambda v: isinstance(v, (int, float)),
                  "string": lambda v: isinstance(v, str)}
        if kind in checks and checks[kind](value):
            return float(value) if kind == "float" else value
        item = {"ints": "int", "floats": "float", "strings": "string"}.get(kind)
        if item and isinstance(value, list) and all(checks[item](v) for v in value):
            return tuple(float(v) for v in value) if kind == "floats" else tuple(value)
        raise self.error(f"{what} has an invalid value {spec!r:.80}")

    def graph(self, h: dict) -> Graph:
        inputs = [Value(n, self.type(t, f"graph input '{n}'")) for n, t in h["inputs"]]
        outputs = [Value(n, self.type(t, f"graph output '{n}'")) for n, t in h["outputs"]]
        inits = {n: self.tensor(t, f"initializer '{n}'") for n, t in h["initializers"]}
        nodes = []
        for spec in h["nodes"]:
            label = f"node '{spec['name']}' ({spec['op']})"
            attrs = {k: self.attr(a, f"attribute '{k}' of {label}") for k, a in spec["attrs"]}
            nodes.append(Node(spec["op"], list(spec["inputs"]), list(spec["outputs"]), attrs, spec["name"],
                              spec["domain"]))
        value_types = {n: self.type(t, f"value '{n}'") for n, t in h["value_types"]}
        opsets = {str(d): int(v) for d, v in h["opsets"].items()}
        return Graph(nodes, inputs, outputs, inits, opsets, value_types, str(h["name"]))


def loads(data: bytes | bytearray | memoryview, name: str = "<bytes>") -> Graph:
    """Decode compact-model bytes; ``name`` labels the data in errors.

    Tensors are writable views into the data; immutable ``bytes`` are copied once for that.

    Raises
    ------
    ModelLoadError
        Wrong magic, truncated, a tensor outside the data or of an unknown dtype, a malformed header, or a
        graph that breaks single assignment.
    """
    where = f"compact model '{name}'"
    view = memoryview(data).cast("B")
    if view.readonly:
        view = memoryview(bytearray(view))
    if len(view) < _PREFIX.size or bytes(view[:8]) != MAGIC:
        what = "is shorter than its 16-byte prefix" if len(view) < _PREFIX.size else \
            f"does not start with {MAGIC!r} (found {bytes(view[:8])!r})"
        raise ModelLoadError(f"{where} is not an edgetrain compact model: it {what}")
    _, size = _PREFIX.unpack_from(view)
    start = -(-(_PREFIX.size + size) // ALIGN) * ALIGN
    if _PREFIX.size + size > len(view):
        raise ModelLoadError(f"{where}: header of {size} bytes runs past the end of the {len(view)}-byte file "
                             "(truncated or corrupt)")
    try:
        header = json.loads(bytes(view[_PREFIX.size: _PREFIX.size + size]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{where}: the header is not valid JSON ({e}); the file is corrupt") from None
    if not isinstance(header, dict) or header.get("format") != "edgetrain compact model":
        raise ModelLoadError(f"{where}: the header does not describe an edgetrain compact model")
    if header.get("version") != VERSION:
        raise ModelLoadError(f"{where} has format version {header.get('version')!r}; this edgetrain reads "
                             f"version {VERSION}: rebuild it with `edgetrain reduce`")
    data_bytes = header.get("data_bytes")
    want = start + data_bytes if isinstance(data_bytes, int) and data_bytes >= 0 else None
    if want != len(view):
        raise ModelLoadError(f"{where} is {len(view)} bytes, its header says {want}: the file is truncated or "
                             "corrupt")
    reader = _Reader(where, view[start:])
    try:
        graph = reader.graph(header)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ModelLoadError(f"{where}: malformed header ({type(e).__name__}: {e})") from None
    try:
        return graph.verify()
    except GraphError as e:
        raise ModelLoadError(f"{where}: {e}") from None


def load(path) -> Graph:
    """Read the compact model at ``path`` (one read into a writable buffer; tensors are views into it)."""
    path = os.fspath(path)
    try:
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            data = bytearray(size)
            got = f.readinto(data) if size else 0
            while got < size:                       # raw reads may be partial
                n = f.readinto(memoryview(data)[got:])
                if not n:
                    break
                got += n
    except OSError as e:
        raise ModelLoadError(f"cannot read model file '{path}': {e.strerror or e}") from None
    if got != size:
        raise ModelLoadError(f"model file '{path}' shrank while being read ({got} of {size} bytes)")
    return loads(data, path)


def is_compact(uri) -> bool:
    """Whether ``uri`` (a path or bytes) holds a compact model, judged by its first 8 bytes."""
    if isinstance(uri, (bytes, bytearray, memoryview)):
        return bytes(memoryview(uri)[:8]) == MAGIC
    try:
        with open(os.fspath(uri), "rb") as f:
            return f.read(8) == MAGIC
    except OSError as e:
        raise ModelLoadError(f"cannot read model file '{os.fspath(uri)}': {e.strerror or e}") from None


def load_graph(uri) -> Graph:
    """A model by content: a compact model (path or bytes) here, anything else through ``edgetrain.onnx_io``,
    which is imported only then, so a process that loads only compact models never imports ``onnx``."""
    if not _is_onnx_object(uri) and is_compact(uri):
        return loads(uri) if isinstance(uri, (bytes, bytearray, memoryview)) else load(uri)
    try:
        from .onnx_io import to_graph
    except ImportError as e:
        where = "these bytes" if isinstance(uri, (bytes, bytearray, memoryview)) else f"'{os.fspath(uri)}'"
        raise ModelLoadError(f"{where} is not an edgetrain compact model ({SUFFIX}), and reading it as ONNX "
                             f"needs the onnx package, which is not installed ({e}); convert the model on a "
                             "host with `edgetrain reduce`") from None
    return to_graph(os.fspath(uri) if isinstance(uri, os.PathLike) else uri)


def _is_onnx_object(uri) -> bool:
    """A ModelProto passed in memory (to_graph takes those too); checked by name so onnx is not imported."""
    return type(uri).__name__ == "ModelProto"
