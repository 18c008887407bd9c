"""ReduceSum, ReduceMean, ReduceMax, ReduceMin against onnxruntime and the ONNX reference evaluator."""
import numpy as np
import pytest
from onnx import helper
from oracle import assert_matches, model, run_edgetrain, run_onnxruntime, run_reference

from edgetrain.errors import ShapeError

pytestmark = pytest.mark.arm64   # also on the emulated arm64 stage (.ci/run, README "Platforms")

OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"]
AXES = [(1,), (-1,), (0, 2), (2, 0, 1), (-2, 3)]


def _node(op, opset, axes, **attrs):
    """Axes as an attribute where the opset says so (ReduceSum < 13, the others < 18), else as an input."""
    inits = {}
    inputs = ["x"]
    attr_opset = 13 if op == "ReduceSum" else 18
    if axes is not None:
        if opset < attr_opset:
            attrs["axes"] = list(axes)
        else:
            inputs.append("axes")
            inits["axes"] = np.array(axes, np.int64)
    return helper.make_node(op, inputs, ["y"], **attrs), inits


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce(op, opset, axes, keepdims):
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((3, 4, 2, 5)).astype(np.float32)}
    node, inits = _node(op, opset, axes, keepdims=keepdims)
    m = model(node, feeds, ["y"], initializers=inits, opset=opset)
    assert_matches(m, feeds, oracle=run_onnxruntime)
    assert_matches(m, feeds, oracle=run_reference)


@pytest.mark.parametrize("op,dtype", [(op, dt) for op in OPS for dt in (np.float64, np.int32, np.int64)
                                      if op != "ReduceMean" or dt == np.float64])   # ReduceMean: floats only
@pytest.mark.parametrize("axes", [(0, 2), (1,), (2,)])
def test_reduce_dtypes(op, dtype, axes):
    rng = np.random.default_rng(1)
    feeds = {"x": (rng.standard_normal((4, 3, 6)) * 10).astype(dtype)}
    node, inits = _node(op, 18, axes, keepdims=0)
    assert_matches(model(node, feeds, ["y"], initializers=inits, opset=18), feeds, oracle=run_onnxruntime)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("empty_axes_input", [False, True])
def test_reduce_all_axes_when_none_given(op, keepdims, empty_axes_input):
    feeds = {"x": np.random.default_rng(2).standard_normal((3, 4, 5)).astype(np.float32)}
    inputs, inits = ["x"], {}
    if empty_axes_input:
        inputs.append("axes")
        inits["axes"] = np.zeros(0, np.int64)
    m = model(helper.make_node(op, inputs, ["y"], keepdims=keepdims), feeds, ["y"], initializers=inits, opset=18)
    assert_matches(m, feeds, oracle=run_onnxruntime)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("empty_axes_input", [False, True])
def test_reduce_noop_with_empty_axes(op, empty_axes_input):
    feeds = {"x": np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)}
    inputs, inits = ["x"], {}
    if empty_axes_input:
        inputs.append("axes")
        inits["axes"] = np.zeros(0, np.int64)
    m = model(helper.make_node(op, inputs, ["y"], noop_with_empty_axes=1), feeds, ["y"], initializers=inits,
              opset=18)
    ours = assert_matches(m, feeds, oracle=run_onnxruntime)
    np.testing.assert_array_equal(ours[0], feeds["x"])


def test_reduce_mean_large_rows_float32():
    """A long float32 row still matches to ~1e-5 relative (numpy sums it pairwise)."""
    x = np.random.default_rng(4).uniform(0.5, 1.5, (4, 20000)).astype(np.float32)
    m = model(helper.make_node("ReduceMean", ["x"], ["y"], axes=[1]), {"x": x}, ["y"], opset=13)
    assert_matches(m, {"x": x}, oracle=run_onnxruntime)


@pytest.mark.parametrize("op,np_op", [("ReduceMax", np.max), ("ReduceMin", np.min)])
@pytest.mark.parametrize("axes", [(0,), (1,), (2,), (0, 2)])
def test_reduce_max_min_propagate_nan(op, np_op, axes):
    """NaN in, NaN out, as numpy does (onnxruntime's answer depends on where the NaN sits)."""
    x = np.random.default_rng(5).standard_normal((3, 4, 2)).astype(np.float32)
    x[1, 2, 0] = x[0, 0, 1] = np.nan
    node, inits = _node(op, 18, axes, keepdims=1)
    (y,) = run_edgetrain(model(node, {"x": x}, ["y"], initializers=inits, opset=18), {"x": x})
    np.testing.assert_array_equal(y, np_op(x, axis=axes, keepdims=True))


