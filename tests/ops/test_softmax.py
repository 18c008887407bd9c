"""Softmax, LogSoftmax and SoftmaxCrossEntropyLoss against onnxruntime and the ONNX reference evaluator."""
import numpy as np
import pytest
import torch
from onnx import helper
from oracle import assert_matches, model, run_edgetrain, run_onnxruntime, run_reference

from edgetrain.errors import InputError, ShapeError

pytestmark = pytest.mark.arm64   # also on the emulated arm64 stage (.ci/run, README "Platforms")

FLOATS = [np.float32, np.float64]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("axis", [None, -1, 0, 1, -2])
def test_softmax(op, dtype, axis):
    rng = np.random.default_rng(0)
    feeds = {"x": (rng.standard_normal((3, 5, 4)) * 4).astype(dtype)}
    attrs = {} if axis is None else {"axis": axis}
    m = model(helper.make_node(op, ["x"], ["y"], **attrs), feeds, ["y"], opset=13)
    assert_matches(m, feeds, oracle=run_onnxruntime)
    assert_matches(m, feeds, oracle=run_reference)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_large_values_and_1d(op):
    feeds = {"x": np.array([1000.0, 1001.0, -1000.0, 999.5, 0.0], np.float32)}
    m = model(helper.make_node(op, ["x"], ["y"]), feeds, ["y"], opset=17)
    ours = assert_matches(m, feeds, oracle=run_onnxruntime)
    assert np.all(np.isfinite(ours[0]))


def test_softmax_axis_out_of_range():
    x = np.zeros((2, 3), np.float32)
    m = model(helper.make_node("Softmax", ["x"], ["y"], axis=2), {"x": x}, ["y"])
    with pytest.raises(ShapeError, match="axis 2"):
        run_edgetrain(m, {"x": x})


# --- SoftmaxCrossEntropyLoss ------------------------------------------------------------------------------

def _sce_case(shape, dtype=np.float32, label_dtype=np.int64, weights=False, ignore_index=None, seed=0):
    rng = np.random.default_rng(seed)
    n, c = shape[:2]
    labels = rng.integers(0, c, (n,) + shape[2:]).astype(label_dtype)
    if ignore_index is not None:
        labels.reshape(-1)[::3] = ignore_index
    feeds = {"x": (rng.standard_normal(shape) * 2).astype(dtype), "labels": labels}
    if weights:
        feeds["w"] = rng.uniform(0.2, 2.0, c).astype(dtype)
    return feeds


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weights", [False, True])
@pytest.mark.parametrize("ignore_index", [None, 1, -100])
@pytest.mark.parametrize("shape", [(6, 5), (3, 4, 2, 3)])
def test_sce(reduction, weights, ignore_index, shape):
    feeds = _sce_case(shape, weights=weights, ignore_index=ignore_index)
    attrs = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    inputs = ["x", "labels"] + (["w"] if weights else [])
    node = helper.make_node("SoftmaxCrossEntropyLoss", inputs, ["loss", "log_prob"], **attrs)
    m = model(node, feeds, ["loss", "log_prob"], opset=13)
    assert_matches(m, feeds, oracle=run_onnxruntime)
    assert_matches(m, feeds, oracle=run_reference)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("label_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("shape", [(8, 10), (2, 3, 5)])
def test_sce_loss_only(dtype, label_dtype, shape):
    feeds = _sce_case(shape, dtype, label_dtype, weights=True, seed=1)
    node = helper.make_node("SoftmaxCrossEntropyLoss", ["x", "labels", "w"], ["loss"])
    m = model(node, feeds, ["loss"], opset=17)
    assert_matches(m, feeds, oracle=run_onnxruntime)


def test_sce_all_ignored_mean_is_nan():
    feeds = {"x": np.ones((2, 3), np.float32), "labels": np.array([2, 2], np.int64)}
    node = helper.make_node("SoftmaxCrossEntropyLoss", ["x", "labels"], ["loss"], ignore_index=2)
    (loss,) = run_edgetrain(model(node, feeds, ["loss"]), feeds)
    assert loss.shape == () and np.isnan(loss)


@pytest.mark.parametrize("bad", [4, -1])
def test_sce_label_out_of_range_raises(bad):
    feeds = {"x": np.zeros((3, 4), np.float32), "labels": np.array([0, bad, 2], np.int64)}
    node = helper.make_node("SoftmaxCrossEntropyLoss", ["x", "labels"], ["loss"], ignore_index=-100,
                            name="the_loss")
    with pytest.raises(InputError, match=rf"'the_loss'.*input 1 \('labels'\) holds {bad} at \[1\].*\[0, 4\)"):
        run_edgetrain(model(node, feeds, ["loss"]), feeds)


def test_sce_labels_shape_checked():
    feeds = {"x": np.zeros((3, 4), np.float32), "labels": np.zeros((4,), np.int64)}
    node = helper.make_node("SoftmaxCrossEntropyLoss", ["x", "labels"], ["loss"])
    with pytest.raises(ShapeError, match="labels must have shape"):
        run_edgetrain(model(node, feeds, ["loss"]), feeds)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [0, -1])
