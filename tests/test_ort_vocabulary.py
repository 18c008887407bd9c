"""onnxruntime 1.19's training vocabulary (edgetrain.ops.ort_training, docs/ort_training_vocabulary.md).

Three oracles: each op's forward against onnxruntime-training 1.19.2's own CPU kernel (one batched process),
the gradient rules of the forward ops by finite differences, and end to end: ORT 1.19.2 generates training
artifacts for small models whose training graphs hold these ops and trains on them; edgetrain loads the same
artifacts and must train with the same losses.
"""
from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgetrain
from edgetrain.api import CheckpointState, Module, Optimizer
from edgetrain.ir import Node, TensorType

F = TensorProto.FLOAT
MS = "com.microsoft"
F64 = np.float64


def _single(node, inputs: dict[str, np.ndarray], n_out: int) -> tuple[onnx.ModelProto, dict]:
    """A one-node model and its feeds; int64 inputs (split sizes, k) become initializers: edgetrain needs them
    when planning, as their documented limitation says."""
    feeds = {k: v for k, v in inputs.items() if v.dtype != np.int64}
    graph = helper.make_graph(
        [node], "op", [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                       for k, v in feeds.items()],
        [helper.make_empty_tensor_value_info(o) for o in list(node.output)[:n_out] if o],
        [numpy_helper.from_array(v, k) for k, v in inputs.items() if v.dtype == np.int64])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                              ir_version=8)
    return model, feeds


