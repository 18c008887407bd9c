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

import itertools
import json
import math
import os
import reprlib
import struct

import numpy as np

from . import atomic, config, onnx_read
from .errors import AttributeValueError, EdgetrainError, GraphError, ModelLoadError
from .ir import Graph, Node, SequenceType, TensorType, Value
from .ir.dtypes import ONNX_TO_NUMPY
from .ops import check_attributes
from .reading import open_regular, read_regular

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
INT64_MAX = 2**63 - 1                      # dims, offsets, opset versions and int attributes are int64 in ONNX
_BRIEF = reprlib.Repr()                    # bounded repr of hostile values in messages (depth, length)
_BRIEF.maxlevel, _BRIEF.maxstring, _BRIEF.maxother = 3, 60, 60


def _is_int(v) -> bool:
    """A JSON integer that fits int64 (``bool`` is not one)."""
    return type(v) is int and -INT64_MAX - 1 <= v <= INT64_MAX


def _is_float(v) -> bool:
    return type(v) is float or _is_int(v)


# attribute kinds: the JSON check of one value, and how a valid value becomes the IR's
_ATTR_KINDS = {"int": (_is_int, int), "float": (_is_float, float), "string": (lambda v: type(v) is str, str)}
_ATTR_LISTS = {"ints": "int", "floats": "float", "strings": "string"}


