"""MaxPool (with Indices), AveragePool, GlobalAveragePool and GlobalMaxPool against onnxruntime and the ONNX
reference evaluator: 1-D and 2-D, strides, (asymmetric) pads, dilations, auto_pad, ceil_mode,
count_include_pad, storage_order, float64, and pools folded when planning.
"""
import zlib

import numpy as np
import pytest
from onnx import helper

import edgetrain
from edgetrain.errors import ShapeError
from oracle import assert_matches, model, run_onnxruntime, run_reference

MAX_CASES = {
    "2x2_s2": ((2, 3, 8, 8), dict(kernel_shape=[2, 2], strides=[2, 2])),
    "3x3_s1_pad1": ((2, 3, 7, 6), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
    "asym_pads": ((2, 3, 7, 8), dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 2, 1])),
    "no_strides": ((1, 2, 5, 6), dict(kernel_shape=[2, 3])),
    "stride3": ((2, 2, 10, 11), dict(kernel_shape=[3, 3], strides=[3, 3], pads=[1, 2, 1, 0])),
    "dilations": ((2, 3, 9, 8), dict(kernel_shape=[2, 2], strides=[1, 2], dilations=[2, 2],
                                     pads=[1, 1, 0, 1])),
    "ceil_mode": ((2, 3, 7, 8), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    "ceil_mode_pads": ((1, 3, 8, 9), dict(kernel_shape=[3, 2], strides=[3, 2], pads=[1, 1, 1, 0],
                                          ceil_mode=1)),
    "ceil_mode_dilations": ((1, 2, 10, 9), dict(kernel_shape=[2, 2], strides=[2, 2], dilations=[2, 1],
                                                ceil_mode=1)),
    "same_upper": ((2, 3, 7, 8), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    "same_lower": ((2, 3, 7, 8), dict(kernel_shape=[2, 3], strides=[2, 2], auto_pad="SAME_LOWER")),
    "valid": ((2, 3, 7, 8), dict(kernel_shape=[2, 3], strides=[2, 2], auto_pad="VALID")),
    "storage_order_1": ((2, 3, 7, 8), dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1],
                                           storage_order=1)),
    "1d": ((2, 3, 9), dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    "1d_ceil_dilated": ((2, 3, 12), dict(kernel_shape=[2], strides=[3], dilations=[2], ceil_mode=1)),
    "1d_same_upper": ((2, 3, 10), dict(kernel_shape=[4], strides=[3], auto_pad="SAME_UPPER")),
}

AVG_CASES = {
    "2x2_s2": ((2, 3, 8, 8), dict(kernel_shape=[2, 2], strides=[2, 2])),
    "pads": ((2, 3, 7, 8), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    "asym_pads_ceil": ((2, 3, 7, 8), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 2, 1],
                                          ceil_mode=1)),
    "ceil_no_pads": ((2, 3, 8, 8), dict(kernel_shape=[3, 3], strides=[3, 3], ceil_mode=1)),
    "dilations": ((2, 3, 9, 9), dict(kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 1, 1, 1])),
    "same_upper": ((2, 3, 7, 8), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    "same_lower": ((2, 3, 7, 8), dict(kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_LOWER")),
    "valid": ((1, 2, 7, 8), dict(kernel_shape=[3, 2], strides=[2, 3], auto_pad="VALID")),
    "1d_pads": ((2, 3, 9), dict(kernel_shape=[3], strides=[2], pads=[1, 2])),
    "1d_ceil": ((2, 3, 10), dict(kernel_shape=[3], strides=[2], pads=[1, 1], ceil_mode=1)),
}


def _seed(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32("/".join(map(str, key)).encode()))


def _pool_model(op, x, attrs, outputs=("Y",), opset=19):
    return model(helper.make_node(op, ["X"], list(outputs), **attrs), {"X": x}, list(outputs), opset=opset)


@pytest.mark.parametrize("ties", [False, True], ids=["random", "ties"])
@pytest.mark.parametrize("case", list(MAX_CASES))
def test_max_pool_with_indices(case, ties):
    """Values and Indices against onnxruntime; with ties the first maximum in window order must win."""
    shape, attrs = MAX_CASES[case]
    rng = _seed(case, ties)
    x = (rng.integers(0, 3, shape) if ties else rng.standard_normal(shape)).astype(np.float32)
    assert_matches(_pool_model("MaxPool", x, attrs, ("Y", "I")), {"X": x}, oracle=run_onnxruntime)


@pytest.mark.parametrize("case", ["2x2_s2", "asym_pads", "dilations", "ceil_mode", "1d", "valid"])
def test_max_pool_values_only(case):
    shape, attrs = MAX_CASES[case]
    x = _seed(case).standard_normal(shape).astype(np.float32)
    m = _pool_model("MaxPool", x, attrs, opset=17)
    assert_matches(m, {"X": x}, oracle=run_onnxruntime)
    assert_matches(m, {"X": x}, oracle=run_reference)


@pytest.mark.parametrize("case", ["3x3_s1_pad1", "stride3", "ceil_mode_pads", "1d_ceil_dilated"])
def test_max_pool_float64(case):
    shape, attrs = MAX_CASES[case]
    x = _seed(case, "f64").standard_normal(shape)
    assert_matches(_pool_model("MaxPool", x, attrs, ("Y", "I")), {"X": x}, oracle=run_onnxruntime)


def test_max_pool_indices_only_second_output_empty():
    """An omitted Indices output ("") runs the values-only path."""
    x = _seed("empty").standard_normal((2, 3, 6, 6)).astype(np.float32)
    node = helper.make_node("MaxPool", ["X"], ["Y", ""], kernel_shape=[2, 2], strides=[2, 2])
    m = model(node, {"X": x}, ["Y"])
    assert_matches(m, {"X": x}, oracle=run_onnxruntime)


@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("case", list(AVG_CASES))
def test_average_pool(case, include_pad):
    shape, attrs = AVG_CASES[case]
    x = _seed(case, include_pad).standard_normal(shape).astype(np.float32)
    m = _pool_model("AveragePool", x, dict(attrs, count_include_pad=include_pad))
    assert_matches(m, {"X": x}, oracle=run_onnxruntime)
    assert_matches(m, {"X": x}, oracle=run_reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["pads", "asym_pads_ceil", "dilations", "1d_pads"])
def test_average_pool_float64(case):
    shape, attrs = AVG_CASES[case]
    x = _seed(case, "f64").standard_normal(shape)
    m = _pool_model("AveragePool", x, dict(attrs, count_include_pad=1))
    assert_matches(m, {"X": x}, oracle=run_reference, rtol=1e-12, atol=1e-12)


def test_average_pool_opset11():
    """AveragePool-11 (no dilations attribute) runs the same kernel."""
    x = _seed("avg11").standard_normal((2, 3, 7, 8)).astype(np.float32)
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, pads=[0, 1, 1, 0])
    m = _pool_model("AveragePool", x, attrs, opset=17)
    assert_matches(m, {"X": x}, oracle=run_onnxruntime)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 3, 7, 8), (2, 3, 1, 1), (1, 2, 3, 4, 2)])