def _forward_cases():
    rng = np.random.default_rng(3)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)
    x, dy = r(3, 4, 6), r(3, 4, 6)
    cases = {
        "ConcatTraining": (helper.make_node("ConcatTraining", ["a", "b", "c"], ["y", "len"], domain=MS, axis=1),
                           {"a": r(2, 3, 4), "b": r(2, 1, 4), "c": r(2, 5, 4)}, 2),
        "SplitTraining": (helper.make_node("SplitTraining", ["x", "split"], ["y0", "y1", "y2"], domain=MS, axis=2),
                          {"x": x, "split": np.array([1, 3, 2], np.int64)}, 3),
        "DivGrad": (helper.make_node("DivGrad", ["dy", "a", "b"], ["da", "db"], domain=MS),
                    {"dy": dy, "a": r(4, 6), "b": (np.abs(r(3, 1, 6)) + 0.5)}, 2),
        "DivGrad_dB_only": (helper.make_node("DivGrad", ["dy", "a", "b"], ["", "db"], domain=MS),
                            {"dy": dy, "a": x, "b": np.array([1.7], np.float32)}, 2),
        "Trilu_lower_k": (helper.make_node("Trilu", ["x", "k"], ["y"], domain=MS, upper=0),
                          {"x": r(2, 5, 4), "k": np.array(-1, np.int64)}, 1),
        "Trilu_upper": (helper.make_node("Trilu", ["x"], ["y"], domain=MS), {"x": r(5, 4)}, 1),
        "QuickGelu": (helper.make_node("QuickGelu", ["x"], ["y"], domain=MS, alpha=1.702), {"x": 4 * x}, 1),
        "QuickGelu_silu": (helper.make_node("QuickGelu", ["x"], ["y"], domain=MS, alpha=1.0), {"x": 4 * x}, 1),
        "QuickGeluGrad": (helper.make_node("QuickGeluGrad", ["dy", "x"], ["dx"], domain=MS, alpha=1.5),
                          {"dy": dy, "x": 4 * x}, 1),
        "FastGelu": (helper.make_node("FastGelu", ["x"], ["y"], domain=MS), {"x": 3 * x}, 1),
        "FastGelu_bias": (helper.make_node("FastGelu", ["x", "b"], ["y"], domain=MS), {"x": 3 * x, "b": r(6)}, 1),
        "FastGeluGrad": (helper.make_node("FastGeluGrad", ["dy", "x"], ["dx"], domain=MS), {"dy": dy, "x": 3 * x}, 1),
        "BiasFastGeluGrad_dX": (helper.make_node("BiasFastGeluGrad_dX", ["dy", "x", "b"], ["dx"], domain=MS),
                                {"dy": dy, "x": 3 * x, "b": r(6)}, 1),
        "FusedGemm_leaky_relu": (helper.make_node("FusedGemm", ["a", "b", "c"], ["y"], domain=MS, transB=1, alpha=0.7,
                                                  beta=1.5, activation="LeakyRelu", activation_alpha=0.2),
                                 {"a": r(3, 4), "b": r(5, 4), "c": r(5)}, 1),
        "FusedGemm_hard_sigmoid": (helper.make_node("FusedGemm", ["a", "b"], ["y"], domain=MS, activation="HardSigmoid",
                                                    activation_alpha=0.3, activation_beta=0.4),
                                   {"a": r(3, 4), "b": r(4, 5)}, 1),
        "FusedConv_clip": (helper.make_node("FusedConv", ["x", "w"], ["y"], domain=MS, activation="Clip",
                                            activation_params=[-0.5, 0.8]), {"x": r(1, 2, 4, 4), "w": r(3, 2, 3, 3)}, 1),
        "FusedConv_relu": (helper.make_node("FusedConv", ["x", "w", "b"], ["y"], domain=MS, activation="Relu",
                                            pads=[1, 1, 1, 1]), {"x": r(2, 2, 5, 5), "w": r(3, 2, 3, 3), "b": r(3)}, 1),
        "FusedConv_sigmoid": (helper.make_node("FusedConv", ["x", "w"], ["y"], domain=MS, activation="Sigmoid",
                                               strides=[2, 2]), {"x": r(2, 2, 5, 5), "w": r(3, 2, 3, 3)}, 1),
        "FusedConv_hard_sigmoid_z": (helper.make_node("FusedConv", ["x", "w", "b", "z"], ["y"], domain=MS,
                                                      activation="HardSigmoid", activation_params=[0.3, 0.4],
                                                      pads=[1, 1, 1, 1]),
                                     {"x": r(2, 2, 5, 5), "w": r(3, 2, 3, 3), "b": r(3), "z": r(2, 3, 5, 5)}, 1),
        "BiasGelu": (helper.make_node("BiasGelu", ["x", "b"], ["y"], domain=MS), {"x": 3 * x, "b": r(6)}, 1),
        "BiasGeluGrad_dX": (helper.make_node("BiasGeluGrad_dX", ["dy", "x", "b"], ["dx"], domain=MS),
                            {"dy": dy, "x": 3 * x, "b": r(6)}, 1),
        "SimplifiedLayerNormalization": (
            helper.make_node("SimplifiedLayerNormalization", ["x", "s"], ["y", "inv"], axis=-1, epsilon=1e-4),
            {"x": x, "s": r(6)}, 2),
        "SimplifiedLayerNormalization_axis1": (
            helper.make_node("SimplifiedLayerNormalization", ["x", "s"], ["y"], axis=1), {"x": x, "s": r(4, 6)}, 1),
    }
    scores, labels = r(6, 5, 3), rng.integers(0, 5, (6, 3))
    labels[1, 2] = 4
    weights = np.abs(r(5)) + 0.1
    cases["SoftmaxCrossEntropyLossInternal"] = (
        helper.make_node("SoftmaxCrossEntropyLossInternal", ["s", "l", "w", "ig"], ["loss", "lp"], domain=MS),
        {"s": scores, "l": labels, "w": weights, "ig": np.array(4, np.int64)}, 2)
    cases["SoftmaxCrossEntropyLossInternal_none"] = (
        helper.make_node("SoftmaxCrossEntropyLossInternal", ["s", "l"], ["loss", "lp"], domain=MS, reduction="none"),
        {"s": scores, "l": labels}, 2)
    log_prob = scores - np.log(np.exp(scores.astype(F64)).sum(1, keepdims=True)).astype(np.float32)
    cases["SoftmaxCrossEntropyLossInternalGrad"] = (
        helper.make_node("SoftmaxCrossEntropyLossInternalGrad", ["dy", "lp", "l", "w", "ig"], ["dx"], domain=MS,
                         reduction="sum"),
        {"dy": np.array(1.3, np.float32), "lp": log_prob, "l": labels, "w": weights, "ig": np.array(4, np.int64)}, 1)
    # the inv_std_var the forward op wrote, as the gradient op reads it in a training graph
    inv = 1 / np.sqrt((x.astype(F64) ** 2).mean(-1, keepdims=True) + 1e-4)
    cases["SimplifiedLayerNormalizationGrad"] = (
        helper.make_node("SimplifiedLayerNormalizationGrad", ["dy", "x", "s", "inv"], ["dx", "ds"], domain=MS,
                         axis=-1, epsilon=1e-4),
        {"dy": dy, "x": x, "s": r(6), "inv": inv.astype(np.float32)}, 2)
    return cases