def test_softmax_of_a_constant_is_folded(op, axis):
    rng = np.random.default_rng(3)
    feeds = {"a": rng.standard_normal((3, 4)).astype(np.float32)}
    inits = {"c": rng.standard_normal((3, 4)).astype(np.float32)}
    nodes = [helper.make_node(op, ["c"], ["s"], axis=axis), helper.make_node("Add", ["a", "s"], ["y"])]
    assert_matches(model(nodes, feeds, ["y"], initializers=inits), feeds, oracle=run_onnxruntime)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_nan_stays_nan(op, axis):
    """A NaN poisons its own row (axis -1) or column (axis 0), as in onnxruntime, and nothing else."""
    x = np.array([[1.0, np.nan, 3.0], [1.0, 2.0, 3.0], [np.nan, 0.0, 1.0]], np.float32)
    (y,) = run_edgetrain(model(helper.make_node(op, ["x"], ["y"], axis=axis), {"x": x}, ["y"]), {"x": x})
    bad = np.isnan(x).any(axis=axis, keepdims=True)
    np.testing.assert_array_equal(np.isnan(y), np.broadcast_to(bad, x.shape))


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_sce_large_logits_match_onnxruntime_and_torch(reduction):
    """Logits far beyond exp's range (|x| ~ 1000): only a max-subtracted log-sum-exp stays finite.
    The label on the -5 logit makes the loss ~1005, the case where a missing max subtraction gives inf."""
    x = np.array([[1000.0, 999.0, -5.0], [-1000.0, 0.0, 1000.0], [3.0, 2.0, 1.0]], np.float32)
    labels = np.array([2, 0, 1], np.int64)
    feeds = {"x": x, "labels": labels}
    node = helper.make_node("SoftmaxCrossEntropyLoss", ["x", "labels"], ["loss", "log_prob"], reduction=reduction)
    ours = assert_matches(model(node, feeds, ["loss", "log_prob"], opset=13), feeds, oracle=run_onnxruntime)
    want = torch.nn.functional.cross_entropy(torch.tensor(x, dtype=torch.float64), torch.tensor(labels),
                                             reduction=reduction).numpy()
    np.testing.assert_allclose(ours[0], want, rtol=1e-6)
    np.testing.assert_allclose(ours[1], torch.log_softmax(torch.tensor(x, dtype=torch.float64), 1).numpy(),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("axis", [-1, 0, 1, 2])
def test_hardmax_against_onnxruntime(axis):
    """Ties (small integers) go to the first largest, as onnxruntime does."""
    x = np.random.default_rng(axis + 2).integers(-2, 3, (3, 4, 5)).astype(np.float32)
    m = model(helper.make_node("Hardmax", ["x"], ["y"], axis=axis), {"x": x}, ["y"], opset=13)
    assert_matches(m, {"x": x}, oracle=run_onnxruntime)


def test_hardmax_nan_is_the_largest_like_numpy_argmax():
    x = np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 5.0, 5.0, -1.0]], np.float32)
    m = model(helper.make_node("Hardmax", ["x"], ["y"]), {"x": x}, ["y"], opset=13)
    want = np.eye(4, dtype=np.float32)[np.argmax(x, axis=1)]
    np.testing.assert_array_equal(run_edgetrain(m, {"x": x})[0], want)


@pytest.mark.parametrize("axis", [None, 0, 2])
def test_hardmax_11_coerces_to_2d_like_onnxruntime(axis):
    """Before opset 13 Hardmax is taken over the input flattened to 2-D at axis (default 1): the load rule
    Softmax-1..12 uses."""
    x = np.random.default_rng(5).standard_normal((2, 3, 4)).astype(np.float32)
    attrs = {} if axis is None else {"axis": axis}
    m = model(helper.make_node("Hardmax", ["x"], ["y"], **attrs), {"x": x}, ["y"], opset=11)
    assert_matches(m, {"x": x}, oracle=run_onnxruntime)
