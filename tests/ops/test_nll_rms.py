"""NegativeLogLikelihoodLoss (forward vs onnxruntime and the ONNX reference evaluator, gradient vs finite
differences and torch's nll_loss) and RMSNormalization (opset 23: forward vs the reference evaluator, gradient
vs finite differences)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gradcheck import check_gradients
from onnx import helper
from oracle import assert_matches, model, run_edgetrain, run_onnxruntime, run_reference

from edgetrain.errors import InputError, ShapeError
from edgetrain.ir import Node, TensorType

pytestmark = pytest.mark.arm64   # also on the emulated arm64 stage (.ci/run, README "Platforms")


# --- NegativeLogLikelihoodLoss ----------------------------------------------------------------------------

def _nll_case(shape, dtype=np.float32, weights=False, ignore_index=None, seed=0):
    rng = np.random.default_rng(seed)
    n, c = shape[:2]
    target = rng.integers(0, c, (n,) + shape[2:]).astype(np.int64)
    if ignore_index is not None:
        target.reshape(-1)[::3] = ignore_index
    feeds = {"x": rng.standard_normal(shape).astype(dtype), "t": target}
    if weights:
        feeds["w"] = rng.uniform(0.2, 2.0, c).astype(dtype)
    return feeds


def _nll_node(reduction, weights, ignore_index, name="nll"):
    attrs = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    return helper.make_node("NegativeLogLikelihoodLoss", ["x", "t"] + (["w"] if weights else []), ["loss"],
                            name=name, **attrs)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weights", [False, True])
@pytest.mark.parametrize("ignore_index", [None, 1, -1])
@pytest.mark.parametrize("shape", [(6, 5), (3, 4, 2, 3)])
def test_nll_forward(reduction, weights, ignore_index, shape):
    feeds = _nll_case(shape, weights=weights, ignore_index=ignore_index)
    m = model(_nll_node(reduction, weights, ignore_index), feeds, ["loss"], opset=13)
    assert_matches(m, feeds, oracle=run_onnxruntime)
    if not (ignore_index == -1 and reduction == "mean" and not weights):
        # onnx 1.x's reference divides this mean by a count that includes the ignored samples (ORT, torch do not)
        assert_matches(m, feeds, oracle=run_reference)


@pytest.mark.parametrize("bad", [5, -2])
def test_nll_target_out_of_range_names_node_and_value(bad):
    feeds = _nll_case((3, 5), ignore_index=None)
    feeds["t"][1] = bad
    with pytest.raises(InputError, match=rf"'the_loss'.*input 1 \('t'\) holds {bad} at \[1\].*\[0, 5\)"):
        run_edgetrain(model(_nll_node("mean", False, -1, name="the_loss"), feeds, ["loss"]), feeds)


def test_nll_shape_checked():
    feeds = {"x": np.zeros((3, 4), np.float32), "t": np.zeros((4,), np.int64)}
    with pytest.raises(ShapeError, match="labels must have shape"):
        run_edgetrain(model(_nll_node("mean", False, None), feeds, ["loss"]), feeds)


def _nll_graph(reduction, weights, ignore_index):
    attrs = {"reduction": reduction} | ({"ignore_index": ignore_index} if ignore_index is not None else {})
    return Node("NegativeLogLikelihoodLoss", ["x", "t"] + (["w"] if weights else []), ["l"], attrs, "nll")


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weights,ignore_index", [(False, None), (True, 2)])
def test_nll_gradient_finite_differences(reduction, weights, ignore_index):
    shape = (4, 3, 2)
    feeds = _nll_case(shape, np.float64, weights, ignore_index, seed=3)
    loss_shape = (4, 2) if reduction == "none" else ()
    consts = {k: v for k, v in feeds.items() if k != "x"}
    check_gradients([_nll_graph(reduction, weights, ignore_index)], {"x": feeds["x"]}, ["l"],
                    [TensorType(np.float64, loss_shape)], consts=consts, opset=13, samples=12)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_nll_gradient_matches_torch(reduction):
    """The whole gradient at once against torch's nll_loss (finite differences above sample positions)."""
    from gradcheck import gradient_session
    shape = (5, 4, 3)
    feeds = _nll_case(shape, np.float64, True, 1, seed=4)
    consts = {k: v for k, v in feeds.items() if k != "x"}
    sess, graph = gradient_session([_nll_graph(reduction, True, 1)], {"x": feeds["x"]}, consts, ["l"],
                                   [TensorType(np.float64, ())], opset=13, seed=5)
    cot = float(graph.initializers["cot_0"])
    ours = sess.run(None, {"x": feeds["x"]})[1]
    x = torch.tensor(feeds["x"], requires_grad=True)
    loss = F.nll_loss(x, torch.tensor(feeds["t"]), weight=torch.tensor(feeds["w"]), ignore_index=1,
                      reduction=reduction) * cot
    loss.backward()
    np.testing.assert_allclose(ours, x.grad.numpy(), rtol=1e-10, atol=1e-12)


# --- RMSNormalization (opset 23; onnxruntime 1.19 lacks it) -------------------------------------------------

@pytest.mark.parametrize("shape,axis", [((3, 4), -1), ((2, 3, 5), 0), ((2, 3, 5), 1), ((2, 3, 5), -1)])
@pytest.mark.parametrize("epsilon", [None, 0.1])
def test_rms_norm_forward(shape, axis, epsilon):
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32),
             "s": rng.standard_normal(shape[axis % len(shape):]).astype(np.float32)}
    attrs = {"axis": axis} | ({"epsilon": epsilon} if epsilon is not None else {})
    m = model(helper.make_node("RMSNormalization", ["x", "s"], ["y"], **attrs), feeds, ["y"], opset=23)
    assert_matches(m, feeds, oracle=run_reference, rtol=1e-5, atol=1e-6)


def test_rms_norm_scale_shape_checked():
    feeds = {"x": np.ones((2, 3), np.float32), "s": np.ones(2, np.float32)}
    m = model(helper.make_node("RMSNormalization", ["x", "s"], ["y"], name="rms"), feeds, ["y"], opset=23)
    with pytest.raises(ShapeError, match="'rms'.*scale must be"):
        run_edgetrain(m, feeds)


@pytest.mark.parametrize("shape,axis", [((4, 6), -1), ((2, 3, 4), 1)])
def test_rms_norm_gradient_finite_differences(shape, axis):
    rng = np.random.default_rng(1)
    params = {"x": rng.standard_normal(shape), "s": rng.uniform(0.5, 1.5, shape[axis % len(shape):])}
    node = Node("RMSNormalization", ["x", "s"], ["y"], {"axis": axis, "epsilon": 1e-3}, "rms")
    check_gradients([node], params, ["y"], [TensorType(np.float64, shape)], opset=23, samples=8)
