"""Compact models (.etm): lossless round trips of ORT's and edgetrain's artifacts, identical training through
edgetrain.api, clear errors for damaged files, and training on a process where onnx and protobuf cannot load."""
import json
import struct
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from conftest import BENCH_MODELS
from edgetrain.minimal_build.reduce import compact_artifacts

from edgetrain import checkpoint, compact
from edgetrain.api import CheckpointState, Module, Optimizer
from edgetrain.errors import EdgetrainError, ModelLoadError
from edgetrain.ir import Graph, Node, SequenceType, TensorType, Value
from edgetrain.onnx_io import to_graph

MODELS = ("training_model", "eval_model", "optimizer_model")
ORT_SETS = BENCH_MODELS + ["mlp_sgd"]
SMALL = ("digits", "mlp")      # also on the emulated arm64 stage


def _sets(names):
    return [pytest.param(n, marks=pytest.mark.arm64) if n in SMALL else n for n in names]


def assert_same_graph(a: Graph, b: Graph):
    assert (a.name, a.opsets, a.inputs, a.outputs, a.value_types) == (b.name, b.opsets, b.inputs, b.outputs,
                                                                      b.value_types)
    assert list(a.initializers) == list(b.initializers)
    for k, x in a.initializers.items():
        y = b.initializers[k]
        assert (x.dtype, x.shape) == (y.dtype, y.shape) and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), k
    assert len(a.nodes) == len(b.nodes)
    for m, n in zip(a.nodes, b.nodes):
        assert (m.op_type, m.domain, m.name, m.inputs, m.outputs) == (n.op_type, n.domain, n.name, n.inputs,
                                                                      n.outputs)
        assert list(m.attrs) == list(n.attrs), m.name
        for k, u in m.attrs.items():
            v = n.attrs[k]
            if isinstance(u, np.ndarray):
                assert (u.dtype, u.shape) == (v.dtype, v.shape) and np.array_equal(u, v), (m.name, k)
            else:
                assert type(u) is type(v) and u == v, (m.name, k, u, v)


def _edgetrain_artifacts(shared, name, folder):
    from edgetrain import artifacts
    ckpt = checkpoint.load(shared / "ort_artifacts" / name / "checkpoint")
    artifacts.generate_artifacts(str(shared / "models" / f"{name}.onnx"), requires_grad=list(ckpt.trainable),
                                 frozen_params=list(ckpt.frozen), loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=folder)
    return folder


def _check_round_trip(folder, out):
    written = compact_artifacts(folder, out)
    assert sorted(p.name for p in written) == sorted([f"{m}.etm" for m in MODELS] + ["checkpoint"])
    assert (out / "checkpoint").read_bytes() == (folder / "checkpoint").read_bytes()
    for m in MODELS:
        original = to_graph(str(folder / f"{m}.onnx"))
        assert (out / f"{m}.etm").read_bytes()[:8] == compact.MAGIC
        assert_same_graph(original, compact.load(out / f"{m}.etm"))
        assert_same_graph(original, compact.loads(compact.dumps(original)))


@pytest.mark.parametrize("name", _sets(ORT_SETS))
def test_ort_artifacts_round_trip_losslessly(shared, tmp_path, name):
    _check_round_trip(shared / "ort_artifacts" / name, tmp_path)


@pytest.mark.parametrize("name", _sets(BENCH_MODELS))
def test_edgetrain_artifacts_round_trip_losslessly(shared, tmp_path, name):
    _check_round_trip(_edgetrain_artifacts(shared, name, tmp_path / "onnx"), tmp_path / "etm")