FORWARD = _forward_cases()


@pytest.fixture(scope="module")
def ort_outputs(ort):
    models = [_single(node, feeds, n) for node, feeds, n in FORWARD.values()]
    return dict(zip(FORWARD, ort.run_models(models)))


@pytest.mark.ort119
@pytest.mark.parametrize("name", sorted(FORWARD))
def test_forward_matches_onnxruntime_119(ort_outputs, name):
    model, feeds = _single(*FORWARD[name])
    ours = edgetrain.InferenceSession(model.SerializeToString()).run(None, feeds)
    theirs = ort_outputs[name]
    assert len(ours) == len(theirs)
    for k, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == b.shape and a.dtype == b.dtype, f"output {k}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5, err_msg=f"{name} output {k}")


def test_conv_transpose_grad_matches_torch():
    """onnxruntime 1.19.2 has no CPU kernel for ConvTransposeGrad (so it cannot run the artifacts it writes for
    a ConvTranspose on CPU): torch's autograd of conv_transpose2d is the oracle."""
    import torch
    rng = np.random.default_rng(8)
    x, w, b = rng.standard_normal((2, 4, 5, 5)), rng.standard_normal((4, 2, 3, 3)), rng.standard_normal(4)
    attrs = {"strides": [2, 2], "pads": [1, 1, 1, 1], "group": 2}
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    y = torch.nn.functional.conv_transpose2d(tx, tw, tb, stride=2, padding=1, groups=2)
    dy = rng.standard_normal(tuple(y.shape))
    y.backward(torch.tensor(dy))
    feeds = {k: v.astype(np.float32) for k, v in {"dy": dy, "x": x, "w": w}.items()}
    node = helper.make_node("ConvTransposeGrad", ["dy", "x", "w"], ["dx", "dw", "db"], domain=MS, **attrs)
    ours = edgetrain.InferenceSession(_single(node, feeds, 3)[0].SerializeToString()).run(None, feeds)
    for got, want in zip(ours, (tx.grad, tw.grad, tb.grad)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)


# --- gradient rules by finite differences ---------------------------------------------------------------

