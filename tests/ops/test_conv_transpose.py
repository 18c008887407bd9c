"""ConvTranspose: forward against onnxruntime (float32) and the ONNX reference evaluator (float64, group 1:
its grouped path and its output_shape handling are broken), gradients against PyTorch's autograd and by
central differences, and a conv autoencoder trained from artifacts against the same model in PyTorch.

Covers 1-D and 2-D, strides 1-3, (asymmetric) pads, output_padding, dilations, groups (1, 2, one output
channel per group: the direct loop), pointwise kernels, auto_pad SAME_UPPER/SAME_LOWER/VALID, output_shape
(shorter or longer than the full result), bias present or absent, batch 1 and more.
"""
import zlib

import numpy as np
import pytest
from onnx import helper
from oracle import assert_matches, model, run_edgetrain, run_onnxruntime, run_reference

import edgetrain
from edgetrain.errors import ShapeError

# (X shape, W shape [C_in, C_out/group, k...], attributes)
CASES = {
    "2d_basic": ((2, 3, 5, 4), (3, 2, 3, 3), {}),
    "2d_stride2_pads_outpad": ((2, 3, 5, 4), (3, 2, 3, 3), dict(strides=[2, 2], pads=[1, 0, 0, 1],
                                                               output_padding=[1, 0])),
    "2d_stride3_dilated": ((1, 2, 4, 3), (2, 3, 2, 3), dict(strides=[3, 2], dilations=[2, 1],
                                                           pads=[1, 1, 2, 0], output_padding=[2, 1])),
    "2d_group2": ((2, 4, 5, 4), (4, 3, 3, 2), dict(group=2, strides=[2, 3], dilations=[2, 1])),
    "2d_group3_multiplier": ((1, 3, 4, 4), (3, 2, 3, 3), dict(group=3, pads=[1, 0, 1, 2])),
    "2d_depthwise_stride2": ((2, 4, 5, 4), (4, 1, 3, 3), dict(group=4, strides=[2, 2], pads=[1, 1, 1, 1],
                                                             output_padding=[1, 1])),
    "2d_depthwise": ((2, 3, 6, 5), (3, 1, 3, 3), dict(group=3)),
    "2d_pointwise": ((2, 6, 4, 3), (6, 5, 1, 1), {}),
    "2d_pointwise_stride2": ((2, 6, 4, 3), (6, 5, 1, 1), dict(strides=[2, 2])),
    "2d_kernel_shape_attr": ((2, 3, 4, 4), (3, 2, 2, 3), dict(kernel_shape=[2, 3], strides=[2, 2])),
    "2d_same_upper": ((2, 3, 4, 5), (3, 2, 3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    "2d_same_lower": ((2, 3, 4, 5), (3, 2, 4, 3), dict(auto_pad="SAME_LOWER", strides=[2, 3])),
    "2d_valid": ((2, 3, 4, 5), (3, 2, 3, 2), dict(auto_pad="VALID", strides=[2, 1], output_padding=[1, 0])),
    "2d_output_shape": ((2, 3, 4, 5), (3, 2, 3, 3), dict(strides=[2, 2], output_shape=[8, 10])),
    "2d_output_shape_longer": ((1, 2, 3, 3), (2, 2, 3, 3), dict(strides=[2, 2], output_shape=[8, 7])),
    "2d_output_shape_same_upper": ((1, 2, 3, 3), (2, 2, 3, 3), dict(strides=[2, 2], output_shape=[6, 5],
                                                                   auto_pad="SAME_UPPER")),
    "1d_basic": ((2, 3, 7), (3, 4, 3), {}),
    "1d_stride2_outpad": ((2, 3, 7), (3, 2, 4), dict(strides=[2], pads=[1, 2], output_padding=[1])),
    "1d_group2_dilated": ((2, 4, 6), (4, 3, 3), dict(group=2, dilations=[2], strides=[3])),
    "1d_depthwise": ((3, 4, 6), (4, 1, 3), dict(group=4, strides=[2], pads=[1, 1])),
    "1d_same_upper": ((2, 3, 7), (3, 2, 3), dict(auto_pad="SAME_UPPER", strides=[3])),
    "1d_same_lower_short_kernel": ((2, 3, 7), (3, 2, 1), dict(auto_pad="SAME_LOWER", strides=[2])),
    "1d_output_shape": ((2, 3, 7), (3, 2, 4), dict(strides=[2], output_shape=[15])),
    "1d_valid": ((1, 3, 7), (3, 2, 3), dict(auto_pad="VALID", strides=[2], output_padding=[1])),
}
# the reference evaluator agrees with the spec here (group 1, no output_shape, kernel spans >= strides)
FLOAT64_CASES = ["2d_basic", "2d_stride2_pads_outpad", "2d_stride3_dilated", "2d_pointwise",
                 "2d_kernel_shape_attr", "2d_same_upper", "2d_same_lower", "2d_valid", "1d_stride2_outpad",
                 "1d_same_upper", "1d_valid"]
# explicit pads (NOTSET, no output_shape): PyTorch's conv_transpose then a crop gives the same Y
TORCH_CASES = [c for c, (_, _, a) in CASES.items() if "auto_pad" not in a and "output_shape" not in a]


def _c_out(w_shape, attrs) -> int:
    return w_shape[1] * attrs.get("group", 1)


def _ct_model(x_shape, w_shape, attrs, dtype, bias, rng, fed=False):
    x = rng.standard_normal(x_shape).astype(dtype)
    consts = {"W": rng.standard_normal(w_shape).astype(dtype)}
    if bias:
        consts["B"] = rng.standard_normal(_c_out(w_shape, attrs)).astype(dtype)
    node = helper.make_node("ConvTranspose", ["X"] + list(consts), ["Y"], **attrs)
    if fed:   # weights as graph inputs: nothing is known when planning
        feeds = {"X": x, **consts}
        return model(node, feeds, ["Y"]), feeds
    return model(node, {"X": x}, ["Y"], consts), {"X": x}


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("case", list(CASES))
def test_conv_transpose_float32(case, bias):
    rng = np.random.default_rng(zlib.crc32(f"{case}/{bias}".encode()))
    m, feeds = _ct_model(*CASES[case], np.float32, bias, rng)
    assert_matches(m, feeds, oracle=run_onnxruntime, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", FLOAT64_CASES)
def test_conv_transpose_float64(case):
    m, feeds = _ct_model(*CASES[case], np.float64, True, np.random.default_rng(1))
    assert_matches(m, feeds, oracle=run_reference, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", ["2d_stride2_pads_outpad", "2d_group2", "2d_depthwise_stride2",
                                  "2d_pointwise", "1d_output_shape"])
def test_conv_transpose_weights_fed(case):
    """W and B are graph inputs: the kernel reads weights from the arena, bias added by the epilogue."""
    m, feeds = _ct_model(*CASES[case], np.float32, True, np.random.default_rng(2), fed=True)
    assert_matches(m, feeds, oracle=run_onnxruntime, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["2d_stride2_pads_outpad", "2d_depthwise", "1d_group2_dilated"])
def test_conv_transpose_folded(case):
    """X, W and B all initializers: planning folds ConvTranspose by calling the launcher with the bias."""
    x_shape, w_shape, attrs = CASES[case]
    rng = np.random.default_rng(3)
    consts = {"X": rng.standard_normal(x_shape), "W": rng.standard_normal(w_shape),
              "B": rng.standard_normal(_c_out(w_shape, attrs))}
    z = rng.standard_normal(1)
    nodes = [helper.make_node("ConvTranspose", ["X", "W", "B"], ["C"], **attrs),
             helper.make_node("Add", ["C", "Z"], ["Y"])]
    m = model(nodes, {"Z": z}, ["Y"], consts)
    steps = edgetrain.InferenceSession(m.SerializeToString()).program({"Z": z}).plan.steps
    assert not any(b.node.op_type == "ConvTranspose" for s in steps for b in s.nodes), "not folded"
    # the reference evaluator's grouped path is broken: a grouped case is checked against float32 ORT
    c32 = {k: v.astype(np.float32) for k, v in consts.items()}
    x32 = {"X": c32.pop("X")}
    ref = run_onnxruntime(model(nodes[0], x32, ["C"], c32), x32)[0] + z
    np.testing.assert_allclose(run_edgetrain(m, {"Z": z})[0], ref, rtol=1e-4, atol=1e-4)


def test_conv_transpose_reruns_overwrite():
    """A second run with other inputs gives the second answer: output and workspace are fully rewritten."""
    rng = np.random.default_rng(4)
    for case in ["2d_stride2_pads_outpad", "2d_depthwise_stride2", "2d_output_shape_longer"]:
        m, feeds = _ct_model(*CASES[case], np.float32, True, rng, fed=True)
        sess = edgetrain.InferenceSession(m.SerializeToString())
        for _ in range(2):
            feeds = {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in feeds.items()}
            np.testing.assert_allclose(sess.run(None, feeds)[0], run_onnxruntime(m, feeds)[0], rtol=1e-4,
                                       atol=1e-5)


@pytest.mark.parametrize("x_shape, w_shape, attrs, match", [
    ((1, 4, 5, 5), (3, 2, 3, 3), {}, "channels first"),
    ((1, 4, 5, 5), (4, 2, 3, 3), dict(group=3), "group 3 must divide"),
    ((1, 4, 5, 5), (4, 2, 3, 3), dict(kernel_shape=[2, 2]), "kernel_shape"),
    ((1, 4, 5, 5), (4, 2, 3, 3), dict(pads=[1, 1]), "pads"),
    ((1, 4, 5, 5), (4, 2, 3, 3), dict(strides=[0, 1]), "strides"),
    ((1, 4, 5, 5), (4, 2, 3, 3), dict(strides=[2, 2], output_padding=[2, 0]), "output_padding"),
    ((1, 4, 5, 5), (4, 2, 3, 3), dict(dilations=[2, 2], output_padding=[1, 0]), "output_padding"),
    ((1, 4, 5, 5), (4, 2, 3, 3), dict(output_shape=[7]), "output_shape"),
    ((1, 4, 5, 5), (4, 2, 3, 3), dict(output_shape=[1, 2, 7, 7]), "output_shape"),
    ((1, 4, 5, 5), (4, 2, 3, 3), dict(strides=[2, 2], output_shape=[13, 11]), "output_shape"),
    ((1, 4, 2, 2), (4, 2, 2, 2), dict(pads=[2, 2, 1, 1]), "empty"),
    ((1, 2, 3, 3, 3), (2, 2, 1, 1, 1), {}, "3-D spatial"),
])
def test_conv_transpose_errors_name_the_node(x_shape, w_shape, attrs, match):
    x = np.zeros(x_shape, np.float32)
    w = np.zeros(w_shape, np.float32)
    node = helper.make_node("ConvTranspose", ["X", "W"], ["Y"], name="up_3", **attrs)
    m = model(node, {"X": x}, ["Y"], {"W": w})
    with pytest.raises(ShapeError, match=match) as err:
        edgetrain.InferenceSession(m.SerializeToString()).run(None, {"X": x})
    assert "up_3" in str(err.value)


def test_conv_transpose_bias_of_the_wrong_size_is_refused():
    x, w, b = np.zeros((1, 4, 5, 5), np.float32), np.zeros((4, 3, 3, 3), np.float32), np.zeros(4, np.float32)
    node = helper.make_node("ConvTranspose", ["X", "W", "B"], ["Y"], name="up_4", group=2)   # C_out is 6
    m = model(node, {"X": x}, ["Y"], {"W": w, "B": b})
    with pytest.raises(ShapeError, match=r"B must have shape \(6,\)"):
        edgetrain.InferenceSession(m.SerializeToString()).run(None, {"X": x})


# --- gradients --------------------------------------------------------------------------------------------

def _out_type(x_shape, w_shape, attrs):
    """Y's type, from onnxruntime (an oracle for the shape rule too)."""
    from edgetrain.ir import TensorType
    m, feeds = _ct_model(x_shape, w_shape, attrs, np.float32, False, np.random.default_rng(0))
    return TensorType(np.float64, run_onnxruntime(m, feeds)[0].shape)


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("case", list(CASES))
def test_conv_transpose_gradient_rule(case, bias):
    """d/dX, d/dW (and d/dB) of ConvTranspose by central differences, float64."""
    from gradcheck import check_gradients

    from edgetrain.ir import Node
    x_shape, w_shape, attrs = CASES[case]
    rng = np.random.default_rng(zlib.crc32(f"grad/{case}/{bias}".encode()))
    params = {"x": rng.standard_normal(x_shape), "w": rng.standard_normal(w_shape)}
    if bias:
        params["b"] = rng.standard_normal(_c_out(w_shape, attrs))
    check_gradients([Node("ConvTranspose", list(params), ["y"], attrs, "up")], params, ["y"],
                    [_out_type(x_shape, w_shape, attrs)], samples=6)


@pytest.mark.parametrize("wrt", [("w",), ("x",), ("b",), ("x", "b")], ids="+".join)
@pytest.mark.parametrize("case", ["2d_stride2_pads_outpad", "2d_group2", "2d_depthwise_stride2"])
def test_conv_transpose_gradient_rule_some_inputs(case, wrt):
    """Only some of X, W, B are differentiated: only the nodes for those are emitted."""
    from gradcheck import check_gradients

    from edgetrain.ir import Node
    x_shape, w_shape, attrs = CASES[case]
    rng = np.random.default_rng(zlib.crc32(f"some/{case}".encode()))
    values = {"x": rng.standard_normal(x_shape), "w": rng.standard_normal(w_shape),
              "b": rng.standard_normal(_c_out(w_shape, attrs))}
    params = {k: v for k, v in values.items() if k in wrt}
    consts = {k: v for k, v in values.items() if k not in wrt}
    check_gradients([Node("ConvTranspose", ["x", "w", "b"], ["y"], attrs, "up")], params, ["y"],
                    [_out_type(x_shape, w_shape, attrs)], consts=consts)


def _torch_conv_transpose(x, w, b, attrs):
    """PyTorch's ConvTranspose with ONNX's explicit (possibly asymmetric) pads and output_padding: the full
    result cropped by the begin pads and by the end pads less output_padding (zeros appended where that is
    negative), then the bias added everywhere."""
    import torch.nn.functional as F
    nd = x.dim() - 2
    fn = F.conv_transpose2d if nd == 2 else F.conv_transpose1d
    full = fn(x, w, None, stride=attrs.get("strides", [1] * nd), dilation=attrs.get("dilations", [1] * nd),
              groups=attrs.get("group", 1))
    pads = attrs.get("pads", [0] * 2 * nd)
    extra = attrs.get("output_padding", [0] * nd)
    crop = [p for a in reversed(range(nd)) for p in (-pads[a], extra[a] - pads[nd + a])]
    return F.pad(full, crop) + b.reshape((1, -1) + (1,) * nd)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", TORCH_CASES)
def test_conv_transpose_gradients_match_torch(case, dtype):
    """The training graph's dX, dW, dB (Conv, ConvGrad, ReduceSum nodes) against PyTorch's autograd."""
    import torch
    from gradcheck import gradient_session

    from edgetrain.ir import Node, TensorType
    x_shape, w_shape, attrs = CASES[case]
    rng = np.random.default_rng(zlib.crc32(f"torch/{case}".encode()))
    shapes = {"x": x_shape, "w": w_shape, "b": (_c_out(w_shape, attrs),)}
    params = {k: rng.standard_normal(s).astype(dtype) for k, s in shapes.items()}
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    ty = _torch_conv_transpose(tp["x"], tp["w"], tp["b"], attrs)
    sess, graph = gradient_session([Node("ConvTranspose", ["x", "w", "b"], ["y"], attrs, "up")], params, {},
                                   ["y"], [TensorType(dtype, tuple(ty.shape))])
    tloss = (ty * torch.tensor(graph.initializers["cot_0"])).sum()
    tloss.backward()
    ours = sess.run(None, dict(params))
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(ours[0], tloss.item(), **tol)
    for k, got in zip(params, ours[1:]):
        assert got.dtype == dtype and got.shape == params[k].shape
        np.testing.assert_allclose(got, tp[k].grad.numpy(), err_msg=f"d{k}", **tol)


def test_conv_transpose_rule_emits_onnxruntime_ops():
    """dX is a Conv with the resolved pads, dW a com.microsoft ConvGrad(X, dY, W) wanting only dW, dB a
    ReduceSum: ops onnxruntime-training runs too."""
    from edgetrain.autodiff.builder import gradient_graph, prepare_for_training
    from edgetrain.ir import Graph, Node, TensorType, Value
    attrs = dict(strides=[2, 2], auto_pad="SAME_UPPER", group=2)
    nodes = [Node("ConvTranspose", ["x", "w", "b"], ["y"], attrs, "up1"),
             Node("ReduceSum", ["y"], ["loss"], {"keepdims": 0}, "sum")]
    g = Graph(nodes, [Value("x", TensorType(np.float32, ("N", 4, 5, 5)))],
              [Value("loss", TensorType(np.float32, ()))],
              {"w": np.zeros((4, 3, 3, 3), np.float32), "b": np.zeros(6, np.float32)}, {"": 17})
    grad_nodes, _, _ = gradient_graph(prepare_for_training(g), "loss", ["x", "w", "b"])
    kinds = {(n.domain, n.op_type): n for n in grad_nodes}
    conv, conv_grad = kinds[("", "Conv")], kinds[("com.microsoft", "ConvGrad")]
    # full 11 -> 10 (SAME_UPPER: 5 * 2): one row cropped at the end, which the Conv from Y to X pads back
    assert conv.attrs["pads"] == (0, 0, 1, 1) and conv.attrs["group"] == 2 and conv.attrs["strides"] == (2, 2)
    assert conv_grad.inputs == ["x", conv.inputs[0], "w"] and conv_grad.outputs[0] == ""
    assert ("", "ReduceSum") in kinds


# --- training end to end ----------------------------------------------------------------------------------

def _autoencoder(rng):
    """Conv 1->4 3x3 stride 2 pad 1 -> Relu -> ConvTranspose 4->1 3x3 stride 2 pad 1 output_padding 1."""
    params = {"w1": (rng.standard_normal((4, 1, 3, 3)) * 0.4).astype(np.float32),
              "b1": np.full(4, 0.05, np.float32),
              "w2": (rng.standard_normal((4, 1, 3, 3)) * 0.4).astype(np.float32),
              "b2": np.full(1, 0.02, np.float32)}
    nodes = [helper.make_node("Conv", ["input", "w1", "b1"], ["h"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("ConvTranspose", ["r", "w2", "b2"], ["output"], strides=[2, 2],
                              pads=[1, 1, 1, 1], output_padding=[1, 1])]
    x = np.zeros((4, 1, 8, 8), np.float32)
    return model(nodes, {"input": x}, ["output"], params), params


def test_conv_autoencoder_trains_like_torch(tmp_path):
    """Artifacts (MSE loss, SGD) for a conv autoencoder fitting one batch: five steps' losses against the same
    model and optimizer in PyTorch (each loss after the first depends on every earlier update)."""
    import torch
    import torch.nn.functional as F

    from edgetrain import artifacts
    from edgetrain.api import CheckpointState, Module, Optimizer
    rng = np.random.default_rng(11)
    m, params = _autoencoder(rng)
    artifacts.generate_artifacts(m, requires_grad=list(params), loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx")
    opt = Optimizer(tmp_path / "optimizer_model.onnx", module)
    opt.set_learning_rate(0.05)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    topt = torch.optim.SGD(list(tp.values()), lr=0.05)
    ours, theirs = [], []
    x = rng.standard_normal((4, 1, 8, 8)).astype(np.float32)
    for _ in range(5):
        ours.append(float(module(x, x)))
        opt.step()
        module.lazy_reset_grad()
        tx = torch.tensor(x)
        h = F.relu(F.conv2d(tx, tp["w1"], tp["b1"], stride=2, padding=1))
        y = F.conv_transpose2d(h, tp["w2"], tp["b2"], stride=2, padding=1, output_padding=1)
        loss = F.mse_loss(y, tx)
        topt.zero_grad()
        loss.backward()
        topt.step()
        theirs.append(loss.item())
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    assert ours[-1] < ours[0]


@pytest.mark.ort119
def test_conv_transpose_training_graph_runs_in_onnxruntime_119(ort):
    """onnxruntime-training 1.19.2 runs the gradient graph edgetrain emits for ConvTranspose (Conv, ConvGrad,
    ReduceSum) and agrees with edgetrain on the loss and every gradient."""
    from gradcheck import gradient_session

    from edgetrain.autodiff.builder import with_gradients
    from edgetrain.ir import Node
    from edgetrain.onnx_io import from_graph
    cases = []
    for case in ["2d_stride2_pads_outpad", "2d_group2", "2d_depthwise_stride2", "2d_same_lower", "1d_output_shape"]:
        x_shape, w_shape, attrs = CASES[case]
        rng = np.random.default_rng(zlib.crc32(f"ort/{case}".encode()))
        shapes = {"x": x_shape, "w": w_shape, "b": (_c_out(w_shape, attrs),)}
        params = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
        out = _out_type(x_shape, w_shape, attrs)
        _, graph = gradient_session([Node("ConvTranspose", ["x", "w", "b"], ["y"], attrs, "up")], params, {},
                                    ["y"], [type(out)(np.float32, out.shape)])
        cases.append((from_graph(with_gradients(graph, "loss", list(params))), params))
    for (m, feeds), theirs in zip(cases, ort.run_models(cases)):
        ours = run_edgetrain(m, feeds)
        assert len(ours) == len(theirs) == 4
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
