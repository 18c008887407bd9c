"""ORT-format (.ort) artifacts: edgetrain writes them without onnxruntime, ONNX Runtime 1.19.2 loads and trains
them like the .onnx ones, edgetrain reads the .ort files ORT writes, and corrupt files are refused cleanly.

Oracles: ORT 1.19.2's training API (losses of the same run on the .onnx artifacts), the kernel type-string
resolver, since-versions and input arg counts ORT itself writes when it saves our models as .ort, and
edgetrain's own run on the .onnx artifacts for the files ORT converted.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from edgetrain import api, artifacts, checkpoint
from edgetrain.errors import ModelLoadError
from edgetrain.onnx_io import load_model
from edgetrain.ortformat import to_model_proto
from edgetrain.ortformat_writer import OrtFormatError, formal_params, to_ort_bytes
from edgetrain.trainer import open_artifacts

STEPS = 3
MODELS = ("training_model", "eval_model", "optimizer_model")

# ORT saves a model as .ort (graph optimizations off), then trains the .onnx and the .ort artifacts alike; it
# reports the losses and, for the .ort file it wrote and ours, the resolver entries and per-node facts.
_ORT_TRAINS_BOTH = '''
sys.path.append(os.path.join(_pkg, "tools", "ort_format_model"))
from ort_flatbuffers_py.fbs import InferenceSession as _IS

def facts(path):
    s = _IS.InferenceSession.GetRootAs(open(path, "rb").read(), 0)
    g = s.Model().Graph()
    nodes = {}
    for i in range(g.NodesLength()):
        n = g.Nodes(i)
        counts = n.InputArgCountsAsNumpy().tolist() if n.InputArgCountsLength() else []
        nodes[n.Name().decode()] = [n.Domain().decode(), n.OpType().decode(), n.SinceVersion(), counts]
    names = {g.Nodes(i).Index(): g.Nodes(i).Name().decode() for i in range(g.NodesLength())}
    edges = {}
    for i in range(g.NodeEdgesLength()):
        e = g.NodeEdges(i)
        ends = lambda get, n: sorted([names[get(k).NodeIndex()], get(k).SrcArgIndex(), get(k).DstArgIndex()]
                                     for k in range(n))
        edges[names[e.NodeIndex()]] = [ends(e.InputEdges, e.InputEdgesLength()),
                                       ends(e.OutputEdges, e.OutputEdgesLength())]
    r = s.KernelTypeStrResolver()
    resolver = {}
    for i in range(r.OpKernelTypeStrArgsLength()):
        e = r.OpKernelTypeStrArgs(i)
        entries = [e.KernelTypeStrArgs(j) for j in range(e.KernelTypeStrArgsLength())]
        resolver[e.OpId().decode()] = [[k.KernelTypeStr().decode(),
                                        [[k.Args(m).ArgType(), k.Args(m).Index()] for m in range(k.ArgsLength())]]
                                       for k in entries]
    return {"nodes": nodes, "edges": edges, "resolver": resolver, "version": s.OrtVersion().decode()}

d = ARGS["dir"]
for name in ARGS["models"]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.optimized_model_filepath = f"{d}/{name}.by_ort.ort"
    so.add_session_config_entry("session.save_model_format", "ORT")
    ort.InferenceSession(f"{d}/{name}.onnx", so, providers=["CPUExecutionProvider"])
    OUT[name] = {"ort": facts(f"{d}/{name}.by_ort.ort"), "ours": facts(f"{d}/{name}.ort")}
for ext in (".onnx", ".ort"):
    state = ort_api.CheckpointState.load_checkpoint(f"{d}/checkpoint")
    module = ort_api.Module(f"{d}/training_model{ext}", state, f"{d}/eval_model{ext}")
    opt = ort_api.Optimizer(f"{d}/optimizer_model{ext}", module)
    losses = []
    for _ in range(ARGS["steps"]):
        module.train()
        losses.append(float(module(ARRAYS["x"], ARRAYS["y"])))
        opt.step()
        module.lazy_reset_grad()
    module.eval()
    losses.append(float(module(ARRAYS["x"], ARRAYS["y"])))
    OUT["losses" + ext] = np.array(losses)
'''


def _batch(model: str):
    rng = np.random.default_rng(0)
    if model == "transformer":      # token ids < 100, 4 classes
        return rng.integers(0, 100, (8, 32)).astype(np.int64), rng.integers(0, 4, (8,)).astype(np.int64)
    shape = {"digits": (6, 64), "cnn": (32, 1, 28, 28), "mobilenet": (16, 3, 32, 32)}[model]
    return rng.standard_normal(shape, dtype=np.float32), rng.integers(0, 10, (shape[0],)).astype(np.int64)


def _generate(shared, model: str, folder, **kwargs):
    ckpt = checkpoint.load(shared / "ort_artifacts" / model / "checkpoint")
    artifacts.generate_artifacts(str(shared / "models" / f"{model}.onnx"), requires_grad=list(ckpt.trainable),
                                 frozen_params=list(ckpt.frozen), loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=folder, **kwargs)


def _edgetrain_losses(folder, ext: str, x, y, train_name="training_model", eval_name="eval_model",
                      optimizer_name="optimizer_model") -> np.ndarray:
    state = api.CheckpointState.load_checkpoint(folder / "checkpoint")
    module = api.Module(folder / f"{train_name}{ext}", state, folder / f"{eval_name}{ext}")
    opt = api.Optimizer(folder / f"{optimizer_name}{ext}", module)
    losses = []
    for _ in range(STEPS):
        module.train()
        losses.append(float(module(x, y)))
        opt.step()
        module.lazy_reset_grad()
    module.eval()
    losses.append(float(module(x, y)))
    return np.array(losses)


@pytest.mark.ort119
@pytest.mark.parametrize("model", ["digits", "cnn", "mobilenet", "transformer"])
def test_ort_1192_loads_and_trains_edgetrain_ort_artifacts(ort, shared, tmp_path, model):
    _generate(shared, model, tmp_path, ort_format=True)
    for name in MODELS:
        assert (tmp_path / f"{name}.ort").read_bytes()[4:8] == b"ORTM"
    x, y = _batch(model)
    out = ort.run(_ORT_TRAINS_BOTH, {"dir": str(tmp_path), "models": list(MODELS), "steps": STEPS},
                  {"x": x, "y": y})
    # ORT trains our .ort files exactly as it trains the .onnx ones
    np.testing.assert_allclose(out["losses.ort"], out["losses.onnx"], rtol=1e-6)
    assert out["losses.ort"][-1] < out["losses.ort"][0]
    for name in MODELS:
        ours, theirs = out[name]["ours"], out[name]["ort"]
        assert ours["version"] == theirs["version"]
        # the same resolver entries, in the same (key-sorted) order, as ORT computes from its op schemas
        assert ours["resolver"] == theirs["resolver"], name
        assert ours["nodes"] == theirs["nodes"], name
        assert ours["edges"] == theirs["edges"], name
    ops = {op_id.split(":")[0] for op_id in out["training_model"]["ours"]["resolver"]}
    assert "com.microsoft" in ops
    if model == "digits":
        np.testing.assert_allclose(_edgetrain_losses(tmp_path, ".ort", x, y), out["losses.ort"], rtol=1e-4)


_ORT_CONVERTS = '''
import pathlib
_tools = types.ModuleType("onnxruntime.tools")     # skip the package __init__ (it probes for torch)
_tools.__path__ = [os.path.join(_pkg, "tools")]
sys.modules["onnxruntime.tools"] = _tools
from onnxruntime.tools.convert_onnx_models_to_ort import OptimizationStyle, convert_onnx_models_to_ort
d = pathlib.Path(ARGS["dir"])
sys.path.append(os.path.join(_pkg, "tools", "ort_format_model"))
from ort_flatbuffers_py.fbs import InferenceSession as _IS
for name in ARGS["models"]:
    convert_onnx_models_to_ort(d / f"{name}.onnx", output_dir=d, optimization_styles=[OptimizationStyle.Fixed])
    g = _IS.InferenceSession.GetRootAs((d / f"{name}.basic.ort").read_bytes(), 0).Model().Graph()
    OUT[name] = sorted([g.Nodes(i).Name().decode(), g.Nodes(i).OpType().decode()] for i in range(g.NodesLength()))
state = ort_api.CheckpointState.load_checkpoint(str(d / "checkpoint"))
module = ort_api.Module(str(d / "training_model.basic.ort"), state, str(d / "eval_model.basic.ort"))
opt = ort_api.Optimizer(str(d / "optimizer_model.basic.ort"), module)
losses = []
for _ in range(ARGS["steps"]):
    module.train()
    losses.append(float(module(ARRAYS["x"], ARRAYS["y"])))
    opt.step()
    module.lazy_reset_grad()
module.eval()
losses.append(float(module(ARRAYS["x"], ARRAYS["y"])))
OUT["losses"] = np.array(losses)
'''


@pytest.mark.ort119
def test_edgetrain_reads_and_trains_ort_files_written_by_ort_1192(ort, shared, tmp_path, monkeypatch):
    # ORT's own digits artifacts, converted by ORT's tool (level "basic": "all" fuses Gemm+Relu into
    # com.microsoft FusedGemm, which edgetrain does not run)
    for f in (shared / "ort_artifacts" / "digits").iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    x, y = _batch("digits")
    monkeypatch.setenv("ORT_CONVERT_ONNX_MODELS_TO_ORT_OPTIMIZATION_LEVEL", "basic")
    out = ort.run(_ORT_CONVERTS, {"dir": str(tmp_path), "models": list(MODELS), "steps": STEPS}, {"x": x, "y": y})
    for name in MODELS:
        read = load_model(tmp_path / f"{name}.basic.ort")
        onnx.checker.check_model(read)
        assert sorted([n.name, n.op_type] for n in read.graph.node) == out[name]
    ours = _edgetrain_losses(tmp_path, ".basic.ort", x, y)
    np.testing.assert_allclose(ours, out["losses"], rtol=1e-4)
    np.testing.assert_array_equal(ours, _edgetrain_losses(tmp_path, ".onnx", x, y))


def test_a_folder_of_ort_artifacts_trains(shared, tmp_path):
    _generate(shared, "digits", tmp_path, ort_format=True)
    x, y = _batch("digits")
    expected = _edgetrain_losses(tmp_path, ".onnx", x, y)
    for name in MODELS:
        (tmp_path / f"{name}.onnx").unlink()
    state, module, optimizer = open_artifacts(tmp_path)
    assert module(x, y) == pytest.approx(expected[0], rel=1e-6)


def test_ort_bytes_round_trip_through_the_reader(shared, tmp_path):
    _generate(shared, "digits", tmp_path)
    for name in MODELS:
        proto = onnx.load(tmp_path / f"{name}.onnx")
        back = to_model_proto(to_ort_bytes(proto), name)
        onnx.checker.check_model(back)
        assert back.graph.node == proto.graph.node
        assert ({(o.domain, o.version) for o in back.opset_import}
                == {(o.domain, o.version) for o in proto.opset_import})
        assert [i.name for i in back.graph.input] == [i.name for i in proto.graph.input]
        assert [i.type for i in back.graph.input] == [i.type for i in proto.graph.input]
        for a, b in zip(back.graph.initializer, proto.graph.initializer):
            np.testing.assert_array_equal(onnx.numpy_helper.to_array(a), onnx.numpy_helper.to_array(b))


def test_the_base_models_opset_is_kept(shared, tmp_path):
    _generate(shared, "digits", tmp_path, ort_format=True)
    base = {o.domain: o.version for o in onnx.load(shared / "models" / "digits.onnx").opset_import}
    read = {o.domain: o.version for o in load_model(tmp_path / "training_model.ort").opset_import}
    assert read[""] == base.get("", base.get("ai.onnx"))


def test_truncated_files_and_other_versions_are_refused_cleanly(shared, tmp_path):
    # (tests/security/test_ort_hostile.py fuzzes a small model byte by byte)
    _generate(shared, "digits", tmp_path)
    data = to_ort_bytes(onnx.load(tmp_path / "training_model.onnx"))
    for cut in np.linspace(1, len(data) - 8, 40).astype(int):
        with pytest.raises(ModelLoadError, match="ORT-format model 'cut'"):
            to_model_proto(data[:cut], "cut")
    wrong_version = data.replace(b"\x01\x00\x00\x006\x00", b"\x01\x00\x00\x009\x00", 1)
    with pytest.raises(ModelLoadError, match="version '9'"):
        to_model_proto(wrong_version, "v9")
    with pytest.raises(ModelLoadError, match="file identifier"):
        to_model_proto(data[:4] + b"ODTC" + data[8:], "ckpt")


def test_ops_without_a_known_schema_are_refused_by_name():
    with pytest.raises(OrtFormatError, match="'Frobnicate' of domain 'com.example'"):
        formal_params("com.example", "Frobnicate", 1)
    assert formal_params("", "Gemm", 17)[:3] == (13, ("T", "T", "T"), ("T",))
    assert formal_params("com.microsoft", "InPlaceAccumulatorV2", 1)[1:3] == (("T", "T_GRAD", "T_BOOL"),
                                                                              ("T_BOOL", "T"))


@pytest.mark.ort119
@pytest.mark.slow
def test_the_schema_table_is_what_ort_1192_writes(ort):
    import importlib.util
    from pathlib import Path

    from edgetrain.ort_schemas import ORT_SCHEMAS
    spec = importlib.util.spec_from_file_location("ort_schemas_tool",
                                                  Path(__file__).resolve().parents[1] / "tools" / "ort_schemas.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.harvest() == ORT_SCHEMAS
