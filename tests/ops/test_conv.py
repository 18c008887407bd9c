"""Conv against onnxruntime (float32) and the ONNX reference evaluator (float64; ORT has no double Conv).

Covers 1-D and 2-D, strides, (asymmetric) pads, dilations, auto_pad, groups, depthwise, pointwise, bias
present or absent, weights as initializers (bias split off by lowering), weights fed at run time (nothing
folded), and an all-constant Conv (folded when planning by running the launcher, bias included).
"""
import zlib

import numpy as np
import pytest
from onnx import helper
from oracle import assert_matches, model, run_edgetrain, run_onnxruntime, run_reference

import edgetrain
from edgetrain.errors import ShapeError

pytestmark = pytest.mark.arm64   # also on the emulated arm64 stage (.ci/run, README "Platforms")

# (X shape, W shape, attributes); the cases cover every kernel path: im2col + GEMM (group 1), grouped GEMM,
# pointwise (no im2col), and the direct loop (one input channel per group).
CASES = {
    "2d_pad1": ((2, 3, 7, 6), (4, 3, 3, 3), dict(pads=[1, 1, 1, 1])),
    "2d_nopad": ((2, 3, 6, 5), (5, 3, 2, 3), {}),
    "2d_stride_asym_pads_dilation": ((2, 3, 9, 8), (4, 3, 3, 2), dict(pads=[1, 0, 2, 1], strides=[2, 1],
                                                                      dilations=[1, 2])),
    "2d_big_pads": ((1, 2, 4, 5), (3, 2, 2, 2), dict(pads=[3, 2, 2, 3], strides=[2, 2])),
    "2d_c_in_1": ((3, 1, 10, 9), (4, 1, 3, 3), dict(pads=[1, 1, 1, 1])),
    "2d_kernel_shape_attr": ((2, 3, 6, 6), (2, 3, 3, 3), dict(kernel_shape=[3, 3], strides=[3, 2])),
    "2d_group2": ((2, 4, 7, 6), (6, 2, 3, 3), dict(pads=[1, 2, 1, 0], group=2, strides=[2, 2])),
    "2d_group3_dilated": ((1, 6, 8, 8), (3, 2, 2, 2), dict(group=3, dilations=[2, 3], pads=[1, 1, 0, 2])),
    "2d_depthwise": ((2, 4, 7, 6), (4, 1, 3, 3), dict(pads=[1, 1, 1, 1], group=4)),
    "2d_depthwise_stride2": ((2, 5, 9, 7), (5, 1, 3, 3), dict(pads=[1, 0, 1, 2], group=5, strides=[2, 2])),
    "2d_depthwise_multiplier": ((2, 3, 7, 6), (6, 1, 3, 2), dict(pads=[1, 2, 1, 0], group=3, strides=[1, 2])),
    "2d_depthwise_dilated": ((1, 4, 9, 9), (4, 1, 3, 3), dict(pads=[2, 2, 2, 2], group=4, dilations=[2, 2])),
    "2d_depthwise_5x5": ((1, 3, 8, 8), (3, 1, 5, 5), dict(pads=[2, 2, 2, 2], group=3)),
    "2d_pointwise": ((2, 8, 5, 4), (6, 8, 1, 1), {}),
    "2d_pointwise_grouped": ((2, 8, 5, 4), (6, 4, 1, 1), dict(group=2)),
    "2d_pointwise_strided": ((2, 4, 5, 5), (3, 4, 1, 1), dict(strides=[2, 2])),
    "2d_same_upper": ((2, 4, 9, 5), (6, 4, 3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    "2d_same_lower": ((2, 4, 9, 5), (6, 4, 2, 2), dict(auto_pad="SAME_LOWER", strides=[2, 3])),
    "2d_same_lower_depthwise": ((1, 4, 6, 7), (4, 1, 2, 2), dict(auto_pad="SAME_LOWER", group=4)),
    "2d_valid": ((2, 4, 9, 5), (6, 4, 2, 2), dict(auto_pad="VALID", strides=[2, 3])),
    "1d_pad": ((2, 3, 11), (4, 3, 3), dict(pads=[1, 1])),
    "1d_stride_asym_dilation": ((2, 3, 12), (5, 3, 3), dict(pads=[2, 0], strides=[2], dilations=[2])),
    "1d_group2": ((2, 4, 9), (6, 2, 3), dict(pads=[1, 2], group=2, strides=[2])),
    "1d_depthwise": ((3, 4, 10), (8, 1, 3), dict(pads=[1, 1], group=4)),
    "1d_pointwise": ((2, 4, 9), (6, 4, 1), {}),
    "1d_same_upper": ((2, 3, 10), (4, 3, 4), dict(auto_pad="SAME_UPPER", strides=[3])),
}
FLOAT64_CASES = ["2d_pad1", "2d_stride_asym_pads_dilation", "2d_group2", "2d_depthwise_stride2",
                 "2d_pointwise", "1d_depthwise", "2d_same_lower"]


def _conv_model(x_shape, w_shape, attrs, dtype, bias, rng, fed=False):
    x = rng.standard_normal(x_shape).astype(dtype)
    consts = {"W": rng.standard_normal(w_shape).astype(dtype)}
    if bias:
        consts["B"] = rng.standard_normal(w_shape[0]).astype(dtype)
    node = helper.make_node("Conv", ["X"] + list(consts), ["Y"], **attrs)
    if fed:   # weights as graph inputs: nothing is known when planning
        feeds = {"X": x, **consts}
        return model(node, feeds, ["Y"]), feeds
    return model(node, {"X": x}, ["Y"], consts), {"X": x}


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("case", list(CASES))
def test_conv_float32(case, bias):
    rng = np.random.default_rng(zlib.crc32(f"{case}/{bias}".encode()))
    m, feeds = _conv_model(*CASES[case], np.float32, bias, rng)
    assert_matches(m, feeds, oracle=run_onnxruntime, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", FLOAT64_CASES)
def test_conv_float64(case):
    m, feeds = _conv_model(*CASES[case], np.float64, True, np.random.default_rng(1))
    assert_matches(m, feeds, oracle=run_reference, rtol=1e-10, atol=1e-12)


# The direct path splits each padded plane into its stride phases: odd sizes, pads on one side only or past
# the kernel, dilations that are and are not multiples of the stride, strides of 2, 3 and mixed, 1-D.
STRIDED_DEPTHWISE = {
    "s2_odd_pad_begin": ((2, 3, 11, 9), (3, 1, 3, 3), dict(pads=[1, 1, 0, 0], group=3, strides=[2, 2])),
    "s2_even_pad_end": ((1, 4, 10, 12), (4, 1, 3, 3), dict(pads=[0, 0, 1, 1], group=4, strides=[2, 2])),
    "s2_dilation2": ((1, 2, 13, 11), (2, 1, 3, 3), dict(pads=[2, 2, 2, 2], group=2, strides=[2, 2],
                                                        dilations=[2, 2])),
    "s2_dilation3_asym": ((2, 3, 12, 13), (3, 1, 3, 2), dict(pads=[3, 1, 2, 0], group=3, strides=[2, 2],
                                                             dilations=[3, 1])),
    "s3_s2_big_pads": ((1, 2, 8, 9), (4, 1, 3, 3), dict(pads=[3, 4, 2, 3], group=2, strides=[3, 2])),
    "s2_s1_5x5": ((1, 3, 9, 8), (3, 1, 5, 5), dict(pads=[2, 2, 2, 2], group=3, strides=[2, 1])),
    "s1_s3_7x4": ((2, 2, 9, 14), (2, 1, 7, 4), dict(pads=[3, 1, 3, 2], group=2, strides=[1, 3])),
    "s2_multiplier_1x1": ((2, 3, 7, 7), (6, 1, 1, 1), dict(group=3, strides=[2, 2])),
    "s2_same_upper": ((1, 4, 7, 10), (4, 1, 3, 3), dict(auto_pad="SAME_UPPER", group=4, strides=[2, 2])),
    "s2_no_pad_kernel_fills": ((1, 2, 3, 5), (2, 1, 3, 3), dict(group=2, strides=[2, 2])),
    "1d_s2_odd": ((2, 4, 15), (4, 1, 3), dict(pads=[1, 0], group=4, strides=[2])),
    "1d_s4_dilated": ((1, 3, 23), (3, 1, 3), dict(pads=[2, 3], group=3, strides=[4], dilations=[3])),
    "s2_multiplier_3x3": ((2, 2, 9, 11), (6, 1, 3, 3), dict(pads=[1, 1, 1, 1], group=2, strides=[2, 2])),
}


@pytest.mark.parametrize("case", list(STRIDED_DEPTHWISE))
def test_conv_strided_depthwise(case):
    """Strided depthwise convs (the stride phases of ``kernels.conv._conv_direct``) against onnxruntime in
    float32 and the reference evaluator in float64; a rerun with other data overwrites every output."""
    x_shape, w_shape, attrs = STRIDED_DEPTHWISE[case]
    rng = np.random.default_rng(zlib.crc32(f"strided/{case}".encode()))
    m, feeds = _conv_model(x_shape, w_shape, attrs, np.float32, True, rng, fed=True)
    sess = edgetrain.InferenceSession(m.SerializeToString())
    assert any(b.node.op_type == "Conv" and b.op.workspace(b.ctx)[0].shape[1] == np.prod(attrs["strides"])
               for s in sess.program(feeds).plan.steps for b in s.nodes), "not on the direct path"
    for _ in range(2):
        feeds = {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in feeds.items()}
        np.testing.assert_allclose(sess.run(None, feeds)[0], run_onnxruntime(m, feeds)[0], rtol=1e-4, atol=1e-5)
    m, feeds = _conv_model(x_shape, w_shape, attrs, np.float64, False, rng)
    assert_matches(m, feeds, oracle=run_reference, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", ["2d_stride_asym_pads_dilation", "2d_group2", "2d_depthwise",
                                  "1d_pointwise"])
def test_conv_weights_fed(case):
    """W and B are graph inputs: the Conv kernel reads weights from the arena, bias added by the epilogue."""
    m, feeds = _conv_model(*CASES[case], np.float32, True, np.random.default_rng(2), fed=True)
    assert_matches(m, feeds, oracle=run_onnxruntime, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ["2d_pad1", "2d_depthwise_multiplier", "2d_pointwise_grouped", "1d_group2"])
def test_conv_folded(case, dtype):
    """X, W and B are all initializers: planning folds Conv by calling the launcher with the bias present."""
    x_shape, w_shape, attrs = CASES[case]
    rng = np.random.default_rng(3)
    consts = {"X": rng.standard_normal(x_shape).astype(dtype),
              "W": rng.standard_normal(w_shape).astype(dtype),
              "B": rng.standard_normal(w_shape[0]).astype(dtype)}
    z = rng.standard_normal(1).astype(dtype)
    nodes = [helper.make_node("Conv", ["X", "W", "B"], ["C"], **attrs),
             helper.make_node("Add", ["C", "Z"], ["Y"])]
    m = model(nodes, {"Z": z}, ["Y"], consts)
    sess = edgetrain.InferenceSession(m.SerializeToString())
    steps = sess.program({"Z": z}).plan.steps
    assert not any(b.node.op_type == "Conv" for s in steps for b in s.nodes), "Conv was not folded"
    assert_matches(m, {"Z": z}, oracle=run_reference, rtol=1e-5 if dtype == np.float32 else 1e-10, atol=1e-5)


@pytest.mark.parametrize("case", ["2d_stride_asym_pads_dilation", "2d_depthwise_stride2", "2d_pointwise"])
def test_conv_reruns_overwrite(case):
    """A second run with other inputs gives the second answer: outputs and workspaces are fully rewritten."""
    rng = np.random.default_rng(4)
    m, feeds = _conv_model(*CASES[case], np.float32, True, rng, fed=True)
    sess = edgetrain.InferenceSession(m.SerializeToString())
    for _ in range(2):
        feeds = {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in feeds.items()}
        ours = sess.run(None, feeds)[0]
        np.testing.assert_allclose(ours, run_onnxruntime(m, feeds)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("x_shape, w_shape, attrs, match", [
    ((1, 4, 5, 5), (4, 3, 3, 3), dict(group=1), "input channels per group"),
    ((1, 4, 5, 5), (3, 2, 3, 3), dict(group=2), "group 2 must divide"),
    ((1, 4, 5, 5), (4, 4, 3, 3), dict(kernel_shape=[2, 2]), "kernel_shape"),
    ((1, 4, 5, 5), (4, 4, 3, 3), dict(pads=[1, 1]), "pads"),
    ((1, 4, 5, 5), (4, 4, 3, 3), dict(strides=[0, 1]), "strides"),
    ((1, 4, 5, 5), (4, 4, 3, 3), dict(auto_pad="SAME"), "auto_pad"),
    ((1, 4, 2, 2), (4, 4, 3, 3), {}, "does not fit"),
    ((1, 2, 3, 3, 3), (2, 2, 1, 1, 1), {}, "3-D spatial"),
])
def test_conv_errors_name_the_node(x_shape, w_shape, attrs, match):
    x = np.zeros(x_shape, np.float32)
    w = np.zeros(w_shape, np.float32)
    m = model(helper.make_node("Conv", ["X", "W"], ["Y"], name="conv_7", **attrs), {"X": x}, ["Y"], {"W": w})
    with pytest.raises(ShapeError, match=match) as err:
        edgetrain.InferenceSession(m.SerializeToString()).run(None, {"X": x})
    assert "conv_7" in str(err.value)


def test_conv_bench_shapes_match_onnxruntime():
    """The bench models' conv layers (cnn, mobilenet), batch cut to 2."""
    rng = np.random.default_rng(5)
    for x_shape, w_shape, attrs in [((2, 1, 28, 28), (8, 1, 3, 3), dict(pads=[1, 1, 1, 1])),
                                    ((2, 8, 14, 14), (16, 8, 3, 3), dict(pads=[1, 1, 1, 1])),
                                    ((2, 3, 32, 32), (32, 3, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
                                    ((2, 32, 16, 16), (32, 1, 3, 3), dict(pads=[1, 1, 1, 1], group=32)),
                                    ((2, 32, 16, 16), (64, 32, 1, 1), {})]:
        m, feeds = _conv_model(x_shape, w_shape, attrs, np.float32, True, rng)
        assert_matches(m, feeds, oracle=run_onnxruntime, rtol=1e-4, atol=1e-4)


# --- gradients --------------------------------------------------------------------------------------------
# The Conv rule by central differences (float64, every case above, bias present or absent, and with only some
# inputs differentiated); the ConvGrad kernel against PyTorch's autograd on the same dY; dot-product tests
# at the bench models' shapes.

def _torch_conv(x, w, b, attrs):
    """PyTorch's Conv with ONNX attributes: explicit (possibly asymmetric) pads applied by F.pad first."""
    import torch.nn.functional as F
    nd = x.dim() - 2
    strides = attrs.get("strides", [1] * nd)
    dilations = attrs.get("dilations", [1] * nd)
    kernel = w.shape[2:]
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad == "NOTSET":
        pads = attrs.get("pads", [0] * 2 * nd)
    elif auto_pad == "VALID":
        pads = [0] * 2 * nd
    else:
        begin, end = [], []
        for size, k, s, d in zip(x.shape[2:], kernel, strides, dilations):
            total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
            lo = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            begin.append(lo)
            end.append(total - lo)
        pads = begin + end
    torch_pads = [p for a in reversed(range(nd)) for p in (pads[a], pads[nd + a])]
    conv = F.conv2d if nd == 2 else F.conv1d
    return conv(F.pad(x, torch_pads), w, b, stride=strides, dilation=dilations, groups=attrs.get("group", 1))


def _conv_out_shape(x_shape, w_shape, attrs):
    import torch
    zeros = [torch.zeros(s, dtype=torch.float64) for s in (x_shape, w_shape)]
    return tuple(_torch_conv(*zeros, None, attrs).shape)


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("case", list(CASES))
def test_conv_gradient_rule(case, bias):
    """d/dX, d/dW (and d/dB) of Conv by central differences, float64."""
    from gradcheck import check_gradients

    from edgetrain.ir import Node, TensorType
    x_shape, w_shape, attrs = CASES[case]
    rng = np.random.default_rng(zlib.crc32(f"grad/{case}/{bias}".encode()))
    params = {"x": rng.standard_normal(x_shape), "w": rng.standard_normal(w_shape)}
    if bias:
        params["b"] = rng.standard_normal(w_shape[0])
    out = TensorType(np.float64, _conv_out_shape(x_shape, w_shape, attrs))
    check_gradients([Node("Conv", list(params), ["y"], attrs, "conv")], params, ["y"], [out], samples=8)


@pytest.mark.parametrize("wrt", [("w",), ("x",), ("b",), ("x", "b"), ("w", "b")], ids="+".join)
@pytest.mark.parametrize("case", ["2d_stride_asym_pads_dilation", "2d_group2", "2d_depthwise_multiplier",
                                  "2d_depthwise_stride2", "2d_pointwise_grouped"])
def test_conv_gradient_rule_some_inputs(case, wrt):
    """Only some of X, W, B are differentiated: ConvGrad gets "" for the outputs nobody needs."""
    from gradcheck import check_gradients

    from edgetrain.ir import Node, TensorType
    x_shape, w_shape, attrs = CASES[case]
    rng = np.random.default_rng(zlib.crc32(f"some/{case}".encode()))
    values = {"x": rng.standard_normal(x_shape), "w": rng.standard_normal(w_shape),
              "b": rng.standard_normal(w_shape[0])}
    params = {k: v for k, v in values.items() if k in wrt}
    consts = {k: v for k, v in values.items() if k not in wrt}
    out = TensorType(np.float64, _conv_out_shape(x_shape, w_shape, attrs))
    check_gradients([Node("Conv", ["x", "w", "b"], ["y"], attrs, "conv")], params, ["y"], [out],
                    consts=consts)


def test_conv_rule_emits_onnxruntime_conv_grad():
    """One com.microsoft ConvGrad(dY, X, W) with Conv's attributes and "" for dX when X needs no gradient."""
    from edgetrain.autodiff.builder import gradient_graph, prepare_for_training
    from edgetrain.ir import Graph, Node, TensorType, Value
    attrs = dict(pads=[1, 1, 1, 1], strides=[1, 1], group=1, kernel_shape=[3, 3], dilations=[1, 1])
    nodes = [Node("Conv", ["x", "w", "b"], ["y"], attrs, "conv1"),
             Node("ReduceSum", ["y"], ["loss"], {"keepdims": 0}, "sum")]
    g = Graph(nodes, [Value("x", TensorType(np.float32, ("N", 1, 28, 28)))],
              [Value("loss", TensorType(np.float32, ()))],
              {"w": np.zeros((8, 1, 3, 3), np.float32), "b": np.zeros(8, np.float32)}, {"": 17})
    grad_nodes, _, grads = gradient_graph(prepare_for_training(g), "loss", ["w", "b"])
    (conv_grad,) = [n for n in grad_nodes if n.op_type == "ConvGrad"]
    canonical = {k: tuple(v) if isinstance(v, list) else v for k, v in attrs.items()}   # lists load as tuples
    assert conv_grad.domain == "com.microsoft" and conv_grad.attrs == canonical
    assert conv_grad.inputs[1:] == ["x", "w"] and conv_grad.outputs[0] == ""
    assert len(conv_grad.outputs) == 3 and all(conv_grad.outputs[1:])


# (X, W, attributes, outputs wanted): every ConvGrad kernel path and output subset
GRAD_KERNEL_CASES = {
    "gemm_all": ((2, 3, 9, 8), (4, 3, 3, 2), dict(pads=[1, 0, 2, 1], strides=[2, 1], dilations=[1, 2]),
                 "xwb"),
    "gemm_dw_db": ((3, 1, 10, 9), (4, 1, 3, 3), dict(pads=[1, 1, 1, 1]), "wb"),
    "gemm_dx": ((2, 3, 7, 6), (4, 3, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2]), "x"),
    "grouped_all": ((2, 4, 7, 6), (6, 2, 3, 3), dict(pads=[1, 2, 1, 0], group=2, strides=[2, 2]), "xwb"),
    "grouped_dx_dw": ((1, 6, 8, 8), (3, 2, 2, 2), dict(group=3, dilations=[2, 3], pads=[1, 1, 0, 2]), "xw"),
    "pointwise_all": ((2, 8, 5, 4), (6, 8, 1, 1), {}, "xwb"),
    "pointwise_grouped_dx": ((2, 8, 5, 4), (6, 4, 1, 1), dict(group=2), "x"),
    "direct_all": ((2, 4, 7, 6), (4, 1, 3, 3), dict(pads=[1, 1, 1, 1], group=4), "xwb"),
    "direct_multiplier_dw": ((2, 3, 7, 6), (6, 1, 3, 2), dict(pads=[1, 2, 1, 0], group=3, strides=[1, 2]),
                             "w"),
    "direct_stride_dx": ((2, 5, 9, 7), (5, 1, 3, 3), dict(pads=[1, 0, 1, 2], group=5, strides=[2, 2]), "x"),
    "direct_dilated_db": ((1, 4, 9, 9), (4, 1, 3, 3), dict(pads=[2, 2, 2, 2], group=4, dilations=[2, 2]),
                          "b"),
    "1d_gemm_all": ((2, 3, 12), (5, 3, 3), dict(pads=[2, 0], strides=[2], dilations=[2]), "xwb"),
    "1d_direct_all": ((3, 4, 10), (8, 1, 3), dict(pads=[1, 1], group=4), "xwb"),
    "same_lower_all": ((2, 4, 9, 5), (6, 4, 2, 2), dict(auto_pad="SAME_LOWER", strides=[2, 3]), "xwb"),
    # few pixels, many channels (late layers); one image (dY and X are their own batch-wide GEMM operands)
    "one_gemm_all": ((3, 8, 3, 3), (6, 8, 3, 3), dict(pads=[1, 1, 1, 1]), "xwb"),
    "one_gemm_grouped_dw": ((2, 8, 2, 2), (8, 4, 3, 3), dict(pads=[1, 1, 1, 1], group=2), "w"),
    "one_gemm_pointwise_all": ((2, 16, 2, 2), (20, 16, 1, 1), {}, "xwb"),
    "one_image_all": ((1, 3, 7, 6), (4, 3, 3, 3), dict(pads=[1, 1, 1, 1], strides=[1, 2]), "xwb"),
    "one_image_grouped_dx": ((1, 4, 5, 5), (6, 2, 3, 3), dict(pads=[0, 1, 1, 0], group=2), "x"),
    "one_image_pointwise_all": ((1, 8, 3, 5), (6, 8, 1, 1), {}, "xwb"),
    "pointwise_dw": ((3, 8, 3, 5), (6, 8, 1, 1), {}, "w"),
}


def _conv_grad_model(x, w, dy, attrs, want: str, dtype):
    outs = [f"d{k.upper()}" if k in want else "" for k in "xwb"]
    while not outs[-1]:
        outs.pop()
    node = helper.make_node("ConvGrad", ["dY", "X", "W"], outs, domain="com.microsoft", **attrs)
    return model(node, {"dY": dy, "X": x, "W": w}, [o for o in outs if o])


def _torch_conv_grads(x, w, dy, attrs):
    import torch
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    tb = torch.zeros(w.shape[0], dtype=tx.dtype, requires_grad=True)
    _torch_conv(tx, tw, tb, attrs).backward(torch.tensor(dy))
    return {"x": tx.grad.numpy(), "w": tw.grad.numpy(), "b": tb.grad.numpy()}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", list(GRAD_KERNEL_CASES))
def test_conv_grad_kernel_matches_torch(case, dtype):
    x_shape, w_shape, attrs, want = GRAD_KERNEL_CASES[case]
    rng = np.random.default_rng(zlib.crc32(f"kernel/{case}".encode()))
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    dy = rng.standard_normal(_conv_out_shape(x_shape, w_shape, attrs)).astype(dtype)
    ours = run_edgetrain(_conv_grad_model(x, w, dy, attrs, want, dtype), {"dY": dy, "X": x, "W": w})
    ref = _torch_conv_grads(x, w, dy, attrs)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-11, atol=1e-11)
    for k, got in zip(want, ours):
        assert got.dtype == dtype and got.shape == ref[k].shape
        np.testing.assert_allclose(got, ref[k], err_msg=f"d{k.upper()}", **tol)


BENCH_CONVS = {   # the bench models' conv layers at full batch (cnn: batch 32, mobilenet: batch 16)
    "cnn_conv1": ((32, 1, 28, 28), (8, 1, 3, 3), dict(pads=[1, 1, 1, 1]), "wb"),
    "cnn_conv2": ((32, 8, 14, 14), (16, 8, 3, 3), dict(pads=[1, 1, 1, 1]), "xwb"),
    "mobilenet_conv1": ((16, 3, 32, 32), (32, 3, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2]), "w"),
    "mobilenet_dw": ((16, 32, 16, 16), (32, 1, 3, 3), dict(pads=[1, 1, 1, 1], group=32), "xw"),
    "mobilenet_pw": ((16, 32, 16, 16), (64, 32, 1, 1), {}, "xwb"),
}


@pytest.mark.parametrize("case", list(BENCH_CONVS))
def test_conv_grad_kernel_bench_shapes(case):
    """ConvGrad at the bench shapes, float32, against PyTorch; a second run with other data overwrites."""
    x_shape, w_shape, attrs, want = BENCH_CONVS[case]
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    dy_shape = _conv_out_shape(x_shape, w_shape, attrs)
    sess = None
    for _ in range(2):
        x = rng.standard_normal(x_shape).astype(np.float32)
        w = (rng.standard_normal(w_shape) * 0.3).astype(np.float32)
        dy = rng.standard_normal(dy_shape).astype(np.float32)
        m = _conv_grad_model(x, w, dy, attrs, want, np.float32)
        sess = sess or edgetrain.InferenceSession(m.SerializeToString())
        ours = sess.run(None, {"dY": dy, "X": x, "W": w})
        ref = _torch_conv_grads(x, w, dy, attrs)
        for k, got in zip(want, ours):
            scale = float(np.abs(ref[k]).max())
            np.testing.assert_allclose(got, ref[k], rtol=1e-4, atol=1e-5 * scale, err_msg=f"d{k.upper()}")


def test_conv_grad_errors_name_the_node():
    x, w = np.zeros((1, 4, 5, 5), np.float32), np.zeros((4, 4, 3, 3), np.float32)
    dy = np.zeros((1, 4, 5, 5), np.float32)   # Conv without pads gives 3x3
    node = helper.make_node("ConvGrad", ["dY", "X", "W"], ["dX"], name="cg_1", domain="com.microsoft")
    m = model(node, {"dY": dy, "X": x, "W": w}, ["dX"])
    with pytest.raises(ShapeError, match="dY must be") as err:
        edgetrain.InferenceSession(m.SerializeToString()).run(None, {"dY": dy, "X": x, "W": w})
    assert "cg_1" in str(err.value)


# The bench models' structure is piecewise linear (ReLU, MaxPool); across their ~300K activations, float32
# central differences with eps * t large enough to beat float32 rounding cross hundreds of kinks and miss by
# 5-60%. So the exact structure is checked in float64 with a small step, and the float32 kernels with smooth
# stand-ins (Tanh for ReLU, AveragePool for MaxPool) at the same shapes.
DIRECTIONAL = [(np.float64, "Relu", "MaxPool", 1e-7), (np.float32, "Tanh", "AveragePool", 1e-2)]


@pytest.mark.parametrize("dtype,act,pool,eps", DIRECTIONAL,
                         ids=["float64-relu-maxpool", "float32-tanh-avgpool"])
def test_dot_product_cnn_bench_shapes(dtype, act, pool, eps):
    """cnn: conv 1->8 3x3 pad 1, relu, maxpool 2x2, conv 8->16, relu, maxpool: <t, J^T c> == <J t, c>."""
    from gradcheck import check_directional

    from edgetrain.ir import Node, TensorType
    rng = np.random.default_rng(7)
    params = {"w1": (rng.standard_normal((8, 1, 3, 3)) * 0.3).astype(dtype), "b1": np.full(8, 0.1, dtype),
              "w2": (rng.standard_normal((16, 8, 3, 3)) * 0.1).astype(dtype), "b2": np.full(16, 0.1, dtype)}
    consts = {"x": rng.standard_normal((32, 1, 28, 28)).astype(dtype)}
    pad, window = dict(pads=[1, 1, 1, 1]), dict(kernel_shape=[2, 2], strides=[2, 2])
    nodes = [Node("Conv", ["x", "w1", "b1"], ["c1"], pad, "conv1"), Node(act, ["c1"], ["r1"], {}, "act1"),
             Node(pool, ["r1"], ["p1"], window, "pool1"),
             Node("Conv", ["p1", "w2", "b2"], ["c2"], pad, "conv2"), Node(act, ["c2"], ["r2"], {}, "act2"),
             Node(pool, ["r2"], ["out"], window, "pool2")]
    check_directional(nodes, params, ["out"], [TensorType(dtype, (32, 16, 7, 7))], consts=consts, eps=eps)


@pytest.mark.parametrize("dtype,act,eps", [(np.float64, "Relu", 1e-7), (np.float32, "Tanh", 1e-2)],
                         ids=["float64-relu", "float32-tanh"])
def test_dot_product_mobilenet_bench_shapes(dtype, act, eps):
    """mobilenet: conv 3->32 s2, relu, depthwise 3x3 (32 ch), relu, pointwise 32->64, GlobalAveragePool."""
    from gradcheck import check_directional

    from edgetrain.ir import Node, TensorType
    rng = np.random.default_rng(8)
    params = {"w1": (rng.standard_normal((32, 3, 3, 3)) * 0.2).astype(dtype),
              "dw": (rng.standard_normal((32, 1, 3, 3)) * 0.3).astype(dtype),
              "pw": (rng.standard_normal((64, 32, 1, 1)) * 0.2).astype(dtype), "pb": np.full(64, 0.1, dtype)}
    consts = {"x": rng.standard_normal((16, 3, 32, 32)).astype(dtype)}
    nodes = [Node("Conv", ["x", "w1"], ["c1"], dict(pads=[1, 1, 1, 1], strides=[2, 2]), "conv1"),
             Node(act, ["c1"], ["r1"], {}, "act1"),
             Node("Conv", ["r1", "dw"], ["c2"], dict(pads=[1, 1, 1, 1], group=32), "dw"),
             Node(act, ["c2"], ["r2"], {}, "act2"),
             Node("Conv", ["r2", "pw", "pb"], ["c3"], {}, "pw"),
             Node("GlobalAveragePool", ["c3"], ["out"], {}, "gap")]
    check_directional(nodes, params, ["out"], [TensorType(dtype, (16, 64, 1, 1))], consts=consts, eps=eps)


@pytest.mark.ort119
def test_conv_grad_runs_in_onnxruntime_119(ort):
    """onnxruntime-training 1.19.2 runs the ConvGrad nodes edgetrain emits and agrees with our kernel."""
    cases = []
    for case in ["gemm_all", "grouped_all", "direct_all", "pointwise_all", "gemm_dw_db", "1d_gemm_all"]:
        x_shape, w_shape, attrs, want = GRAD_KERNEL_CASES[case]
        rng = np.random.default_rng(zlib.crc32(f"ort/{case}".encode()))
        x = rng.standard_normal(x_shape).astype(np.float32)
        w = rng.standard_normal(w_shape).astype(np.float32)
        dy = rng.standard_normal(_conv_out_shape(x_shape, w_shape, attrs)).astype(np.float32)
        cases.append((_conv_grad_model(x, w, dy, attrs, want, np.float32), {"dY": dy, "X": x, "W": w}))
    for (m, feeds), theirs in zip(cases, ort.run_models(cases)):
        ours = run_edgetrain(m, feeds)
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


# --- Col2Im ---------------------------------------------------------------------------------------------------

COL2IM_CASES = {
    "plain": ((2, 2, 3, 4), (2, 2), {}),
    "strides_pads_dilations": ((1, 3, 5, 6), (2, 3), dict(strides=[2, 1], pads=[1, 0, 1, 2], dilations=[1, 2])),
    "1d": ((2, 2, 7), (3,), dict(strides=[2], pads=[1, 1])),
    "3d": ((1, 2, 3, 4, 3), (2, 2, 2), dict(pads=[0, 1, 0, 0, 1, 1])),
}


@pytest.mark.parametrize("case", list(COL2IM_CASES))
def test_col2im_against_reference(case):
    """The reference evaluator (onnxruntime's Col2Im is 2-D only) and, for 2-D cases, onnxruntime."""
    shape, block, attrs = COL2IM_CASES[case]
    image, rank = shape[2:], len(block)
    n, c = shape[0], shape[1]
    strides, dil = attrs.get("strides", [1] * rank), attrs.get("dilations", [1] * rank)
    pads = attrs.get("pads", [0] * 2 * rank)
    steps = [(i + pads[k] + pads[k + rank] - dil[k] * (b - 1) - 1) // strides[k] + 1
             for k, (i, b) in enumerate(zip(image, block))]
    x = np.random.default_rng(len(case)).standard_normal((n, c * int(np.prod(block)), int(np.prod(steps))))
    x = x.astype(np.float32)
    m = model(helper.make_node("Col2Im", ["x", "i", "b"], ["y"], **attrs), {"x": x}, ["y"], opset=18,
              initializers={"i": np.array(image, np.int64), "b": np.array(block, np.int64)})
    assert_matches(m, {"x": x}, rtol=1e-5, atol=1e-5)
    if rank == 2:
        assert_matches(m, {"x": x}, oracle=run_onnxruntime, rtol=1e-5, atol=1e-5)
