"""Issue 11, item 6: a compact model (.etm) file is hostile input. Whatever its bytes, loading it either gives a
graph or raises ModelLoadError naming the file; nothing else escapes (RecursionError, OverflowError, TypeError,
MemoryError), and tensors may not share bytes of the data section."""
import copy
import json
import struct

import numpy as np
import pytest

from edgetrain import compact
from edgetrain.errors import ModelLoadError
from edgetrain.ir import Graph, Node, SequenceType, TensorType, Value

F32 = np.dtype("float32")


def _graph() -> Graph:
    """Small, with every part of the format: symbolic dims, a sequence type, declared intermediate types,
    initializers of several dtypes (one empty), and attributes of every kind, a tensor one included."""
    inits = {"w": np.arange(16, dtype=F32).reshape(4, 4), "b": np.ones(4, F32), "perm": np.array([1, 0]),
             "half": np.arange(3, dtype=np.float16), "empty": np.zeros((0, 3), F32), "bytes": np.arange(5, dtype=np.uint8)}
    nodes = [Node("Gemm", ["x", "w", "b"], ["y"], {"alpha": 1.0, "transB": 1}, "gemm"),
             Node("Transpose", ["y"], ["t"], {"perm": (1, 0)}, "transpose"),
             Node("Constant", [], ["c"], {"value": np.full((2, 2), 3, F32)}, "constant"),
             Node("Custom", ["t", "", "c"], ["z", ""], {"names": ("a", "b"), "scales": (0.5, 2.0), "mode": "edge"},
                  "custom", "com.example")]
    return Graph(nodes, [Value("x", TensorType(F32, ("batch", 4))), Value("s", SequenceType(F32))],
                 [Value("z", TensorType(F32, (None, 4))), Value("y", None)], inits, {"": 17, "com.example": 1},
                 {"t": TensorType(F32, (4, "batch"))}, "fuzzed").verify()


DATA = compact.dumps(_graph())


