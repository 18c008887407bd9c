"""Conv against onnxruntime (float32) and the ONNX reference evaluator (float64; ORT has no double Conv).

Covers 1-D and 2-D, strides, (asymmetric) pads, dilations, auto_pad, groups, depthwise, pointwise, bias
present or absent, weights as initializers (bias split off by lowering), weights fed at run time (nothing
folded), and an all-constant Conv (folded when planning by running the launcher, bias included).
"""
import zlib

import numpy as np
import pytest
from onnx import helper

import edgetrain
from edgetrain.errors import ShapeError
from oracle import assert_matches, model, run_onnxruntime, run_reference

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