def test_reduce_max_of_nothing_is_minus_inf():
    feeds = {"x": np.zeros((3, 0), np.float32)}
    node, inits = _node("ReduceMax", 18, (1,), keepdims=0)
    (y,) = run_edgetrain(model(node, feeds, ["y"], initializers=inits, opset=18), feeds)
    np.testing.assert_array_equal(y, np.full(3, -np.inf, np.float32))


@pytest.mark.parametrize("axes", [(3,), (1, -2)])
def test_reduce_bad_axes(axes):
    x = np.zeros((2, 3, 4), np.float32)
    node, inits = _node("ReduceSum", 13, axes)
    with pytest.raises(ShapeError, match="axis|axes"):
        run_edgetrain(model(node, {"x": x}, ["y"], initializers=inits, opset=13), {"x": x})


# --- along one axis: CumSum, ArgMax, ArgMin ----------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64], ids=str)
def test_cumsum_against_onnxruntime(axis, exclusive, reverse, dtype):
    x = (np.random.default_rng(axis + 3).standard_normal((3, 4, 5)) * 5).astype(dtype)
    m = model(helper.make_node("CumSum", ["x", "a"], ["y"], exclusive=exclusive, reverse=reverse), {"x": x}, ["y"],
              initializers={"a": np.array(axis, np.int32)})
    assert_matches(m, {"x": x}, oracle=run_onnxruntime)


def test_cumsum_gradient_by_finite_differences():
    from gradcheck import check_gradients

    from edgetrain.ir import Node, TensorType
    x = np.random.default_rng(0).standard_normal((3, 4))
    for exclusive in (0, 1):
        for reverse in (0, 1):
            check_gradients([Node("CumSum", ["x", "a"], ["y"], {"exclusive": exclusive, "reverse": reverse}, "cs")],
                            {"x": x}, ["y"], [TensorType(np.float64, (3, 4))], consts={"a": np.array(1, np.int64)})


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64], ids=str)
def test_cumprod_against_reference(axis, exclusive, reverse, dtype):
    """The ONNX reference evaluator (onnxruntime has no CumProd-26); in-range values, a few zeros."""
    rng = np.random.default_rng(axis + 7)
    x = (rng.integers(-3, 4, (3, 4, 5)) if dtype == np.int64 else rng.uniform(-2, 2, (3, 4, 5))).astype(dtype)
    m = model(helper.make_node("CumProd", ["x", "a"], ["y"], exclusive=exclusive, reverse=reverse), {"x": x}, ["y"],
              initializers={"a": np.array(axis, np.int32)}, opset=26)
    assert_matches(m, {"x": x}, oracle=run_reference)


def test_cumprod_gradient_by_finite_differences_and_torch_with_zeros():
    """Central differences; with zeros in x (where a formula dividing by x breaks) against torch.cumprod."""
    import torch
    from gradcheck import check_gradients, gradient_session

    from edgetrain.ir import Node, TensorType
    x = np.random.default_rng(0).uniform(0.5, 1.5, (3, 5)) * np.where(np.arange(15).reshape(3, 5) % 2, 1, -1)
    for exclusive in (0, 1):
        for reverse in (0, 1):
            node = Node("CumProd", ["x", "a"], ["y"], {"exclusive": exclusive, "reverse": reverse}, "cp")
            check_gradients([node], {"x": x}, ["y"], [TensorType(np.float64, (3, 5))],
                            consts={"a": np.array(1, np.int64)}, opset=26)
    z = x.copy()
    z[0, 1] = z[1, 2] = z[1, 3] = z[2, 4] = 0.0
    for reverse in (0, 1):
        node = Node("CumProd", ["x", "a"], ["y"], {"reverse": reverse}, "cp")
        sess, graph = gradient_session([node], {"x": z}, {"a": np.array(1, np.int64)}, ["y"],
                                       [TensorType(np.float64, (3, 5))], opset=26)
        t = torch.from_numpy(z).requires_grad_()
        y = torch.cumprod(t.flip(1), 1).flip(1) if reverse else torch.cumprod(t, 1)
        (y * torch.from_numpy(graph.initializers["cot_0"])).sum().backward()
        np.testing.assert_allclose(sess.run(None, {"x": z})[1], t.grad.numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_extremes_against_onnxruntime(op, axis, keepdims, last):
    rng = np.random.default_rng(7)
    for x in (rng.standard_normal((3, 4, 5)).astype(np.float32), rng.integers(0, 3, (3, 4, 5)).astype(np.int64)):
        m = model(helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=keepdims, select_last_index=last), {"x": x},
                  ["y"])
        assert_matches(m, {"x": x}, oracle=run_onnxruntime)       # integer data: ties, first or last