class _Reader:
    """Decodes one header against its data section; every failure names the file and what is wrong.

    The header is hostile until checked: every field is checked for its JSON type and range before use, and
    the tensors' byte ranges must lie in the data section without overlapping each other."""

    def __init__(self, where: str, data: memoryview):
        self.where, self.data = where, data
        self.ranges: list[tuple[int, int, str]] = []          # (start, end, what) of every non-empty tensor

    def error(self, what: str) -> ModelLoadError:
        return ModelLoadError(f"{self.where}: {what}")

    def field(self, obj: dict, key: str, kind: type, what: str):
        if not isinstance(obj, dict) or key not in obj:
            raise self.error(f"malformed header: {what} has no '{key}'")
        value = obj[key]
        if type(value) is not kind:
            raise self.error(f"malformed header: '{key}' of {what} is {_BRIEF.repr(value)}, not a JSON "
                             f"{_JSON_NAMES[kind]}")
        return value

    def name(self, v, what: str) -> str:
        if type(v) is not str:
            raise self.error(f"malformed header: {what} is {_BRIEF.repr(v)}, not a string")
        return v

    def names(self, v, what: str) -> list[str]:
        if type(v) is not list:
            raise self.error(f"malformed header: {what} is {_BRIEF.repr(v)}, not a list of names")
        return [self.name(n, what) for n in v]

    def pairs(self, v, what: str) -> list[tuple[str, object]]:
        """``[[name, spec], ...]``, the header's form of an ordered mapping."""
        if type(v) is not list or not all(type(p) is list and len(p) == 2 for p in v):
            raise self.error(f"malformed header: {what} is {_BRIEF.repr(v)}, not a list of [name, value] pairs")
        return [(self.name(n, f"a name in {what}"), spec) for n, spec in v]

    def dtype(self, name, what: str) -> np.dtype:
        if type(name) is not str or name not in DTYPES:
            raise self.error(f"{what} has unknown element type {_BRIEF.repr(name)}; known: {', '.join(DTYPES)}")
        return DTYPES[name]

    def shape(self, dims, what: str, symbolic: bool) -> tuple:
        ok = type(dims) is list and all(
            (_is_int(d) and d >= 0) or (symbolic and (d is None or type(d) is str)) for d in dims)
        if not ok:
            raise self.error(f"{what} has an invalid shape {_BRIEF.repr(dims)}")
        return tuple(dims)

    def tensor(self, spec, what: str) -> np.ndarray:
        dtype = self.dtype(self.field(spec, "dtype", str, what), what)
        shape = self.shape(self.field(spec, "shape", list, what), what, symbolic=False)
        offset = spec.get("offset")
        count = math.prod(shape)                         # exact: Python ints do not overflow
        nbytes = count * dtype.itemsize
        if math.prod(d for d in shape if d) * dtype.itemsize > INT64_MAX:    # numpy's limit, even when empty
            raise self.error(f"{what} has a shape {list(shape)} too large for any array")
        if not _is_int(offset) or offset < 0 or offset % ALIGN:
            raise self.error(f"{what} has an invalid data offset {_BRIEF.repr(offset)} (must be a multiple of "
                             f"{ALIGN})")
        if offset + nbytes > len(self.data):
            raise self.error(f"{what} ({dtype.name}{list(shape)}, {nbytes} bytes at offset {offset}) lies outside "
                             f"the data section of {len(self.data)} bytes: the file is truncated or corrupt")
        if not nbytes:
            return np.empty(shape, dtype)
        self.ranges.append((offset, offset + nbytes, what))
        return np.frombuffer(self.data, dtype.newbyteorder("<"), count, offset).reshape(shape)

    def check_no_overlap(self) -> None:
        """Tensors are separate arrays: two sharing bytes would be aliasing views of one buffer."""
        ranges = sorted(self.ranges)
        for (_, end, first), (start, _, second) in itertools.pairwise(ranges):
            if start < end:
                raise self.error(f"{second} overlaps {first} in the data section (bytes {start}..{end}): the "
                                 "file is corrupt or crafted")

    def type(self, spec, what: str):
        if spec is None:
            return None
        if type(spec) is dict and spec.keys() == {"sequence"}:
            return SequenceType(self.dtype(spec["sequence"], what))
        if type(spec) is dict and spec.keys() == {"tensor", "shape"}:
            return TensorType(self.dtype(spec["tensor"], what), self.shape(spec["shape"], what, symbolic=True))
        raise self.error(f"malformed header: {what} has type {_BRIEF.repr(spec)}; expected null, "
                         "{\"tensor\": dtype, \"shape\": [...]} or {\"sequence\": dtype}")

    def attr(self, spec, what: str):
        if type(spec) is not dict or len(spec) != 1:
            raise self.error(f"{what} has an invalid value {_BRIEF.repr(spec)}")
        (kind, value), = spec.items()
        if kind == "tensor":
            return self.tensor(value, what)
        if kind in _ATTR_KINDS:
            valid, convert = _ATTR_KINDS[kind]
            if valid(value):
                return convert(value)
        elif kind in _ATTR_LISTS:
            valid, convert = _ATTR_KINDS[_ATTR_LISTS[kind]]
            if type(value) is list and all(valid(v) for v in value):
                return tuple(convert(v) for v in value)
        raise self.error(f"{what} has an invalid value {_BRIEF.repr(spec)}")

    def opsets(self, v) -> dict[str, int]:
        if type(v) is not dict or not all(_is_int(n) and n >= 1 for n in v.values()):
            raise self.error(f"malformed header: opsets are {_BRIEF.repr(v)}, not {{domain: version >= 1}}")
        return dict(v)

    def node(self, spec) -> Node:
        what = f"node {_BRIEF.repr(spec.get('name')) if type(spec) is dict else _BRIEF.repr(spec)}"
        name = self.field(spec, "name", str, what)
        op = self.field(spec, "op", str, what)
        label = f"node '{name}' ({op})"
        attrs = {k: self.attr(a, f"attribute '{k}' of {label}")
                 for k, a in self.pairs(self.field(spec, "attrs", list, label), f"attributes of {label}")}
        return Node(op, self.names(self.field(spec, "inputs", list, label), f"inputs of {label}"),
                    self.names(self.field(spec, "outputs", list, label), f"outputs of {label}"), attrs, name,
                    self.field(spec, "domain", str, label))

    def graph(self, h: dict) -> Graph:
        header = "the header"
        inputs = [Value(n, self.type(t, f"graph input '{n}'"))
                  for n, t in self.pairs(self.field(h, "inputs", list, header), "graph inputs")]
        outputs = [Value(n, self.type(t, f"graph output '{n}'"))
                   for n, t in self.pairs(self.field(h, "outputs", list, header), "graph outputs")]
        inits = {n: self.tensor(t, f"initializer '{n}'")
                 for n, t in self.pairs(self.field(h, "initializers", list, header), "initializers")}
        nodes = [self.node(spec) for spec in self.field(h, "nodes", list, header)]
        value_types = {n: self.type(t, f"value '{n}'")
                       for n, t in self.pairs(self.field(h, "value_types", list, header), "value types")}
        opsets = self.opsets(self.field(h, "opsets", dict, header))
        self.check_no_overlap()
        return Graph(nodes, inputs, outputs, inits, opsets, value_types, self.field(h, "name", str, header))


