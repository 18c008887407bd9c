"""GatherND and ScatterND: forward against onnxruntime (batch_dims, partial and full index tuples, negative
indices, every ScatterND reduction), gradients (GatherNDGrad, ScatterND's none/add rules) by finite
differences and against torch's advanced-indexing autograd; an index out of range is an InputError."""
import numpy as np
import pytest
from onnx import helper
from oracle import assert_matches, model, run_edgetrain, run_onnxruntime

from edgetrain.errors import InputError
from edgetrain.ir import Node, TensorType

# data shape, indices (int64), batch_dims
GATHER = {
    "full_tuples": ((3, 4), [[0, 1], [2, 3], [-1, 0]], 0),
    "rows": ((3, 4, 2), [[1], [0], [1]], 0),
    "pairs_of_slices": ((3, 4, 2), [[[0, 1]], [[2, -2]]], 0),
    "batch_dims_1": ((2, 3, 4), [[[1], [2]], [[0], [0]]], 1),
    "batch_dims_1_full": ((2, 3, 4), [[1, 3], [0, -1]], 1),
}


def _gather_case(name, dtype=np.float32):
    shape, idx, b = GATHER[name]
    x = np.random.default_rng(len(name)).standard_normal(shape).astype(dtype)
    return x, np.array(idx, np.int64), b


@pytest.mark.parametrize("name", list(GATHER))
def test_gather_nd_against_onnxruntime(name):
    x, idx, b = _gather_case(name)
    m = model(helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=b), {"x": x, "i": idx}, ["y"])
    assert_matches(m, {"x": x, "i": idx}, oracle=run_onnxruntime)


@pytest.mark.parametrize("name", list(GATHER))
def test_gather_nd_gradient_by_finite_differences(name):
    from gradcheck import check_gradients
    x, idx, b = _gather_case(name, np.float64)
    ref = run_onnxruntime(model(helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=b),
                                {"x": x, "i": idx}, ["y"]), {"x": x, "i": idx})[0]
    check_gradients([Node("GatherND", ["x", "i"], ["y"], {"batch_dims": b}, "g")], {"x": x}, ["y"],
                    [TensorType(np.float64, ref.shape)], consts={"i": idx}, samples=8)


def test_gather_nd_gradient_adds_repeated_tuples_like_torch():
    import torch
    from gradcheck import gradient_session
    x = np.random.default_rng(1).standard_normal((4, 3))
    idx = np.array([[1, 2], [1, 2], [3, 0], [-3, 2]], np.int64)
    sess, graph = gradient_session([Node("GatherND", ["x", "i"], ["y"], {}, "g")], {"x": x}, {"i": idx},
                                   ["y"], [TensorType(np.float64, (4,))])
    dx = sess.run(None, {"x": x})[1]
    t = torch.from_numpy(x).requires_grad_()
    (t[tuple(torch.from_numpy(idx).T)] * torch.from_numpy(graph.initializers["cot_0"])).sum().backward()
    np.testing.assert_allclose(dx, t.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_against_onnxruntime(reduction):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3, 2)).astype(np.float32)
    idx = np.array([[0], [2], [-1]], np.int64) if reduction == "none" else np.array([[0], [2], [0]], np.int64)
    upd = rng.standard_normal((3, 3, 2)).astype(np.float32)
    m = model(helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction),
              {"x": x, "i": idx, "u": upd}, ["y"], opset=18)
    assert_matches(m, {"x": x, "i": idx, "u": upd}, oracle=run_onnxruntime)
    pairs = np.array([[1, 2], [3, 0]], np.int64)
    upd2 = rng.standard_normal((2, 2)).astype(np.float32)
    m2 = model(helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction),
               {"x": x, "i": pairs, "u": upd2}, ["y"], opset=18)
    assert_matches(m2, {"x": x, "i": pairs, "u": upd2}, oracle=run_onnxruntime)


@pytest.mark.parametrize("reduction,idx", [("none", [[1, 0], [3, 2]]), ("add", [[1, 0], [1, 0], [2, 1]])])
def test_scatter_nd_gradients_by_finite_differences(reduction, idx):
    from gradcheck import check_gradients
    rng = np.random.default_rng(5)
    idx = np.array(idx, np.int64)
    params = {"x": rng.standard_normal((4, 3, 2)), "u": rng.standard_normal((len(idx), 2))}
    check_gradients([Node("ScatterND", ["x", "i", "u"], ["y"], {"reduction": reduction}, "s")], params, ["y"],
                    [TensorType(np.float64, (4, 3, 2))], consts={"i": idx}, opset=18, samples=8)


def test_out_of_range_index_is_refused():
    x = np.zeros((3, 4), np.float32)
    feeds = {"x": x, "i": np.zeros((2, 2), np.int64)}
    m = model(helper.make_node("GatherND", ["x", "i"], ["y"]), feeds, ["y"])
    with pytest.raises(InputError, match="holds 4 at \\[1, 1\\]"):
        run_edgetrain(m, {"x": x, "i": np.array([[0, 1], [2, 4]], np.int64)})
    upd = np.zeros(2, np.float32)
    s = model(helper.make_node("ScatterND", ["x", "i", "u"], ["y"]), {"x": x, "i": np.zeros((2, 2), np.int64),
                                                                       "u": upd}, ["y"], opset=18)
    with pytest.raises(InputError, match="holds -4"):
        run_edgetrain(s, {"x": x, "i": np.array([[-4, 1], [2, 0]], np.int64), "u": upd})