def test_every_dtype_attribute_kind_and_symbolic_dim_survives(tmp_path):
    dtypes = ["float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
              "uint64", "bool"]
    rng = np.random.default_rng(0)
    inits = {f"w_{d}": np.abs(rng.standard_normal((3, 5)) * 50).astype(d) for d in dtypes}
    inits["empty"] = np.zeros((0, 4), np.float32)
    inits["scalar"] = np.array(np.nan, np.float32)
    attrs = {"i": -3, "f": 0.1, "inf": float("inf"), "s": "héllo", "ints": (1, -2, 3), "floats": (0.5, 1e-30),
             "strs": ("a", ""), "none": (), "t": np.arange(6, dtype=np.int64).reshape(2, 3),
             "tb": np.array([True, False])}
    g = Graph([Node("Identity", ["x"], ["y"], attrs, "n0", "com.example")],
              [Value("x", TensorType(np.float32, ("N", None, 3))), Value("seq", SequenceType(np.float64))],
              [Value("y", None)], inits, {"": 17, "com.example": 2},
              {"y": TensorType(np.float32, ("N", None, 3))}, "unicode ✓ name")
    compact.save(g, tmp_path / "m.etm")
    back = compact.load(tmp_path / "m.etm")
    assert_same_graph(g, back)
    assert all(a.flags.writeable for a in back.initializers.values())
    # tensors start on 64-byte boundaries inside the file
    data = (tmp_path / "m.etm").read_bytes()
    size = struct.unpack_from("<Q", data, 8)[0]
    header = json.loads(data[16:16 + size])
    start = -(-(16 + size) // 64) * 64
    assert all((start + t["offset"]) % 64 == 0 for _, t in header["initializers"])


def test_unstorable_attribute_is_named(tmp_path):
    g = Graph([Node("Identity", ["x"], ["y"], {"bad": {"a": 1}}, "n0")], [Value("x", TensorType(np.float32, (1,)))],
              [Value("y", None)])
    with pytest.raises(EdgetrainError, match="attribute 'bad' of node 'n0'"):
        compact.dumps(g)
    assert not list(tmp_path.iterdir())


# -- damaged files ----------------------------------------------------------------------------------------------
def _repack(data: bytes, edit) -> bytes:
    """The same file with its header changed by ``edit(header)`` and the data section kept."""
    size = struct.unpack_from("<Q", data, 8)[0]
    header = json.loads(data[16:16 + size])
    body = data[-(-(16 + size) // 64) * 64:]
    edit(header)
    text = json.dumps(header).encode()
    pad = -(-(16 + len(text)) // 64) * 64 - 16 - len(text)
    return compact.MAGIC + struct.pack("<Q", len(text)) + text + b"\0" * pad + body


@pytest.fixture
def mlp_bytes(shared):
    return compact.dumps(to_graph(str(shared / "models" / "mlp.onnx")))       # a model with initializers


def _first_init(h):
    return h["initializers"][0][1]


def _set(key, value):
    def edit(h):
        h[key] = value
    return edit


@pytest.mark.arm64
@pytest.mark.parametrize("damage, message", [
    (lambda d: b"NOTMODEL" + d[8:], "not an edgetrain compact model.*NOTMODEL"),
    (lambda d: d[:12], "shorter than its 16-byte prefix"),
    (lambda d: d[:40], "header of .* bytes runs past the end"),
    (lambda d: d[:-8], "truncated or corrupt"),
    (lambda d: d[:16] + b"{not json" + d[25:], "not valid JSON"),
    (lambda d: _repack(d, lambda h: _first_init(h).update(offset=1 << 40)), "outside the data section"),
    (lambda d: _repack(d, lambda h: _first_init(h).update(offset=3)), "invalid data offset 3"),
    (lambda d: _repack(d, lambda h: _first_init(h).update(dtype="complex64")), "unknown element type 'complex64'"),
    (lambda d: _repack(d, lambda h: _first_init(h).update(shape=[-1])), r"invalid shape \[-1\]"),
    (lambda d: _repack(d, _set("version", 99)), "format version 99"),
    (lambda d: _repack(d, lambda h: h.pop("nodes")), "malformed header"),
    (lambda d: _repack(d, lambda h: h["nodes"][1].update(inputs=["nowhere"])), "'nowhere' is not defined"),
])
def test_damaged_files_give_errors_naming_the_file_and_the_damage(tmp_path, mlp_bytes, damage, message):
    path = tmp_path / "eval_model.etm"
    path.write_bytes(damage(mlp_bytes))
    with pytest.raises(ModelLoadError, match=message) as e:
        compact.load(path)
    assert str(path) in str(e.value)


def test_module_rejects_a_damaged_compact_model_and_a_missing_file(shared, tmp_path, mlp_bytes):
    state = CheckpointState.load_checkpoint(shared / "ort_artifacts" / "mlp" / "checkpoint")
    (tmp_path / "t.etm").write_bytes(mlp_bytes[:-100])
    with pytest.raises(ModelLoadError, match="truncated"):
        Module(tmp_path / "t.etm", state)
    with pytest.raises(ModelLoadError, match="cannot read model file.*missing.etm"):
        Module(tmp_path / "missing.etm", state)


# -- training from compact files ----------------------------------------------------------------------------------
def _feeds(graph: Graph, name: str):
    rng = np.random.default_rng(0)
    x_type = graph.inputs[0].type
    dims = [d if isinstance(d, int) else 16 for d in x_type.shape]
    x = rng.integers(0, 100, dims) if x_type.dtype == np.int64 else rng.standard_normal(dims).astype(np.float32)
    return x, rng.integers(0, {"transformer": 4}.get(name, 10), dims[0])


def _train(folder, suffix, name, steps=3):
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / f"training_model{suffix}", state, folder / f"eval_model{suffix}")
    opt = Optimizer(folder / f"optimizer_model{suffix}", module)
    x, y = _feeds(module.graph(), name)
    losses = []
    for _ in range(steps):
        losses.append(float(module(x, y)))
        opt.step()
        module.lazy_reset_grad()
    losses.append(float(module.eval()(x, y)))
    return np.array(losses), module


@pytest.mark.parametrize("maker", ["ort", "edgetrain"])
@pytest.mark.parametrize("name", _sets(BENCH_MODELS))
def test_training_from_compact_files_matches_training_from_onnx(shared, tmp_path, name, maker):
    folder = shared / "ort_artifacts" / name if maker == "ort" else _edgetrain_artifacts(shared, name, tmp_path / "a")
    compact_artifacts(folder, tmp_path / "c")
    from_onnx, _ = _train(folder, ".onnx", name)
    from_etm, _ = _train(tmp_path / "c", ".etm", name)
    np.testing.assert_array_equal(from_etm, from_onnx)
    assert from_onnx[2] < from_onnx[0]


def test_export_from_a_compact_module_matches_onnxruntime(shared, tmp_path):
    import onnxruntime
    compact_artifacts(shared / "ort_artifacts" / "mlp", tmp_path)
    _, etm_module = _train(tmp_path, ".etm", "mlp")
    _, onnx_module = _train(shared / "ort_artifacts" / "mlp", ".onnx", "mlp")
    x = np.random.default_rng(1).standard_normal((64, 784)).astype(np.float32)
    outs = []
    for module, path in ((etm_module, tmp_path / "a.onnx"), (onnx_module, tmp_path / "b.onnx")):
        module.export_model_for_inferencing(path, ["output"])
        outs.append(onnxruntime.InferenceSession(str(path)).run(None, {"input": x})[0])
    np.testing.assert_array_equal(outs[0], outs[1])


# A process where onnx and protobuf cannot be imported trains from compact files, exports ONNX (onnx_wire),
# reads ONNX artifacts with edgetrain's own reader and refuses, clearly, a model that needs onnx. Prints the
# losses as JSON for the parent to compare with training from the ONNX files.
NO_ONNX = textwrap.dedent(r'''
    import importlib.abc, json, sys

    class Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "onnx" or name.startswith("google.protobuf") or name == "onnxruntime":
                raise ModuleNotFoundError(f"No module named {name!r} (blocked for this test)", name=name)
            return None

    sys.meta_path.insert(0, Blocked())
    import numpy as np
    from edgetrain.api import CheckpointState, Module, Optimizer
    from edgetrain.errors import EdgetrainError
    art = sys.argv[1]
    state = CheckpointState.load_checkpoint(art + "/checkpoint")
    module = Module(art + "/training_model.etm", state, art + "/eval_model.etm")
    opt = Optimizer(art + "/optimizer_model.etm", module)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 784)).astype(np.float32), rng.integers(0, 10, 64)
    losses = []
    for _ in range(3):
        losses.append(float(module(x, y)))
        opt.step()
        module.lazy_reset_grad()
    losses.append(float(module.eval()(x, y)))
    try:
        module.export_model_for_inferencing(art + "/inference.onnx", ["output"])
        export = "exported"
    except EdgetrainError as e:
        export = str(e)
    try:
        Module(art + "/../training_model.onnx", CheckpointState.load_checkpoint(art + "/checkpoint"))
        onnx_file = "loaded"
    except EdgetrainError as e:
        onnx_file = str(e)
    try:
        import edgetrain
        edgetrain.InferenceSession(art + "/../celu.onnx")
        function_op = "loaded"
    except EdgetrainError as e:
        function_op = str(e)
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("onnx", "google", "onnxruntime"))
    print(json.dumps({"losses": losses, "export": export, "onnx_file": onnx_file, "function_op": function_op,
                      "loaded": loaded}))
''')


@pytest.mark.native
def test_training_from_compact_files_without_onnx_or_protobuf(shared, tmp_path):
    folder = shared / "ort_artifacts" / "mlp"
    compact_artifacts(folder, tmp_path / "etm")
    (tmp_path / "training_model.onnx").write_bytes((folder / "training_model.onnx").read_bytes())
    celu = onnx.helper.make_graph([onnx.helper.make_node("Celu", ["x"], ["y"])], "g",
                                  [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                                  [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    onnx.save(onnx.helper.make_model(celu, opset_imports=[onnx.helper.make_opsetid("", 17)]), tmp_path / "celu.onnx")
    script = tmp_path / "no_onnx.py"
    script.write_text(NO_ONNX)
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "etm")], check=False,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["loaded"] == []
    assert out["export"] == "exported"          # written without onnx or protobuf (edgetrain.onnx_wire)
    onnx.checker.check_model(onnx.load(tmp_path / "etm" / "inference.onnx"), full_check=True)
    # an ONNX training model loads with edgetrain's own reader (edgetrain.onnx_read); a model that needs onnx
    # (a function op, inlined through onnx's body) is refused naming why and the package
    assert out["onnx_file"] == "loaded"
    assert "not an edgetrain compact model" in out["function_op"] and "onnx package" in out["function_op"]
    assert "Celu" in out["function_op"]

    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state, folder / "eval_model.onnx")
    opt = Optimizer(folder / "optimizer_model.onnx", module)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 784)).astype(np.float32), rng.integers(0, 10, 64)
    want = []
    for _ in range(3):
        want.append(float(module(x, y)))
        opt.step()
        module.lazy_reset_grad()
    want.append(float(module.eval()(x, y)))
    assert out["losses"] == want


def test_inference_session_runs_a_compact_model(shared, tmp_path):
    import edgetrain
    from edgetrain import compact
    from edgetrain.onnx_io import to_graph

    model = shared / "models" / "digits.onnx"
    compact.save(to_graph(str(model)), tmp_path / "digits.etm")
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    (want,) = edgetrain.InferenceSession(str(model)).run(None, {"input": x})
    (got,) = edgetrain.InferenceSession(str(tmp_path / "digits.etm")).run(None, {"input": x})
    np.testing.assert_array_equal(got, want)