_JSON_NAMES = {dict: "object", list: "array", str: "string", int: "integer"}


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
    except (ValueError, RecursionError) as e:    # bad UTF-8 or JSON, numbers of > 4300 digits, deep nesting
        raise ModelLoadError(f"{where}: the header is not valid JSON ({type(e).__name__}: {str(e)[:200]}); the "
                             "file is corrupt") from None
    if type(header) is not dict or header.get("format") != "edgetrain compact model":
        raise ModelLoadError(f"{where}: the header does not describe an edgetrain compact model")
    version = header.get("version")
    if type(version) is not int or version != VERSION:
        raise ModelLoadError(f"{where} has format version {_BRIEF.repr(version)}; this edgetrain reads "
                             f"version {VERSION}: rebuild it with `edgetrain reduce`")
    data_bytes = header.get("data_bytes")
    want = start + data_bytes if _is_int(data_bytes) and data_bytes >= 0 else None
    if want != len(view):
        raise ModelLoadError(f"{where} is {len(view)} bytes, its header says {want}: the file is truncated or "
                             "corrupt")
    try:
        return check_attributes(_Reader(where, view[start:]).graph(header).verify())
    except (GraphError, AttributeValueError) as e:
        raise ModelLoadError(f"{where}: {e}") from None


def load(path) -> Graph:
    """Read the compact model at ``path`` (one read into a writable buffer; tensors are views into it)."""
    path = os.fspath(path)
    try:
        data = read_regular(path)
    except OSError as e:
        raise ModelLoadError(f"cannot read model file '{path}': {e.strerror or e}") from None
    return loads(data, path)


def is_compact(uri) -> bool:
    """Whether ``uri`` (a path or bytes) holds a compact model, judged by its first 8 bytes."""
    if isinstance(uri, (bytes, bytearray, memoryview)):
        return bytes(memoryview(uri)[:8]) == MAGIC
    try:
        with open_regular(uri) as f:
            return f.read(8) == MAGIC
    except OSError as e:
        raise ModelLoadError(f"cannot read model file '{os.fspath(uri)}': {e.strerror or e}") from None


def load_graph(uri) -> Graph:
    """A model by content: a compact model (path or bytes) here; an ONNX model that ``edgetrain.onnx_read``
    decodes (every op in the table, raw tensors: training artifacts) without onnx; anything else through
    ``edgetrain.onnx_io``, which is imported only then, so a process that loads only such models never imports
    ``onnx`` or protobuf."""
    if _is_onnx_object(uri):
        return _onnx_io_graph(uri)
    in_memory = isinstance(uri, (bytes, bytearray, memoryview))
    if in_memory:
        data = uri
    else:
        try:
            data = read_regular(uri)
        except OSError as e:
            raise ModelLoadError(f"cannot read model file '{os.fspath(uri)}': {e.strerror or e}") from None
    if bytes(memoryview(data)[:8]) == MAGIC:
        return loads(data, "<bytes>" if in_memory else os.fspath(uri))
    if not config.flag("EDGETRAIN_NO_WIRE_READER"):
        try:
            return onnx_read.read(data, "<bytes>" if in_memory else os.fspath(uri))
        except onnx_read.NeedsOnnx as e:
            return _onnx_io_graph(uri, f" ({e})")     # onnx_io reads it, or refuses it with its own error
    return _onnx_io_graph(uri)


def _onnx_io_graph(uri, why: str = "") -> Graph:
    try:
        from .onnx_io import to_graph
    except ImportError as e:
        where = "these bytes" if isinstance(uri, (bytes, bytearray, memoryview)) else f"'{os.fspath(uri)}'"
        raise ModelLoadError(f"{where} is not an edgetrain compact model ({SUFFIX}), and reading it as ONNX{why} "
                             f"needs the onnx package, which is not installed ({e}); convert the model on a "
                             "host with `edgetrain reduce`") from None
    return to_graph(os.fspath(uri) if isinstance(uri, os.PathLike) else uri)


def _is_onnx_object(uri) -> bool:
    """A ModelProto passed in memory (to_graph takes those too); checked by name so onnx is not imported."""
    return type(uri).__name__ == "ModelProto"
