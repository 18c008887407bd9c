"""generate_artifacts writes ORT 1.19's files, and ORT 1.19.2 trains edgetrain's artifacts with the losses
and gradients edgetrain computes."""
import numpy as np
import onnx
import pytest
import torch_ref
from conftest import BENCH_MODELS
from trainrun import train_step

from edgetrain import artifacts, checkpoint, onnxblock
from edgetrain.errors import EdgetrainError


def _ort_split(shared, name):
    """ORT's own choice of trainable and frozen parameters for this bench model, from its checkpoint."""
    ckpt = checkpoint.load(shared / "ort_artifacts" / name / "checkpoint")
    return list(ckpt.trainable), list(ckpt.frozen)


def _generate(shared, name, folder, optimizer=artifacts.OptimType.AdamW, **kw):
    trainable, frozen = _ort_split(shared, name)
    artifacts.generate_artifacts(str(shared / "models" / f"{name}.onnx"), requires_grad=trainable,
                                 frozen_params=frozen, loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=optimizer, artifact_directory=folder, **kw)
    return trainable, frozen


@pytest.mark.parametrize("name", BENCH_MODELS)
def test_generate_artifacts_writes_what_ort_writes(shared, tmp_path, name):
    _generate(shared, name, tmp_path, nominal_checkpoint=True, prefix="p_")
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["p_checkpoint", "p_eval_model.onnx", "p_nominal_checkpoint", "p_optimizer_model.onnx",
                     "p_training_model.onnx"]
    ours, theirs = checkpoint.load(tmp_path / "p_checkpoint"), checkpoint.load(
        shared / "ort_artifacts" / name / "checkpoint")
    for mine, ort in ((ours.trainable, theirs.trainable), (ours.frozen, theirs.frozen)):
        assert list(mine) == list(ort)
        for k in mine:
            np.testing.assert_array_equal(mine[k], ort[k])
    assert checkpoint.load(tmp_path / "p_nominal_checkpoint").is_nominal
    for model in ("training_model", "eval_model", "optimizer_model"):
        a = onnx.load(str(tmp_path / f"p_{model}.onnx")).graph
        b = onnx.load(str(shared / "ort_artifacts" / name / f"{model}.onnx")).graph
        assert [i.name for i in a.input] == [i.name for i in b.input], model
        assert len(a.output) == len(b.output)
        if model == "optimizer_model":
            attrs = [{x.name: onnx.helper.get_attribute_value(x) for x in g.node[0].attribute} for g in (a, b)]
            assert (a.node[0].op_type, a.node[0].domain, attrs[0]) == (b.node[0].op_type, b.node[0].domain,
                                                                       attrs[1])


def test_sgd_optimizer_model_matches_ort(shared, tmp_path):
    _generate(shared, "mlp", tmp_path, optimizer=artifacts.OptimType.SGD)
    a = onnx.load(str(tmp_path / "optimizer_model.onnx")).graph
    b = onnx.load(str(shared / "ort_artifacts" / "mlp_sgd" / "optimizer_model.onnx")).graph
    assert [i.name for i in a.input] == [i.name for i in b.input]
    assert [(n.op_type, n.domain, list(n.input)) for n in a.node] == [(n.op_type, n.domain, list(n.input))
                                                                      for n in b.node]


def test_arguments_it_cannot_honour_are_refused(shared, tmp_path):
    model = str(shared / "models" / "digits.onnx")
    for kwargs, message in (({"custom_op_library": "x.so"}, "custom_op"),
                            ({"loss": "mse"}, "unknown loss"), ({"optimizer": "adam"}, "unknown optimizer"),
                            ({"requires_grad": ["fc1.bias"], "frozen_params": ["fc1.bias"]}, "frozen"),
                            ({"requires_grad": ["nope"]}, "nope"), ({"additional_output_names": "out"}, "list"),
                            ({"requires_grad": ["fc1.bias"], "loss_input_names": ["zzz"]}, "zzz")):
        with pytest.raises(EdgetrainError, match=message):
            artifacts.generate_artifacts(model, artifact_directory=tmp_path, **kwargs)
    assert not list(tmp_path.iterdir())     # nothing half-written


def test_additional_outputs_follow_the_loss(shared, tmp_path):
    artifacts.generate_artifacts(str(shared / "models" / "digits.onnx"), requires_grad=["fc2.weight", "fc2.bias"],
                                 loss=artifacts.LossType.CrossEntropyLoss, artifact_directory=tmp_path,
                                 additional_output_names=["output"])
    for model in ("training_model", "eval_model"):
        outs = [o.name for o in onnx.load(str(tmp_path / f"{model}.onnx")).graph.output]
        assert outs[1] == "output"
    assert not (tmp_path / "optimizer_model.onnx").exists()


