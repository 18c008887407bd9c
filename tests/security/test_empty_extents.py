"""Issue 11, item 3 (first half): empty extents follow ONNX (NaN for a mean of nothing, or a clear refusal where
ONNX's answer is itself an error), and no output is ever left holding arena memory.

Every run here gets an arena pre-filled with a finite garbage pattern (a fresh arena is zero pages, which would
hide an output the kernel never wrote). Oracles: the ONNX reference evaluator, onnxruntime, and numpy's own
reductions over nothing (sum 0, mean NaN) where neither has the op.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from oracle import model, run_edgetrain, run_onnxruntime, run_reference

from edgetrain.errors import ShapeError
from edgetrain.runtime import program

pytestmark = [pytest.mark.arm64, pytest.mark.filterwarnings("ignore::RuntimeWarning")]  # numpy: mean of empty

MS = "com.microsoft"
GARBAGE = 0x5A   # float32 0x5A5A5A5A = 1.5e16: finite, so neither NaN nor 0 can come from it by accident


@pytest.fixture(autouse=True)
def dirty_arena(monkeypatch):
    real = program.aligned_empty

    def dirty(nbytes: int, align: int = 64) -> np.ndarray:
        arena = real(nbytes, align)
        arena.fill(GARBAGE)
        return arena
    monkeypatch.setattr(program, "aligned_empty", dirty)


def _same(ours, want):
    assert len(ours) == len(want)
    for k, (a, b) in enumerate(zip(ours, want)):
        b = np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype, f"output {k}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        np.testing.assert_allclose(a, b, rtol=1e-6, equal_nan=True, err_msg=f"output {k}")


def _params(c: int) -> dict[str, np.ndarray]:
    return {"scale": np.full(c, 2.0, np.float32), "bias": np.full(c, 0.5, np.float32),
            "mean": np.full(c, 5.0, np.float32), "var": np.full(c, 3.0, np.float32)}


# --- normalization --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(0, 3, 4), (2, 3, 0), (0, 3), (2, 3, 0, 5)])
def test_batch_norm_training_on_an_empty_batch_is_nan(shape):
    """The issue's case: running mean/var came back as arena garbage (and flowed into the parameters)."""
    feeds = {"x": np.zeros(shape, np.float32)}
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y", "rm", "rv"],
                            training_mode=1, momentum=0.8)
    m = model(node, feeds, ["y", "rm", "rv"], initializers=_params(3), opset=15)
    ours = run_edgetrain(m, feeds)
    assert np.isnan(ours[1]).all() and np.isnan(ours[2]).all()
    _same(ours, run_reference(m, feeds))
    _same(ours, run_onnxruntime(m, feeds))


@pytest.mark.parametrize("shape", [(0, 3, 4), (2, 3, 0)])
def test_batch_norm_internal_on_an_empty_batch_is_nan(shape):
    """onnxruntime's training form also outputs the batch's saved mean and 1 / sqrt(var + eps); neither oracle
    runs it, so numpy's statistics of the empty batch are the answer (NaN)."""
    x = np.zeros(shape, np.float32)
    p = _params(3)
    node = helper.make_node("BatchNormInternal", ["x", "scale", "bias", "mean", "var"],
                            ["y", "rm", "rv", "sm", "si"], domain=MS, momentum=0.8)
    ours = run_edgetrain(model(node, {"x": x}, ["y", "rm", "rv", "sm", "si"], initializers=p), {"x": x})
    batch_mean, batch_var = x.mean(axis=(0, 2)), x.var(axis=(0, 2))
    want = [x, p["mean"] * 0.8 + batch_mean * 0.2, p["var"] * 0.8 + batch_var * 0.2, batch_mean,
            1 / np.sqrt(batch_var + 1e-5)]
    _same(ours, want)


@pytest.mark.parametrize("shape, axis", [((2, 0), 1), ((2, 3, 0), -1), ((2, 0, 4), 1), ((3, 0), -1)])
def test_layer_norm_over_an_empty_axis_is_nan(shape, axis):
    """Mean and InvStdDev of no elements: NaN, as the ONNX reference gives (onnxruntime refuses the shape)."""
    feeds = {"x": np.zeros(shape, np.float32)}
    norm = shape[axis:]
    node = helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y", "mean", "inv"], axis=axis)
    m = model(node, feeds, ["y", "mean", "inv"], opset=17,
              initializers={"scale": np.ones(norm, np.float32), "bias": np.zeros(norm, np.float32)})
    ours = run_edgetrain(m, feeds)
    assert ours[1].size and np.isnan(ours[1]).all() and np.isnan(ours[2]).all()
    _same(ours, run_reference(m, feeds))


def test_group_norm_over_an_empty_extent_is_empty():
    """Y has no elements and the op no statistics outputs (the ONNX reference itself fails on this shape)."""
    feeds = {"x": np.zeros((2, 4, 0), np.float32)}
    node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=2)
    m = model(node, feeds, ["y"], opset=18,
              initializers={"scale": np.ones(2, np.float32), "bias": np.zeros(2, np.float32)})
    _same(run_edgetrain(m, feeds), [feeds["x"]])