def _split(data: bytes):
    size = struct.unpack_from("<Q", data, 8)[0]
    return json.loads(data[16:16 + size]), data[-(-(16 + size) // 64) * 64:]


HEADER, BODY = _split(DATA)


def _pack(text: bytes, body: bytes = BODY) -> bytes:
    pad = -(-(16 + len(text)) // 64) * 64 - 16 - len(text)
    return compact.MAGIC + struct.pack("<Q", len(text)) + text + b"\0" * pad + body


def _with(header: dict) -> bytes:
    return _pack(json.dumps(header).encode())


def _load_or_refuse(data: bytes):
    """The only two outcomes allowed: a verified graph, or ModelLoadError naming the data."""
    try:
        return compact.loads(data, "fuzz.etm")
    except ModelLoadError as e:
        assert "'fuzz.etm'" in str(e)
        return None


def test_the_fuzzed_model_round_trips():
    g = compact.loads(DATA)
    assert list(g.initializers) == list(_graph().initializers) and g.nodes[3].attrs["scales"] == (0.5, 2.0)


def test_every_truncation_is_a_load_error():
    for n in range(len(DATA)):
        with pytest.raises(ModelLoadError):
            compact.loads(DATA[:n], "fuzz.etm")


def test_random_byte_mutations_of_the_header_load_or_raise_a_load_error():
    rng = np.random.default_rng(11)
    size = struct.unpack_from("<Q", DATA, 8)[0]
    for _ in range(3000):
        data = bytearray(DATA)
        for _ in range(rng.integers(1, 4)):
            at = 16 + int(rng.integers(size))
            data[at] = int(rng.choice([rng.integers(256), ord("["), ord("{"), ord('"'), ord("-"), ord("9")]))
        _load_or_refuse(bytes(data))


# values that break a reader trusting JSON types: wrong types, huge/negative/float numbers, deep nesting
HOSTILE = [None, True, False, -1, -2**63 - 1, 2**63, 2**64, 10**400, 1.5, float("nan"), float("inf"), -0.0, "",
           "x" * 300, "float32", [], [[]], {}, {"int": 1}, {"tensor": "float32", "shape": [2**62, 2**62]},
           [1, 2], ["a", 1], [None], {"dtype": "float32", "shape": [1], "offset": 0}]


def _paths(node, path=()):
    """Every position in a JSON tree: (path, value)."""
    yield path, node
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield from _paths(child, path + (key,))


def _replaced(header, path, value):
    h = copy.deepcopy(header)
    if not path:
        return value
    parent = h
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return h


PATHS = [p for p, _ in _paths(HEADER)]


@pytest.mark.parametrize("value", HOSTILE, ids=lambda v: repr(v)[:30])
def test_every_header_position_replaced_by_a_hostile_value(value):
    assert len(PATHS) > 100
    for path in PATHS:
        _load_or_refuse(_with(_replaced(HEADER, path, value)))


def test_keys_removed_or_renamed_anywhere_in_the_header():
    for path, node in _paths(HEADER):
        if isinstance(node, dict):
            for key in node:
                gone = {k: v for k, v in node.items() if k != key}
                renamed = {(k + "_" if k == key else k): v for k, v in node.items()}
                for changed in (gone, renamed):
                    _load_or_refuse(_with(_replaced(HEADER, path, changed)))


@pytest.mark.parametrize("depth", [100, 5000, 200000])
def test_deeply_nested_json_is_a_load_error(depth):
    nested = b"[" * depth + b"]" * depth
    text = json.dumps(HEADER).encode().replace(b'"fuzzed"', nested)
    assert _load_or_refuse(_pack(text)) is None


def test_numbers_too_long_or_too_large_are_load_errors():
    for literal in (b"1" * 5000, b"1e400", b"-1e400", b"18446744073709551616", b"NaN", b"Infinity"):
        for key in (b'"data_bytes":', b'"offset":', b'"version":'):
            text = json.dumps(HEADER, separators=(",", ":")).encode()
            at = text.index(key) + len(key)
            end = at + next(i for i, ch in enumerate(text[at:]) if ch in b",}")
            assert _load_or_refuse(_pack(text[:at] + literal + text[end:])) is None, (key, literal)


def _init(header, name):
    return next(spec for n, spec in header["initializers"] if n == name)


def test_overlapping_tensors_are_refused():
    h = copy.deepcopy(HEADER)
    _init(h, "b")["offset"] = _init(h, "w")["offset"]          # b would be a view of w's first row
    with pytest.raises(ModelLoadError, match="initializer 'b' overlaps initializer 'w'|'w' overlaps .*'b'"):
        compact.loads(_with(h), "fuzz.etm")


def test_a_tensor_attribute_overlapping_an_initializer_is_refused():
    h = copy.deepcopy(HEADER)
    value = next(a for k, a in h["nodes"][2]["attrs"] if k == "value")
    value["tensor"]["offset"] = _init(h, "w")["offset"] + 64
    with pytest.raises(ModelLoadError, match="overlaps"):
        compact.loads(_with(h), "fuzz.etm")


def test_adjacent_and_empty_tensors_are_not_overlaps():
    h = copy.deepcopy(HEADER)
    _init(h, "empty")["offset"] = _init(h, "w")["offset"]      # no bytes: shares nothing
    g = compact.loads(_with(h))
    assert g.initializers["empty"].shape == (0, 3)


@pytest.mark.parametrize("edit, message", [
    (lambda h: h.update(opsets={"": 1e400}), "opsets"),
    (lambda h: h.update(opsets=[]), "'opsets' of the header"),
    (lambda h: h["nodes"][0].update(name=5), "'name' of node 5"),
    (lambda h: h["nodes"][0].update(inputs=[1, 2]), "inputs of node 'gemm'"),
    (lambda h: h["nodes"][0].update(attrs={"alpha": 1}), "'attrs' of node 'gemm'"),
    (lambda h: h["nodes"][0]["attrs"][1].__setitem__(1, {"int": True}), "attribute 'transB' of node 'gemm'"),
    (lambda h: h["nodes"][0]["attrs"][1].__setitem__(1, {"int": 2**63}), "attribute 'transB'"),
    (lambda h: h["nodes"][0]["attrs"][0].__setitem__(1, {"float": "1.0"}), "attribute 'alpha'"),
    (lambda h: h["nodes"][0]["attrs"][0].__setitem__(1, {"float": 1, "int": 1}), "attribute 'alpha'"),
    (lambda h: h["inputs"][0].__setitem__(1, ["tensor"]), "graph input 'x' has type"),
    (lambda h: _init(h, "w").update(shape=[2**64]), "invalid shape"),
    (lambda h: _init(h, "w").update(shape=[2**40, 4]), "lies outside the data section"),
    (lambda h: _init(h, "w").update(shape=[2**62, 4]), "too large"),
    (lambda h: _init(h, "empty").update(shape=[0, 2**62, 2**62]), "too large"),
    (lambda h: _init(h, "w").update(offset=-64), "invalid data offset -64"),
    (lambda h: _init(h, "w").update(dtype=["float32"]), "'dtype' of initializer 'w' is"),
    (lambda h: _init(h, "w").update(dtype="complex64"), "unknown element type 'complex64'"),
    (lambda h: h.update(name={"a": 1}), "'name' of the header"),
    (lambda h: h.update(version=True), "format version True"),
])
def test_malformed_headers_are_named(edit, message):
    h = copy.deepcopy(HEADER)
    edit(h)
    with pytest.raises(ModelLoadError, match=message):
        compact.loads(_with(h), "fuzz.etm")