def _grad_cases():
    rng = np.random.default_rng(5)
    r = lambda *s: rng.standard_normal(s)
    t = lambda *s: TensorType(F64, s)
    return {
        "QuickGelu": ([Node("QuickGelu", ["x"], ["y"], {"alpha": 1.702}, "qg", MS)], {"x": 2 * r(3, 5)}, ["y"],
                      [t(3, 5)]),
        "FastGelu_bias": ([Node("FastGelu", ["x", "b"], ["y"], {}, "fg", MS)], {"x": 2 * r(3, 5), "b": r(5)},
                          ["y"], [t(3, 5)]),
        "BiasGelu": ([Node("BiasGelu", ["x", "b"], ["y"], {}, "bg", MS)], {"x": 2 * r(3, 5), "b": r(5)}, ["y"],
                     [t(3, 5)]),
        "SimplifiedLayerNormalization": (
            [Node("SimplifiedLayerNormalization", ["x", "s"], ["y", "inv"], {"axis": -1, "stash_type": 11}, "sln")],
            {"x": r(2, 3, 4), "s": r(4)}, ["y"], [t(2, 3, 4)]),
        "SimplifiedLayerNormalization_axis1": (
            [Node("SimplifiedLayerNormalization", ["x", "s"], ["y", "inv"], {"axis": 1, "stash_type": 11}, "sln")],
            {"x": r(2, 3, 4), "s": r(3, 4)}, ["y"], [t(2, 3, 4)]),
        "SoftmaxCrossEntropyLossInternal": (
            [Node("SoftmaxCrossEntropyLossInternal", ["s", "labels", "w", "ig"], ["nll", "lp"], {}, "sce", MS)],
            {"s": r(4, 3)}, ["nll"], [t()]),
        "Trilu": ([Node("Trilu", ["x", "k"], ["y"], {"upper": 0}, "tri", MS)], {"x": r(4, 5)}, ["y"], [t(4, 5)]),
        "ConcatTraining_SplitTraining": (
            [Node("ConcatTraining", ["a", "b"], ["c", "len"], {"axis": 1}, "cat", MS),
             Node("Tanh", ["c"], ["t"], {}, "tanh"),
             Node("SplitTraining", ["t", "len"], ["y0", "y1"], {"axis": 1}, "split", MS)],
            {"a": r(2, 3), "b": r(2, 4)}, ["y0", "y1"], [t(2, 3), t(2, 4)]),
    }


GRADS = _grad_cases()


@pytest.mark.parametrize("name", sorted(GRADS))
def test_gradient_rule_by_finite_differences(name):
    from gradcheck import check_gradients
    nodes, params, outputs, types = GRADS[name]
    consts = {"k": np.array(1, np.int64)} if name == "Trilu" else {}
    if name.startswith("SoftmaxCrossEntropyLoss"):
        consts = {"labels": np.array([0, 2, 1, 2]), "ig": np.array(1, np.int64), "w": np.array([0.5, 1.5, 2.0])}
    if name == "Trilu":
        nodes[0].inputs.append("k")
    check_gradients(nodes, params, outputs, types, consts=consts)


# --- end to end: ORT 1.19.2's artifacts, trained by both -----------------------------------------------

def _w(rng, name, *shape):
    return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name)


def _c(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.array(value, dtype), name)