def test_instance_norm_over_an_empty_extent_is_empty():
    feeds = {"x": np.zeros((2, 3, 0), np.float32)}
    node = helper.make_node("InstanceNormalization", ["x", "scale", "bias"], ["y"])
    m = model(node, feeds, ["y"], initializers={k: v for k, v in _params(3).items() if k in ("scale", "bias")})
    _same(run_edgetrain(m, feeds), run_reference(m, feeds))


# --- pooling --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3, 0), (1, 2, 0, 4), (1, 2, 3, 0, 2)])
def test_global_average_pool_over_an_empty_extent_is_nan(shape):
    """It raised ZeroDivisionError; a mean of nothing is NaN (the ONNX reference; onnxruntime refuses)."""
    feeds = {"x": np.zeros(shape, np.float32)}
    m = model(helper.make_node("GlobalAveragePool", ["x"], ["y"]), feeds, ["y"])
    ours = run_edgetrain(m, feeds)
    assert np.isnan(ours[0]).all()
    _same(ours, run_reference(m, feeds))


def test_global_max_pool_over_an_empty_extent_is_refused_when_planning():
    """No maximum exists: the ONNX reference and onnxruntime both fail; edgetrain refuses it by name (it read
    one element past the row)."""
    feeds = {"x": np.zeros((2, 3, 0), np.float32)}
    node = helper.make_node("GlobalMaxPool", ["x"], ["y"], name="gmp")
    m = model(node, feeds, ["y"])
    with pytest.raises(ValueError, match="zero-size array"):
        run_reference(m, feeds)
    with pytest.raises(Exception, match="Invalid input shape"):   # onnxruntime's Fail
        run_onnxruntime(m, feeds)
    with pytest.raises(ShapeError, match=r"'gmp'.*empty spatial extent"):
        run_edgetrain(m, feeds)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pools_of_an_empty_batch_are_empty(op):
    feeds = {"x": np.zeros((0, 3, 2), np.float32)}
    m = model(helper.make_node(op, ["x"], ["y"]), feeds, ["y"])
    _same(run_edgetrain(m, feeds), run_onnxruntime(m, feeds))


# --- reductions and softmax -----------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("shape, axes", [((2, 0, 3), [1]), ((2, 0), None), ((0, 3, 2), [0, 2]), ((2, 3, 0), [0, 2])])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions_over_nothing_follow_the_reference(op, shape, axes, keepdims):
    """Sum 0, mean NaN, max -inf, min +inf (the ONNX reference; onnxruntime gives 0 for the mean)."""
    feeds = {"x": np.zeros(shape, np.float32)}
    inputs = ["x"] + (["axes"] if axes is not None else [])
    m = model(helper.make_node(op, inputs, ["y"], keepdims=keepdims), feeds, ["y"], opset=18,
              initializers={"axes": np.array(axes, np.int64)} if axes is not None else None)
    _same(run_edgetrain(m, feeds), run_reference(m, feeds))


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape, axis", [((2, 0), -1), ((2, 0, 3), 1), ((0, 4), 1)])
def test_softmax_over_an_empty_axis_is_empty(op, shape, axis):
    feeds = {"x": np.zeros(shape, np.float32)}
    m = model(helper.make_node(op, ["x"], ["y"], axis=axis), feeds, ["y"])
    _same(run_edgetrain(m, feeds), run_reference(m, feeds))


# --- losses ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("reduction, want", [("mean", np.nan), ("sum", 0.0)])
def test_cross_entropy_of_an_empty_batch(reduction, want):
    """Mean over no samples is 0 / 0 = NaN, the sum is 0 (both oracles fail on the empty reshape)."""
    feeds = {"x": np.zeros((0, 3), np.float32), "labels": np.zeros(0, np.int64)}
    node = helper.make_node("SoftmaxCrossEntropyLoss", ["x", "labels"], ["loss", "log_prob"], reduction=reduction)
    loss, log_prob = run_edgetrain(model(node, feeds, ["loss", "log_prob"], opset=13), feeds)
    _same([loss, log_prob], [np.array(want, np.float32), np.zeros((0, 3), np.float32)])


def _sce_grad(feeds, reduction, **attrs):
    inputs = ["dy", "log_prob", "labels"] + (["w"] if "w" in feeds else [])
    node = helper.make_node("SoftmaxCrossEntropyLossGrad", inputs, ["dx"], domain=MS, reduction=reduction, **attrs)
    return run_edgetrain(model(node, feeds, ["dx"]), feeds)[0]


def test_cross_entropy_grad_with_every_label_ignored_is_zero():
    lp = np.log(np.full((4, 3), 1 / 3, np.float32))
    feeds = {"dy": np.ones((), np.float32), "log_prob": lp, "labels": np.full(4, -100, np.int64)}
    _same([_sce_grad(feeds, "mean", ignore_index=-100)], [np.zeros_like(lp)])