def test_global_pools(op, shape, dtype):
    x = _seed(op, shape, dtype).standard_normal(shape).astype(dtype)
    m = _pool_model(op, x, {}, opset=17)
    if dtype == np.float32:
        assert_matches(m, {"X": x}, oracle=run_onnxruntime)
    # the reference evaluator's GlobalMaxPool mis-shapes 3-D spatial inputs; numpy is the oracle there
    want = (x.mean if op == "GlobalAveragePool" else x.max)(axis=tuple(range(2, x.ndim)), keepdims=True)
    ours = edgetrain.InferenceSession(m.SerializeToString()).run(None, {"X": x})[0]
    assert ours.dtype == x.dtype and ours.shape == want.shape
    np.testing.assert_allclose(ours, want, rtol=1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pools_folded(dtype):
    """Pools of constants are folded when planning, through the launchers (MaxPool with Indices)."""
    rng = _seed("fold", dtype)
    c = rng.standard_normal((2, 3, 7, 8)).astype(dtype)
    z = rng.standard_normal(1).astype(dtype)
    nodes = [helper.make_node("MaxPool", ["C"], ["M", "I"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["M"], ["A"], kernel_shape=[2, 2], ceil_mode=1,
                              count_include_pad=1),
             helper.make_node("GlobalMaxPool", ["A"], ["G"]),
             helper.make_node("GlobalAveragePool", ["M"], ["H"]),
             helper.make_node("Add", ["G", "Z"], ["Y1"]), helper.make_node("Add", ["H", "Z"], ["Y2"])]
    m = model(nodes, {"Z": z}, ["Y1", "Y2", "I"], {"C": c}, opset=19)
    sess = edgetrain.InferenceSession(m.SerializeToString())
    kinds = {b.node.op_type for s in sess.program({"Z": z}).plan.steps for b in s.nodes}
    assert not kinds & {"MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool"}, kinds
    assert_matches(m, {"Z": z}, oracle=run_reference, rtol=1e-6, atol=1e-6)


def test_max_pool_reruns_overwrite():
    rng = _seed("rerun")
    x = rng.standard_normal((2, 3, 7, 8)).astype(np.float32)
    m = _pool_model("MaxPool", x, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), ("Y", "I"))
    sess = edgetrain.InferenceSession(m.SerializeToString())
    for _ in range(2):
        x = rng.standard_normal(x.shape).astype(np.float32)
        for ours, want in zip(sess.run(None, {"X": x}), run_onnxruntime(m, {"X": x})):
            np.testing.assert_array_equal(ours, want)


@pytest.mark.parametrize("op, attrs, match", [
    ("MaxPool", dict(), "kernel_shape"),
    ("MaxPool", dict(kernel_shape=[2]), "kernel_shape"),
    ("MaxPool", dict(kernel_shape=[2, 2], pads=[2, 0, 0, 0]), "smaller than"),
    ("MaxPool", dict(kernel_shape=[2, 2], storage_order=2), "storage_order"),
    ("MaxPool", dict(kernel_shape=[9, 9]), "does not fit"),
    ("AveragePool", dict(kernel_shape=[2, 2], auto_pad="BOTH"), "auto_pad"),
    ("AveragePool", dict(kernel_shape=[2, 2], dilations=[1]), "dilations"),
])
def test_pool_errors_name_the_node(op, attrs, match):
    x = np.zeros((1, 2, 5, 5), np.float32)
    m = model(helper.make_node(op, ["X"], ["Y"], name="pool_3", **attrs), {"X": x}, ["Y"], opset=19)
    with pytest.raises(ShapeError, match=match) as err:
        edgetrain.InferenceSession(m.SerializeToString()).run(None, {"X": x})
    assert "pool_3" in str(err.value)


def test_global_pool_needs_spatial_dims():
    x = np.zeros((2, 3), np.float32)
    m = model(helper.make_node("GlobalAveragePool", ["X"], ["Y"]), {"X": x}, ["Y"])
    with pytest.raises(ShapeError, match="rank >= 3"):
        edgetrain.InferenceSession(m.SerializeToString()).run(None, {"X": x})