def test_arg_extremes_pick_the_first_nan_and_refuse_an_empty_axis():
    x = np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 0.0, -1.0, 5.0]], np.float32)
    for op in ("ArgMax", "ArgMin"):
        assert_matches(model(helper.make_node(op, ["x"], ["y"], axis=1), {"x": x}, ["y"]), {"x": x},
                       oracle=run_reference)
    empty = np.zeros((2, 0), np.float32)
    with pytest.raises(ShapeError, match="axis 1 is empty"):
        run_edgetrain(model(helper.make_node("ArgMax", ["x"], ["y"], axis=1), {"x": empty}, ["y"]), {"x": empty})


# --- ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSumExp ---------------------------------------------------

TRANSFORMED = ["ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp"]


@pytest.mark.parametrize("op", TRANSFORMED)
@pytest.mark.parametrize("axes", [[1], [0, 2], [-1], [0, 1, 2], None], ids=str)
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("opset", [17, 18])
def test_transformed_reductions_against_onnxruntime(op, axes, keepdims, opset):
    """Axes as an attribute (opset 17) or an input (18); [0, 2] is not one block: numpy through the workspace."""
    x = (np.random.default_rng(5).standard_normal((3, 4, 5)) * 3).astype(np.float32)
    inputs, consts, attrs = ["x"], {}, {"keepdims": keepdims}
    if axes is not None and opset >= 18:
        inputs.append("a")
        consts["a"] = np.array(axes, np.int64)
    elif axes is not None:
        attrs["axes"] = axes
    m = model(helper.make_node(op, inputs, ["y"], **attrs), {"x": x}, ["y"], initializers=consts, opset=opset)
    assert_matches(m, {"x": x}, oracle=run_onnxruntime)


def test_log_sum_exp_is_stable_and_noop_copies():
    x = np.array([[1000.0, 999.0, -5.0], [-np.inf, -np.inf, -np.inf]], np.float32)
    m = model(helper.make_node("ReduceLogSumExp", ["x", "a"], ["y"], keepdims=0), {"x": x}, ["y"],
              initializers={"a": np.array([1], np.int64)}, opset=18)
    (y,) = run_edgetrain(m, {"x": x})
    np.testing.assert_allclose(y[0], 1000 + np.log1p(np.exp(-1.0) + np.exp(-1005.0)), rtol=1e-6)
    assert y[1] == -np.inf
    noop = model(helper.make_node("ReduceSumSquare", ["x"], ["y"], noop_with_empty_axes=1), {"x": x[:1]}, ["y"],
                 opset=18)
    np.testing.assert_array_equal(run_edgetrain(noop, {"x": x[:1]})[0], x[:1])     # the spec: input unchanged


@pytest.mark.parametrize("op", TRANSFORMED)
@pytest.mark.parametrize("axes, keepdims", [([1], 0), ([0, 2], 1)], ids=str)
def test_transformed_reduction_gradients_by_finite_differences(op, axes, keepdims):
    from gradcheck import check_gradients

    from edgetrain.ir import Node, TensorType
    x = np.random.default_rng(8).standard_normal((3, 4, 5)) + 0.5
    out = np.sum(x, axis=tuple(axes), keepdims=bool(keepdims)).shape
    check_gradients([Node(op, ["x", "a"], ["y"], {"keepdims": keepdims}, "r")], {"x": x}, ["y"],
                    [TensorType(np.float64, out)], consts={"a": np.array(axes, np.int64)}, opset=18)


def test_l2_gradient_of_an_all_zero_slice_is_zero():
    from gradcheck import gradient_session

    from edgetrain.ir import Node, TensorType
    x = np.zeros((2, 3))
    x[1] = [3.0, 4.0, 0.0]
    sess, _ = gradient_session([Node("ReduceL2", ["x", "a"], ["y"], {"keepdims": 0}, "r")], {"x": x},
                               {"a": np.array([1], np.int64)}, ["y"], [TensorType(np.float64, (2,))], opset=18)
    (_, dx) = sess.run(None, {"x": x})
    assert np.isfinite(dx).all() and not dx[0].any()