@pytest.mark.parametrize("w", [[0, 0, 1], [1, -1, 2]])
def test_cross_entropy_with_weights_summing_to_zero(w):
    """mean divides by the sum of the samples' weights: x / 0 is NaN or inf as in numpy (the gradient raised
    Numba's ZeroDivisionError; the forward gave NaN for any x)."""
    labels, w = np.array([0, 1, 1, 0], np.int64), np.array(w, np.float32)
    x = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)
    feeds = {"x": x, "labels": labels, "w": w}
    node = helper.make_node("SoftmaxCrossEntropyLoss", ["x", "labels", "w"], ["loss", "log_prob"])
    m = model(node, feeds, ["loss", "log_prob"], opset=13)
    loss, lp = run_edgetrain(m, feeds)
    _same([loss, lp], run_reference(m, feeds))
    grad = (np.exp(lp) - np.eye(3, dtype=np.float32)[labels]) * w[labels][:, None] / w[labels].sum()
    feeds = {"dy": np.ones((), np.float32), "log_prob": lp, "labels": labels, "w": w}
    _same([_sce_grad(feeds, "mean")], [grad])


def test_cross_entropy_grad_of_an_empty_batch_is_empty():
    feeds = {"dy": np.ones((), np.float32), "log_prob": np.zeros((0, 3), np.float32),
             "labels": np.zeros(0, np.int64)}
    _same([_sce_grad(feeds, "mean")], [np.zeros((0, 3), np.float32)])


# --- products and gradient ops over an empty batch: the parameters' gradients are sums of nothing ------------

def test_matmul_with_an_empty_inner_dim_is_zero():
    """[2, 3, 0] @ [0, 4] flattened as rows: reshape(-1, 0) raised ValueError."""
    feeds = {"a": np.zeros((2, 3, 0), np.float32), "b": np.zeros((0, 4), np.float32)}
    m = model(helper.make_node("MatMul", ["a", "b"], ["y"]), feeds, ["y"])
    _same(run_edgetrain(m, feeds), run_onnxruntime(m, feeds))


def _run_ms(op, inputs, outputs, feeds, inits, **attrs):
    node = helper.make_node(op, inputs, outputs, domain=MS, **attrs)
    return run_edgetrain(model(node, feeds, outputs, initializers=inits), feeds)


def test_batch_norm_grad_of_an_empty_batch():
    feeds = {"dy": np.zeros((0, 3, 2), np.float32), "x": np.zeros((0, 3, 2), np.float32)}
    inits = {"scale": np.ones(3, np.float32), "m": np.ones(3, np.float32), "inv": np.ones(3, np.float32)}
    ours = _run_ms("BatchNormalizationGrad", ["dy", "x", "scale", "m", "inv"], ["dx", "ds", "db"], feeds, inits)
    _same(ours, [feeds["x"], feeds["dy"].sum(axis=(0, 2)), feeds["dy"].sum(axis=(0, 2))])


def test_layer_norm_grad_of_no_rows():
    feeds = {"dy": np.zeros((0, 3), np.float32), "x": np.zeros((0, 3), np.float32)}
    inits = {"scale": np.ones(3, np.float32), "m": np.ones((0, 1), np.float32), "inv": np.ones((0, 1), np.float32)}
    ours = _run_ms("LayerNormalizationGrad", ["dy", "x", "scale", "m", "inv"], ["dx", "ds", "db"], feeds, inits,
                   axis=1)
    _same(ours, [feeds["x"], feeds["dy"].sum(axis=0), feeds["dy"].sum(axis=0)])


@pytest.mark.parametrize("group", [1, 2])   # im2col + GEMM (one over the batch: 4 output pixels), and depthwise
def test_conv_of_an_empty_batch(group):       # loops over the batch's stacked planes
    feeds = {"x": np.zeros((0, 2, 3, 3), np.float32)}
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[2, 2], group=group)
    m = model(node, feeds, ["y"], initializers={"w": np.ones((2, 2 // group, 2, 2), np.float32)})
    _same(run_edgetrain(m, feeds), run_onnxruntime(m, feeds))


@pytest.mark.parametrize("group", [1, 2])   # im2col + GEMM, and the direct (depthwise) loops
def test_conv_grad_of_an_empty_batch(group):
    feeds = {"dy": np.zeros((0, 2, 2, 2), np.float32), "x": np.zeros((0, 2, 3, 3), np.float32)}
    w = np.ones((2, 2 // group, 2, 2), np.float32)
    ours = _run_ms("ConvGrad", ["dy", "x", "w"], ["dx", "dw", "db"], feeds, {"w": w}, kernel_shape=[2, 2],
                   pads=[0, 0, 0, 0], strides=[1, 1], dilations=[1, 1], group=group)
    _same(ours, [feeds["x"], np.zeros_like(w), feeds["dy"].sum(axis=(0, 2, 3))])


def test_gather_grad_of_no_indices():
    feeds = {"idx": np.zeros(0, np.int64), "dy": np.zeros((0, 2), np.float32)}
    ours = _run_ms("GatherGrad", ["shape", "idx", "dy"], ["dx"], feeds, {"shape": np.array([3, 2], np.int64)})
    _same(ours, [np.zeros((3, 2), np.float32)])