def _mlp(name, body, inits, width=8):
    """x[N, 8] -> MatMul w0 -> body (reads 'h', writes 'z' of width ``width``) -> MatMul wo -> logits[N, 5]."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h"], name="in")] + body + \
        [helper.make_node("MatMul", ["z", "wo"], ["logits"], name="out")]
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", F, ["N", 8])],
                              [helper.make_tensor_value_info("logits", F, ["N", 5])],
                              [_w(rng, "w0", 8, 8), _w(rng, "wo", width, 5)] + [f(rng) for f in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _models():
    n = helper.make_node
    return {
        # ORT's ConcatReplacement: ConcatTraining forward, SplitTraining in the gradient
        "concat": (_mlp("concat", [n("Relu", ["h"], ["r"]), n("Concat", ["h", "r"], ["z0"], axis=1),
                                   n("MatMul", ["z0", "w1"], ["z"])], [lambda g: _w(g, "w1", 16, 8)]),
                   {"ConcatTraining", "SplitTraining"}),
        "split": (_mlp("split", [n("MatMul", ["h", "w1"], ["h2"]), n("Split", ["h2", "sp"], ["s0", "s1"], axis=1),
                                 n("Sigmoid", ["s1"], ["g"]), n("Mul", ["s0", "g"], ["z"])],
                       [lambda g: _w(g, "w1", 8, 16), lambda g: _c("sp", [8, 8], np.int64)]), {"SigmoidGrad"}),
        "div": (_mlp("div", [n("MatMul", ["h", "w1"], ["d"]), n("Sigmoid", ["d"], ["s"]),
                             n("Add", ["s", "one"], ["s1"]), n("Div", ["h", "s1"], ["z"])],
                     [lambda g: _w(g, "w1", 8, 8), lambda g: _c("one", 1.0)]), {"DivGrad"}),
        "triu": (_mlp("triu", [n("Trilu", ["h"], ["z"], upper=1)], []), {"Trilu"}),
        "gelu": (_mlp("gelu", [n("Div", ["h", "sqrt2"], ["d"]), n("Erf", ["d"], ["e"]), n("Add", ["e", "one"], ["e1"]),
                               n("Mul", ["h", "e1"], ["m"]), n("Mul", ["m", "half"], ["z"])],
                      [lambda g: _c("sqrt2", 1.4142135381698608), lambda g: _c("one", 1.0),
                       lambda g: _c("half", 0.5)]), {"Gelu", "GeluGrad"}),
        "silu": (_mlp("silu", [n("Sigmoid", ["h"], ["s"]), n("Mul", ["h", "s"], ["z"])], []),
                 {"QuickGelu", "QuickGeluGrad"}),
        # LSTMTraining forward, LSTMGrad (onnxruntime's 12-input layout) with dY and dY_h flowing in and dH0,
        # dC0 flowing out (ORT 1.19.2's builder needs the initial states present)
        "lstm": (_mlp("lstm", [
            n("Reshape", ["h", "seq_shape"], ["hs"]), n("Transpose", ["hs"], ["xs"], perm=[1, 0, 2]),
            n("MatMul", ["h", "wh"], ["h0f"]), n("Unsqueeze", ["h0f", "ax0"], ["h0"]),
            n("MatMul", ["h", "wc"], ["c0f"]), n("Unsqueeze", ["c0f", "ax0"], ["c0"]),
            n("LSTM", ["xs", "lw", "lr", "lb", "", "h0", "c0"], ["y", "y_h"], hidden_size=5),
            n("Squeeze", ["y_h", "ax0"], ["last"]), n("ReduceMean", ["y"], ["avg"], axes=[0, 1], keepdims=0),
            n("Add", ["last", "avg"], ["z"])],
            [lambda g: _c("seq_shape", [-1, 2, 4], np.int64), lambda g: _c("ax0", [0], np.int64),
             lambda g: _w(g, "lw", 1, 20, 4), lambda g: _w(g, "lr", 1, 20, 5), lambda g: _w(g, "lb", 1, 40),
             lambda g: _w(g, "wh", 8, 5), lambda g: _w(g, "wc", 8, 5)],
            width=5), {"LSTMTraining", "LSTMGrad"}),
        "layernorm": (_mlp("layernorm", [
            n("ReduceMean", ["h"], ["mu"], axes=[-1]), n("Sub", ["h", "mu"], ["d"]), n("Pow", ["d", "two"], ["d2"]),
            n("ReduceMean", ["d2"], ["var"], axes=[-1]), n("Add", ["var", "eps"], ["ve"]), n("Sqrt", ["ve"], ["sd"]),
            n("Div", ["d", "sd"], ["nd"]), n("Mul", ["nd", "g"], ["ng"]), n("Add", ["ng", "b"], ["z"])],
            [lambda g: _c("two", 2.0), lambda g: _c("eps", 1e-5), lambda g: _w(g, "g", 8), lambda g: _w(g, "b", 8)]),
            {"LayerNormalizationGrad"}),
        "rmsnorm": (_mlp("rmsnorm", [
            n("Pow", ["h", "two"], ["h2"]), n("ReduceMean", ["h2"], ["ms"], axes=[-1]), n("Add", ["ms", "eps"], ["mse"]),
            n("Sqrt", ["mse"], ["rms"]), n("Div", ["h", "rms"], ["nh"]), n("Mul", ["nh", "g"], ["z"])],
            [lambda g: _c("two", 2.0), lambda g: _c("eps", 1e-5), lambda g: _w(g, "g", 8)]),
            {"SimplifiedLayerNormalization", "SimplifiedLayerNormalizationGrad"}),
    }


MODELS = _models()

ORT_TRAIN = r'''
import onnx
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_NoTorch"]   # torch is not installed
from onnxruntime.training import artifacts
so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
for name in ARGS["names"]:
    d = ARGS["dir"] + "/" + name
    os.makedirs(d, exist_ok=True)
    model = onnx.load(ARGS["dir"] + "/" + name + ".onnx")
    params = [i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT and i.dims]
    artifacts.generate_artifacts(model, requires_grad=params, loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=d)
    OUT[name + "/ops"] = sorted({n.op_type for n in onnx.load(d + "/training_model.onnx").graph.node})
    state = ort_api.CheckpointState.load_checkpoint(d + "/checkpoint")
    m = ort_api.Module(d + "/training_model.onnx", state, d + "/eval_model.onnx", session_options=so)
    opt = ort_api.Optimizer(d + "/optimizer_model.onnx", m)
    opt.set_learning_rate(0.02)
    m.train()
    losses = []
    for k in range(ARGS["steps"]):
        losses.append(float(m(ARRAYS[f"{k}/x"], ARRAYS[f"{k}/y"])))
        opt.step()
        m.lazy_reset_grad()
    m.eval()
    OUT[name + "/eval"] = float(m(ARRAYS["0/x"], ARRAYS["0/y"]))
    OUT[name + "/losses"] = losses
'''

STEPS = 6


def _batches():
    rng = np.random.default_rng(11)
    return [(rng.standard_normal((n, 8)).astype(np.float32), rng.integers(0, 5, n)) for n in [6, 6, 4, 6, 4, 6]]


@pytest.fixture(scope="module")
def ort_trained(ort, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ort_vocabulary")
    for name, (model, _) in MODELS.items():
        onnx.save(model, folder / f"{name}.onnx")
    batches = _batches()
    out = ort.run(ORT_TRAIN, args={"dir": str(folder), "names": sorted(MODELS), "steps": STEPS},
                  arrays={f"{k}/{n}": a for k, b in enumerate(batches) for n, a in zip("xy", b)})
    return folder, out


@pytest.mark.ort119
@pytest.mark.native
@pytest.mark.parametrize("name", sorted(MODELS))
def test_edgetrain_trains_ort_119_artifacts_with_its_losses(ort_trained, name):
    folder, out = ort_trained
    assert MODELS[name][1] <= set(out[f"{name}/ops"]), out[f"{name}/ops"]   # the vocabulary under test is there
    d = folder / name
    state = CheckpointState.load_checkpoint(d / "checkpoint")
    module = Module(d / "training_model.onnx", state, d / "eval_model.onnx")
    optimizer = Optimizer(d / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(0.02)
    module.train()
    losses = []
    for x, y in _batches()[:STEPS]:
        losses.append(float(module(x, y)))
        optimizer.step()
        module.lazy_reset_grad()
    assert np.ptp(losses) > 0.02, losses          # the comparison is not between two flat lines
    np.testing.assert_allclose(losses, out[f"{name}/losses"], rtol=0, atol=2e-4)
    module.eval()
    x, y = _batches()[0]
    np.testing.assert_allclose(float(module(x, y)), out[f"{name}/eval"], rtol=0, atol=2e-4)


ORT_TRAIN_OURS = r'''
so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
d = ARGS["dir"]
state = ort_api.CheckpointState.load_checkpoint(d + "/checkpoint")
m = ort_api.Module(d + "/training_model.onnx", state, d + "/eval_model.onnx", session_options=so)
opt = ort_api.Optimizer(d + "/optimizer_model.onnx", m)
opt.set_learning_rate(0.02)
m.train()
losses = []
for k in range(ARGS["steps"]):
    losses.append(float(m(ARRAYS[f"{k}/x"], ARRAYS[f"{k}/y"])))
    opt.step()
    m.lazy_reset_grad()
OUT["losses"] = losses
'''


def _vocabulary_model():
    """The forward ops of the vocabulary in one model, for edgetrain's own autodiff to differentiate."""
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w0"], ["h"]), n("QuickGelu", ["h"], ["q"], domain=MS),
             n("ConcatTraining", ["h", "q"], ["c", "len"], domain=MS, axis=1),
             n("SimplifiedLayerNormalization", ["c", "g"], ["sn", "inv"], axis=-1),
             n("FastGelu", ["sn", "b"], ["f"], domain=MS), n("BiasGelu", ["f", "b2"], ["bg"], domain=MS),
             n("Trilu", ["bg"], ["t"], domain=MS), n("MatMul", ["t", "wo"], ["logits"])]
    rng = np.random.default_rng(4)
    graph = helper.make_graph(nodes, "vocabulary", [helper.make_tensor_value_info("x", F, ["N", 8])],
                              [helper.make_tensor_value_info("logits", F, ["N", 5])],
                              [_w(rng, "w0", 8, 8), _w(rng, "g", 16), _w(rng, "b", 16), _w(rng, "b2", 16),
                               _w(rng, "wo", 16, 5)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                             ir_version=8)


@pytest.mark.ort119
@pytest.mark.native
def test_ort_119_trains_edgetrain_artifacts_of_the_vocabulary_with_its_losses(ort, tmp_path):
    """edgetrain's gradient rules emit ORT's ops (QuickGeluGrad, SplitTraining, SimplifiedLayerNormalizationGrad,
    BiasFastGeluGrad_dX, BiasGeluGrad_dX, com.microsoft Trilu): ORT 1.19.2 runs that backward graph with its own
    kernels and must see edgetrain's losses."""
    from edgetrain import artifacts
    artifacts.generate_artifacts(_vocabulary_model(), requires_grad=["w0", "g", "b", "b2", "wo"],
                                 loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
                                 artifact_directory=tmp_path)
    ops = {node.op_type for node in onnx.load(tmp_path / "training_model.onnx").graph.node}
    assert {"QuickGeluGrad", "SplitTraining", "SimplifiedLayerNormalizationGrad", "BiasFastGeluGrad_dX",
            "BiasGeluGrad_dX", "Trilu"} <= ops, ops
    batches = _batches()
    out = ort.run(ORT_TRAIN_OURS, args={"dir": str(tmp_path), "steps": STEPS},
                  arrays={f"{k}/{n}": a for k, b in enumerate(batches) for n, a in zip("xy", b)})
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx")
    optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(0.02)
    module.train()
    losses = []
    for x, y in batches[:STEPS]:
        losses.append(float(module(x, y)))
        optimizer.step()
        module.lazy_reset_grad()
    assert np.ptp(losses) > 0.02, losses
    np.testing.assert_allclose(losses, out["losses"], rtol=0, atol=2e-4)


def test_split_sizes_fed_at_run_time_and_an_unsupported_bias_named():
    from edgetrain.errors import EdgetrainError
    x = np.zeros((2, 5), np.float32)
    node = helper.make_node("SplitTraining", ["x", "sizes"], ["a", "b"], domain=MS, axis=1, name="split_node")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, [2, 5]),
                                            helper.make_tensor_value_info("sizes", TensorProto.INT64, [2])],
                              [helper.make_empty_tensor_value_info("a"), helper.make_empty_tensor_value_info("b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                              ir_version=8)
    # sizes fed at run time: a small input a shape rule needs is planned per value (as per shape)
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    a, b = edgetrain.InferenceSession(model.SerializeToString()).run(None, {"x": x, "sizes": np.array([2, 3])})
    np.testing.assert_array_equal(a, x[:, :2])
    np.testing.assert_array_equal(b, x[:, 2:])
    node = helper.make_node("SoftmaxCrossEntropyLossInternalGrad", ["dy", "lp", "l", "", "", "bias"], ["dx"],
                            domain=MS, name="sce_grad")
    feeds = {"dy": np.ones((), np.float32), "lp": np.zeros((2, 3), np.float32), "bias": np.zeros((2, 3), np.float32)}
    model, feeds = _single(node, {**feeds, "l": np.array([0, 1])}, 1)
    with pytest.raises(EdgetrainError, match=r"'sce_grad'.*bias input"):
        edgetrain.InferenceSession(model.SerializeToString()).run(None, feeds)