# --- TopK -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("k", [0, 1, 2, "all"])
@pytest.mark.parametrize("largest", [0, 1])
def test_topk_against_onnxruntime(axis, k, largest):
    """Values and indices; integer data has ties, which go to the lower index first."""
    rng = np.random.default_rng(11)
    for x in (rng.standard_normal((3, 6, 5)).astype(np.float32), rng.integers(0, 3, (3, 6, 5)).astype(np.int64)):
        kk = x.shape[axis] if k == "all" else k
        m = model(helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest), {"x": x}, ["v", "i"],
                  initializers={"k": np.array([kk], np.int64)})
        assert_matches(m, {"x": x}, oracle=run_onnxruntime)


def test_topk_gradient_by_finite_differences_and_k_is_checked():
    from gradcheck import check_gradients

    from edgetrain.ir import Node, TensorType
    x = np.random.default_rng(4).standard_normal((3, 5))
    check_gradients([Node("TopK", ["x", "k"], ["v", "i"], {"axis": 1}, "topk")], {"x": x}, ["v"],
                    [TensorType(np.float64, (3, 2))], consts={"k": np.array([2], np.int64)})
    xf = x.astype(np.float32)
    too_many = model(helper.make_node("TopK", ["x", "k"], ["v", "i"]), {"x": xf}, ["v", "i"],
                     initializers={"k": np.array([6], np.int64)})
    with pytest.raises(ShapeError, match=r"K must be one int64 in \[0, 5\]"):
        run_edgetrain(too_many, {"x": xf})


# --- ReduceProd -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("axes", [[1], [0, 2], [-1], None], ids=str)
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("opset", [17, 18])
def test_reduce_prod_against_onnxruntime(axes, keepdims, opset):
    """Floats with zeros in some groups, and int64; [0, 2] is not one block (numpy through out=)."""
    rng = np.random.default_rng(21)
    x = (rng.standard_normal((3, 4, 5)) + 0.5).astype(np.float32)
    x[0, 1, :2] = 0
    for data in (x, rng.integers(-3, 4, (3, 4, 5)).astype(np.int64)):
        inputs, consts, attrs = ["x"], {}, {"keepdims": keepdims}
        if axes is not None and opset >= 18:
            inputs.append("a")
            consts["a"] = np.array(axes, np.int64)
        elif axes is not None:
            attrs["axes"] = axes
        m = model(helper.make_node("ReduceProd", inputs, ["y"], **attrs), {"x": data}, ["y"], initializers=consts,
                  opset=opset)
        assert_matches(m, {"x": data}, oracle=run_onnxruntime, rtol=1e-5, atol=1e-6)


def test_reduce_prod_gradient_with_zeros_by_finite_differences_and_torch():
    """Groups without a zero, with one zero (only it gets a gradient) and with two (none does)."""
    import torch
    from gradcheck import check_gradients, gradient_session

    from edgetrain.ir import Node, TensorType
    x = np.random.default_rng(9).standard_normal((3, 4, 5)) + 0.5
    x[0, 1, 2] = 0.0
    x[1, 2, 1] = x[1, 2, 3] = 0.0
    node = Node("ReduceProd", ["x", "a"], ["y"], {"keepdims": 0}, "r")
    consts, types = {"a": np.array([2], np.int64)}, [TensorType(np.float64, (3, 4))]
    check_gradients([node], {"x": x}, ["y"], types, consts=consts, opset=18, samples=12)
    sess, graph = gradient_session([node], {"x": x}, consts, ["y"], types, opset=18)
    dx = sess.run(None, {"x": x})[1]
    t = torch.from_numpy(x).requires_grad_()
    (t.prod(dim=2) * torch.from_numpy(graph.initializers["cot_0"])).sum().backward()
    np.testing.assert_allclose(dx, t.grad.numpy(), rtol=1e-10, atol=1e-12)
    check_gradients([Node("ReduceProd", ["x"], ["y"], {"keepdims": 1, "axes": [0, 2]}, "r")], {"x": x}, ["y"],
                    [TensorType(np.float64, (1, 4, 1))], opset=17)
