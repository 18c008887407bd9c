"""Training and eval graphs follow onnxruntime's conventions, and their accumulators behave as ORT's."""
import numpy as np
import onnx
import pytest

import edgetrain
from edgetrain.autodiff.training import eval_graph, training_graph
from edgetrain.ir import Node, TensorType, Value
from edgetrain.onnx_io import from_graph, to_graph
from edgetrain.plan import make_plan
from edgetrain.runtime import Program
from edgetrain.session import bind_feeds

pytestmark = pytest.mark.arm64   # also on the emulated arm64 stage (.ci/run, README "Platforms")


def with_cross_entropy(path):
    g = to_graph(str(path))
    batch = g.inputs[0].type.shape[0]
    g.nodes.append(Node("SoftmaxCrossEntropyLoss", ["output", "labels"], ["loss"], {"reduction": "mean"}, "sce"))
    g.inputs.append(Value("labels", TensorType(np.int64, (batch,))))
    g.outputs = [Value("loss", TensorType(np.float32, ()))]
    return g


def _names(values):
    return [v.name for v in values]


@pytest.mark.parametrize("name", ["mlp", "digits", "cnn"])
def test_training_model_io_matches_onnxruntime(shared, name):
    g = with_cross_entropy(shared / "models" / f"{name}.onnx")
    params = list(g.initializers)
    ours = training_graph(g, "loss", params)
    theirs = onnx.load(str(shared / "ort_artifacts" / name / "training_model.onnx")).graph
    assert _names(ours.inputs) == [i.name for i in theirs.input]
    assert _names(ours.outputs)[1:] == [o.name for o in theirs.output][1:]   # the loss name is ORT's counter
    assert [str(v.type) for v in ours.inputs] == [
        str(to_graph(str(shared / "ort_artifacts" / name / "training_model.onnx")).inputs[k].type)
        for k in range(len(ours.inputs))]
    evaluation = eval_graph(g, "loss", params)
    theirs_eval = onnx.load(str(shared / "ort_artifacts" / name / "eval_model.onnx")).graph
    assert _names(evaluation.inputs) == [i.name for i in theirs_eval.input]
    # ORT's gradient ops (MaxPoolGrad sits in the ai.onnx domain, as ORT registers it) are unknown to
    # onnx.checker, which rejects ORT's own training models too: check the file round-trips instead
    assert [n.op_type for n in to_graph(from_graph(ours)).nodes] == [n.op_type for n in ours.nodes]


def test_frozen_params_are_inputs_without_gradients(shared):
    g = with_cross_entropy(shared / "models" / "mlp.onnx")
    ours = training_graph(g, "loss", ["fc3.weight", "fc3.bias"], frozen=["fc1.weight"])
    names = _names(ours.inputs)
    assert "fc1.weight" in names and "fc1.weight_grad.accumulation.buffer" not in names
    assert "fc2.weight" not in names and "fc2.weight" in ours.initializers   # neither: stays a constant
    assert _names(ours.outputs)[1:] == ["fc3.weight_grad.accumulation.out", "fc3.bias_grad.accumulation.out"]
    with pytest.raises(edgetrain.EdgetrainError, match="both"):
        training_graph(g, "loss", ["fc1.weight"], frozen=["fc1.weight"])
    with pytest.raises(edgetrain.EdgetrainError, match="nope"):
        training_graph(g, "loss", ["nope"])


def test_accumulators_overwrite_or_add_as_lazy_reset_grad_says(shared):
    g = with_cross_entropy(shared / "models" / "digits.onnx")
    params = list(g.initializers)
    train = training_graph(g, "loss", params)
    rng = np.random.default_rng(0)
    feeds = {"input": rng.standard_normal((8, 64)).astype(np.float32), "labels": rng.integers(0, 10, 8)}
    feeds |= {p: g.initializers[p] for p in params}
    feeds |= {f"{p}_grad.accumulation.buffer": np.full(g.initializers[p].shape, 7.0, np.float32) for p in params}
    plan = make_plan(train, bind_feeds(train.inputs, {**feeds, "lazy_reset_grad": np.ones(1, bool)}, "t"),
                     _names(train.outputs))
    prog = Program(plan)
    buffers = [prog.values[f"{p}_grad.accumulation.buffer"] for p in params]

    def step(reset):
        f = {**feeds, "lazy_reset_grad": np.array([reset])}
        outs = prog.run([f[v.name] for v in train.inputs])
        assert all(bool(flag[0]) for flag in outs[1:])
        return [b.copy() for b in buffers]

    once = step(True)          # overwritten: exactly one step's gradient, whatever the buffer held
    twice = step(True)
    np.testing.assert_array_equal(once[0], twice[0])
    assert not np.allclose(once[0], 7.0)
    feeds |= {f"{p}_grad.accumulation.buffer": b for p, b in zip(params, once)}   # fed in again each run
    added = step(False)        # accumulated: the buffer plus this step's gradient
    # the oracle: torch autograd (float64) on the forward model, one step's gradient and twice it
    import torch_ref
    _, expect = torch_ref.loss_and_gradients(shared / "models" / "digits.onnx",
                                             {"input": feeds["input"], "labels": feeds["labels"]},
                                             {p: g.initializers[p] for p in params})
    for p, a, b in zip(params, once, added):
        np.testing.assert_allclose(a, expect[p], rtol=1e-4, atol=1e-6, err_msg=p)
        np.testing.assert_allclose(b, 2 * expect[p], rtol=1e-4, atol=2e-6, err_msg=p)


def test_eval_models_run_dropout_and_batchnorm_in_inference_mode(shared):
    """Eval graphs of the models with BatchNorm (mobilenet) and Dropout (transformer) match onnxruntime
    running the forward model with BN on running statistics and Dropout off."""
    from oracle import run_onnxruntime
    for name in ("mobilenet", "transformer"):
        g = with_cross_entropy(shared / "models" / f"{name}.onnx")
        params = [p for p in g.initializers if g.initializers[p].dtype == np.float32]
        ev = eval_graph(g, "loss", params)
        bns = [n for n in ev.nodes if n.op_type == "BatchNormalization"]
        assert all(n.attrs["training_mode"] == 0 and len(n.outputs) == 1 for n in bns)
        assert all(len(n.inputs) <= 2 or not n.inputs[2] for n in ev.nodes if n.op_type == "Dropout")
        model = from_graph(ev)
        rng = np.random.default_rng(0)
        feeds = {v.name: (rng.integers(0, 4 if name == "transformer" else 10, v.type.shape)
                          if v.type.dtype == np.int64 else
                          g.initializers.get(v.name, rng.standard_normal(v.type.shape)).astype(np.float32))
                 for v in ev.inputs}
        if name == "transformer":
            feeds["input"] = rng.integers(0, 100, (8, 32))
        ours = edgetrain.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
        theirs = run_onnxruntime(model, feeds)[0]
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