def test_custom_loss_block_and_optimizer_block(shared, tmp_path):
    class Mse(onnxblock.Block):
        def __init__(self):
            self._mse = onnxblock.loss.MSELoss(reduction="sum")

        def build(self, output):
            return self._mse(output, target_name="wanted")

    optimizer = onnxblock.optim.AdamW(weight_decay=0.01, clip_grad=onnxblock.optim.ClipGradNorm(2.5))
    artifacts.generate_artifacts(str(shared / "models" / "digits.onnx"), requires_grad=["fc1.weight"],
                                 loss=Mse(), optimizer=optimizer, artifact_directory=tmp_path)
    train = onnx.load(str(tmp_path / "training_model.onnx")).graph
    assert "wanted" in [i.name for i in train.input]
    optim = onnx.load(str(tmp_path / "optimizer_model.onnx")).graph
    assert [n.op_type for n in optim.node] == ["InplaceClipGradNorm", "AdamWOptimizer"]


ORT_TRAIN = r'''
d, x, y = ARGS["dir"], ARRAYS["x"], ARRAYS["y"]
so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
state = ort_api.CheckpointState.load_checkpoint(d + "/checkpoint")
m = ort_api.Module(d + "/training_model.onnx", state, d + "/eval_model.onnx", session_options=so)
opt = ort_api.Optimizer(d + "/optimizer_model.onnx", m)
m.train()
OUT["loss"] = np.asarray(m(x, y))
for n, p in state.parameters:
    if p.requires_grad:
        OUT["grad:" + n] = p.grad
        OUT["before:" + n] = np.array(p.data, copy=True)
opt.step()
for n, p in state.parameters:
    if p.requires_grad:
        OUT["after:" + n] = p.data
m.eval()
OUT["eval_loss"] = np.asarray(m(x, y))
'''


@pytest.mark.ort119
@pytest.mark.native
@pytest.mark.parametrize("name", BENCH_MODELS)
def test_ort_trains_edgetrain_artifacts_with_edgetrains_losses(shared, tmp_path, ort, name):
    trainable, frozen = _generate(shared, name, tmp_path)
    model = onnx.load(str(shared / "models" / f"{name}.onnx"))
    rng = np.random.default_rng(0)
    dims = [d.dim_value or 16 for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = rng.integers(0, 100, dims) if name == "transformer" else rng.standard_normal(dims).astype(np.float32)
    classes = model.graph.output[0].type.tensor_type.shape.dim[1].dim_value
    y = rng.integers(0, classes, dims[0])
    out = ort.run(ORT_TRAIN, args={"dir": str(tmp_path)}, arrays={"x": x, "y": y})
    state = checkpoint.load(tmp_path / "checkpoint")
    loss, grads = train_step(onnx.load(str(tmp_path / "training_model.onnx")), {"input": x, "labels": y} | {
        k: np.array(v) for k, v in state.frozen.items()}, {k: np.array(v) for k, v in state.trainable.items()})
    np.testing.assert_allclose(out["loss"], loss, rtol=1e-5, atol=1e-6)
    # both compute in float32; where they differ (BatchNorm's gradient cancels heavily), edgetrain must be
    # no further than ORT from torch's float64 gradients
    _, truth = torch_ref.loss_and_gradients(shared / "models" / f"{name}.onnx", {"input": x, "labels": y} | {
        k: np.array(v) for k, v in state.frozen.items()}, {k: np.array(v) for k, v in state.trainable.items()})
    for p in trainable:
        scale = np.abs(truth[p]).max() + 1e-12
        ours_error = np.abs(grads[p] - truth[p]).max() / scale
        ort_error = np.abs(out[f"grad:{p}"] - truth[p]).max() / scale
        assert ours_error <= max(2e-5, 1.2 * ort_error), f"{p}: edgetrain {ours_error:.1e}, ORT {ort_error:.1e}"
    # ORT ran edgetrain's optimizer model: one Hugging Face AdamW step from zero moments (lr 1e-3, t = 1)
    for p in trainable:
        g = out[f"grad:{p}"].astype(np.float64)
        m, v = 0.1 * g, 0.001 * g * g
        step = 1e-3 * np.sqrt(1 - 0.999) / (1 - 0.9) * m / (np.sqrt(v) + 1e-6)
        np.testing.assert_allclose(out[f"after:{p}"], out[f"before:{p}"] - step, rtol=1e-4, atol=1e-6, err_msg=p)
    assert np.isfinite(out["eval_loss"])
