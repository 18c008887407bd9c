"""MaxPool (with Indices), AveragePool, GlobalAveragePool and GlobalMaxPool against onnxruntime and the ONNX
reference evaluator: 1-D and 2-D, strides, (asymmetric) pads, dilations, auto_pad, ceil_mode,
count_include_pad, storage_order, float64, and pools folded when planning.
"""
import zlib

import numpy as np
import pytest
from onnx import helper
from oracle import assert_matches, model, run_edgetrain, run_onnxruntime, run_reference

import edgetrain
from edgetrain.errors import InputError, ShapeError

pytestmark = pytest.mark.arm64   # also on the emulated arm64 stage (.ci/run, README "Platforms")

MAX_CASES = {
    "2x2_s2": ((2, 3, 8, 8), dict(kernel_shape=[2, 2], strides=[2, 2])),
    "2x2_s2_odd": ((2, 3, 9, 7), dict(kernel_shape=[2, 2], strides=[2, 2])),
    "2x2_s2_ceil": ((1, 2, 9, 7), dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
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


@pytest.mark.parametrize("case", ["2x2_s2", "2x2_s2_odd", "asym_pads", "dilations", "ceil_mode", "1d", "valid"])
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


@pytest.mark.parametrize("case", ["2x2_s2_odd", "3x3_s1_pad1"])
def test_max_pool_nan_gives_nan_and_index_minus_one(case):
    """A NaN anywhere in a window gives NaN and Indices -1 (numpy's and PyTorch's rule; onnxruntime skips NaNs,
    so the oracle here is numpy over the windows)."""
    shape, attrs = MAX_CASES[case]
    x = _seed(case, "nan").standard_normal(shape).astype(np.float32)
    x[0, 0, 1, 1] = x[1, 2, 4, 4] = np.nan
    y, i = edgetrain.InferenceSession(_pool_model("MaxPool", x, attrs, ("Y", "I"))).run(None, {"X": x})
    if case.startswith("2x2"):
        oh, ow = y.shape[2:]
        windows = x[:, :, :2 * oh, :2 * ow].reshape(*shape[:2], oh, 2, ow, 2)
        np.testing.assert_array_equal(y, windows.max(axis=(3, 5)))        # numpy's max propagates NaN
    nan = np.isnan(y)
    assert nan.sum() >= 2 and np.all(i[nan] == -1) and np.all(i[~nan] >= 0)
    np.testing.assert_array_equal(x.reshape(-1)[i[~nan]], y[~nan])


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


# --- gradients --------------------------------------------------------------------------------------------
# Rules by central differences (float64; MaxPool on distinct values, so no window has a tie); MaxPoolGrad
# against numpy's scatter-add of onnxruntime's Indices; AveragePoolGrad against the transpose of
# onnxruntime's AveragePool (linear, so its Jacobian is read off by pooling basis images); the rules'
# nodes against onnxruntime's vocabulary; dot-product tests at the bench shapes.

def _distinct(shape, *key) -> np.ndarray:
    """float64 values all at least 1/7 apart (a permutation of a grid), so max pooling has no ties."""
    n = int(np.prod(shape))
    return (_seed(*key).permutation(n).reshape(shape) - n / 2) / 7.0


def _pooled_shape(op, x, attrs, opset=19):
    x = x.astype(np.float32)
    return run_onnxruntime(_pool_model(op, x, attrs, opset=opset), {"X": x})[0].shape


def _check_rule(op, x, attrs, opset=19):
    from gradcheck import check_gradients

    from edgetrain.ir import Node, TensorType
    out = TensorType(np.float64, _pooled_shape(op, x, attrs, opset))
    check_gradients([Node(op, ["x"], ["y"], attrs, "pool")], {"x": x}, ["y"], [out], opset=opset, samples=10)


@pytest.mark.parametrize("case", list(MAX_CASES))
def test_max_pool_gradient_rule(case):
    shape, attrs = MAX_CASES[case]
    _check_rule("MaxPool", _distinct(shape, "maxgrad", case), attrs)


@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("case", list(AVG_CASES))
def test_average_pool_gradient_rule(case, include_pad):
    shape, attrs = AVG_CASES[case]
    x = _seed("avggrad", case).standard_normal(shape)
    _check_rule("AveragePool", x, dict(attrs, count_include_pad=include_pad))


def test_average_pool_gradient_rule_opset11():
    x = _seed("avg11grad").standard_normal((2, 3, 7, 8))
    _check_rule("AveragePool", x, dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, pads=[0, 1, 1, 0]),
                opset=17)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 3, 4, 5), (2, 3, 1, 1), (1, 2, 3, 4, 2)], ids=str)
def test_global_pool_gradient_rules(op, shape):
    from gradcheck import check_gradients

    from edgetrain.ir import Node, TensorType
    out = TensorType(np.float64, shape[:2] + (1,) * (len(shape) - 2))
    for opset in (13, 17):
        check_gradients([Node(op, ["x"], ["y"], {}, "gp")], {"x": _distinct(shape, op, shape)}, ["y"], [out],
                        opset=opset)


def test_global_max_pool_gradient_shares_ties():
    """Tied maxima share dY equally (the subgradient PyTorch's amax uses)."""
    from gradcheck import gradient_session

    from edgetrain.ir import Node, TensorType
    x = np.array([[[[1.0, 3.0], [3.0, 0.0]], [[2.0, 2.0], [2.0, 2.0]], [[5.0, 1.0], [0.0, 1.0]]]])
    sess, graph = gradient_session([Node("GlobalMaxPool", ["x"], ["y"], {}, "gmp")], {"x": x}, {}, ["y"],
                                   [TensorType(np.float64, (1, 3, 1, 1))])
    dx = sess.run(None, {"x": x})[1]
    c = graph.initializers["cot_0"].reshape(3)
    want = np.array([[[0, 0.5], [0.5, 0]], [[0.25] * 2] * 2, [[1, 0], [0, 0]]]) * c[:, None, None]
    np.testing.assert_allclose(dx[0], want, rtol=1e-15)


def _grad_nodes(nodes, x, opset=19):
    from edgetrain.autodiff.builder import gradient_graph, prepare_for_training
    from edgetrain.ir import Graph, Node, TensorType, Value
    nodes = list(nodes) + [Node("ReduceSum", [nodes[-1].outputs[0]], ["loss"], {"keepdims": 0}, "sum")]
    g = Graph(nodes, [], [Value("loss", TensorType(np.float32, ()))], {"x": x}, {"": opset})
    prepared = prepare_for_training(g)
    return prepared, gradient_graph(prepared, "loss", ["x"])[0]


def test_pool_rules_emit_onnxruntime_ops():
    """MaxPoolGrad(dY, Indices) and AveragePoolGrad(dY) in the ai.onnx domain with the forward attributes, as
    onnxruntime 1.19 writes them; MaxPool gets its Indices output; no input_spatial_shape where dY's shape
    determines X's (cnn's 28 -> 14), X's where it does not (7 -> 3 with stride 2: 6 pools alike)."""
    from edgetrain.ir import Node
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0], ceil_mode=0, dilations=[1, 1],
                 storage_order=0, auto_pad="NOTSET")
    for op, grad_op, size, hint in [("MaxPool", "MaxPoolGrad", 28, None),
                                    ("MaxPool", "MaxPoolGrad", 7, [7, 9]),
                                    ("AveragePool", "AveragePoolGrad", 28, None),
                                    ("AveragePool", "AveragePoolGrad", 7, [7, 9])]:
        x = np.zeros((2, 3, size, 9 if hint else size), np.float32)
        fwd_attrs = {k: v for k, v in attrs.items() if op == "MaxPool" or k != "storage_order"}
        prepared, nodes = _grad_nodes([Node(op, ["x"], ["y"], fwd_attrs, "pool")], x)
        (g,) = [n for n in nodes if n.op_type == grad_op]
        assert g.domain == ""
        want = fwd_attrs if hint is None else dict(fwd_attrs, input_spatial_shape=hint)
        as_tuples = {k: tuple(v) if isinstance(v, list) else v for k, v in want.items()}   # lists load as tuples
        assert {k: tuple(v) if isinstance(v, list) else v for k, v in g.attrs.items()} == as_tuples
        if op == "MaxPool":
            assert len(prepared.nodes[0].outputs) == 2 and g.inputs[1] == prepared.nodes[0].outputs[1]


def test_global_average_pool_rule_is_size_based():
    """Scale(dY, Size(X) / Size(Y)) expanded to Shape(X): onnxruntime's form for symbolic shapes."""
    from edgetrain.ir import Node
    x = np.zeros((2, 3, 4, 4), np.float32)
    _, nodes = _grad_nodes([Node("GlobalAveragePool", ["x"], ["y"], {}, "gap")], x)
    ops = [n.op_type for n in nodes if n.name.startswith("gap_Grad")]
    assert ops == ["Size", "Size", "Div", "Scale", "Shape", "Expand"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", list(MAX_CASES))
def test_max_pool_grad_kernel(case, dtype):
    """dX = numpy's scatter-add of dY at onnxruntime's Indices (storage_order 1: H, W swapped per plane)."""
    shape, attrs = MAX_CASES[case]
    rng = _seed("mpgk", case)
    x = rng.integers(0, 4, shape).astype(np.float32)          # ties: overlapping windows share a maximum
    dy_shape = _pooled_shape("MaxPool", x, attrs)
    dy = rng.standard_normal(dy_shape).astype(dtype)
    idx = run_onnxruntime(_pool_model("MaxPool", x, attrs, ("Y", "I")), {"X": x})[1]
    node = helper.make_node("MaxPoolGrad", ["dY", "I"], ["dX"], **attrs, input_spatial_shape=list(shape[2:]))
    dx = run_edgetrain(model(node, {"dY": dy, "I": idx}, ["dX"], opset=19), {"dY": dy, "I": idx})[0]
    flat = idx.reshape(-1)
    if attrs.get("storage_order", 0) == 1:
        h, w = shape[2], shape[3]
        q = flat % (h * w)
        flat = flat - q + (q % h) * w + q // h
    want = np.zeros(int(np.prod(shape)), np.float64)
    np.add.at(want, flat, dy.reshape(-1).astype(np.float64))
    assert dx.shape == shape and dx.dtype == dtype
    np.testing.assert_allclose(dx.reshape(-1), want, rtol=1e-6 if dtype == np.float32 else 1e-15, atol=1e-6)


def test_max_pool_grad_rejects_bad_indices():
    dy = np.ones((1, 1, 2, 2), np.float32)
    idx = np.array([0, 3, 99, -1], np.int64).reshape(1, 1, 2, 2)
    node = helper.make_node("MaxPoolGrad", ["dY", "I"], ["dX"], name="mpg_2", kernel_shape=[2, 2],
                            strides=[2, 2])
    sess = edgetrain.InferenceSession(model(node, {"dY": dy, "I": idx}, ["dX"]).SerializeToString())
    with pytest.raises(InputError, match=r"mpg_2.*input 1 \('I'\) holds 99 at \[0, 0, 1, 0\]"):
        sess.run(None, {"dY": dy, "I": idx})
    idx[0, 0, 1, 0] = 5   # -1 (a window of NaNs) is skipped
    np.testing.assert_array_equal(sess.run(None, {"dY": dy, "I": idx})[0].reshape(-1),
                                  [1, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("case", list(AVG_CASES))
def test_average_pool_grad_kernel(case, include_pad, dtype):
    """dX = J^T dY per plane, J = onnxruntime's AveragePool applied to every basis image of one plane."""
    shape, attrs = AVG_CASES[case]
    attrs = dict(attrs, count_include_pad=include_pad)
    plane = shape[2:]
    size = int(np.prod(plane))
    basis = np.eye(size, dtype=np.float32).reshape((size, 1) + plane)
    jac = run_onnxruntime(_pool_model("AveragePool", basis, attrs), {"X": basis})[0].reshape(size, -1).T
    pooled = _pooled_shape("AveragePool", basis[:1], attrs)[2:]
    dy = _seed("apgk", case).standard_normal((shape[0], shape[1]) + pooled)
    dy = dy.astype(dtype)
    node = helper.make_node("AveragePoolGrad", ["dY"], ["dX"], **attrs, input_spatial_shape=list(plane))
    dx = run_edgetrain(model(node, {"dY": dy}, ["dX"], opset=19), {"dY": dy})[0]
    want = (dy.reshape(shape[0] * shape[1], -1).astype(np.float64) @ jac.astype(np.float64)).reshape(shape)
    assert dx.shape == shape and dx.dtype == dtype
    np.testing.assert_allclose(dx, want, rtol=1e-6, atol=1e-6 if dtype == np.float32 else 1e-7)


@pytest.mark.parametrize("op, attrs, hint, match", [
    ("AveragePoolGrad", dict(kernel_shape=[2, 2], strides=[2, 2]), [9, 9], "is not the pooled shape"),
    ("AveragePoolGrad", dict(kernel_shape=[2, 2], strides=[2, 2]), [8], "entries"),
    ("AveragePoolGrad", dict(kernel_shape=[2]), None, "kernel_shape"),
    ("AveragePoolGrad", dict(kernel_shape=[2, 2], count_include_pad=3), None, "count_include_pad"),
    ("MaxPoolGrad", dict(kernel_shape=[2, 2], storage_order=2), None, "storage_order"),
])
def test_pool_grad_errors_name_the_node(op, attrs, hint, match):
    dy = np.zeros((1, 2, 3, 3), np.float32)
    feeds = {"dY": dy} if op == "AveragePoolGrad" else {"dY": dy, "I": np.zeros(dy.shape, np.int64)}
    extra = {} if hint is None else {"input_spatial_shape": hint}
    node = helper.make_node(op, list(feeds), ["dX"], name="pg_4", **attrs, **extra)
    with pytest.raises(ShapeError, match=match) as err:
        edgetrain.InferenceSession(model(node, feeds, ["dX"], opset=19).SerializeToString()).run(None, feeds)
    assert "pg_4" in str(err.value)


def test_max_pool_gradient_bench_shape_matches_torch():
    """cnn's MaxPool 2x2 on 32x8x28x28 (float32): the training graph's dX against PyTorch's autograd."""
    import torch
    from gradcheck import gradient_session

    from edgetrain.ir import Node, TensorType
    x = (_distinct((32, 8, 28, 28), "bench") / 1000).astype(np.float32)
    node = Node("MaxPool", ["x"], ["y"], dict(kernel_shape=[2, 2], strides=[2, 2]), "mp")
    sess, graph = gradient_session([node], {"x": x}, {}, ["y"], [TensorType(np.float32, (32, 8, 14, 14))])
    dx = sess.run(None, {"x": x})[1]
    tx = torch.tensor(x, requires_grad=True)
    torch.nn.functional.max_pool2d(tx, 2, 2).backward(torch.tensor(graph.initializers["cot_0"]))
    np.testing.assert_array_equal(dx, tx.grad.numpy())


@pytest.mark.parametrize("dtype,eps", [(np.float64, 1e-5), (np.float32, 1e-2)], ids=["float64", "float32"])
def test_dot_product_pools_bench_shapes(dtype, eps):
    """cnn's MaxPool 2x2 (32x8x28x28), an AveragePool with pads and ceil_mode, mobilenet's GlobalAveragePool
    (16x64x16x16) and a GlobalMaxPool, at once: <t, J^T c> == <J t, c>. float32 only where the pools are
    linear (with X the parameter, float32 steps large enough to beat rounding move many maxima)."""
    from gradcheck import check_directional

    from edgetrain.ir import Node, TensorType
    x = _distinct((32, 8, 28, 28), "dot", "x").astype(dtype)
    z = _distinct((16, 64, 16, 16), "dot", "z").astype(dtype)
    nodes = [Node("AveragePool", ["x"], ["a"], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                                                    ceil_mode=1), "avg"),
             Node("GlobalAveragePool", ["z"], ["g"], {}, "gap")]
    outs = [("a", (32, 8, 15, 15)), ("g", (16, 64, 1, 1))]
    if dtype == np.float64:
        nodes += [Node("MaxPool", ["x"], ["m"], dict(kernel_shape=[2, 2], strides=[2, 2]), "max"),
                  Node("GlobalMaxPool", ["z"], ["h"], {}, "gmp")]
        outs += [("m", (32, 8, 14, 14)), ("h", (16, 64, 1, 1))]
    check_directional(nodes, {"x": x, "z": z}, [o for o, _ in outs], [TensorType(dtype, s) for _, s in outs],
                      eps=eps)


@pytest.mark.ort119
def test_pool_grads_run_in_onnxruntime_119(ort):
    """onnxruntime-training 1.19.2 runs MaxPoolGrad and AveragePoolGrad as the rules emit them (ai.onnx
    domain, the forward attributes plus input_spatial_shape) once dX's shape is in the graph's value_info,
    which its kernels read dX's shape from (without it, 1.19.2 crashes)."""
    from onnx import TensorProto
    cases = []
    for shape, attrs in [((2, 3, 7, 9), dict(kernel_shape=[2, 2], strides=[2, 2])),
                         ((2, 3, 8, 8), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
                         ((2, 3, 9), dict(kernel_shape=[3], strides=[2], pads=[1, 1]))]:
        x = _distinct(shape, "ort", shape).astype(np.float32)
        dy = _seed("ort", shape).standard_normal(_pooled_shape("MaxPool", x, attrs)).astype(np.float32)
        hint = {"input_spatial_shape": list(shape[2:])}
        for op in ("MaxPoolGrad", "AveragePoolGrad"):
            if op == "MaxPoolGrad":
                nodes = [helper.make_node("MaxPool", ["X"], ["Y", "I"], **attrs),
                         helper.make_node(op, ["dY", "I"], ["dX"], **attrs, **hint)]
                feeds = {"X": x, "dY": dy}
            else:
                nodes, feeds = [helper.make_node(op, ["dY"], ["dX"], **attrs, **hint)], {"dY": dy}
            m = model(nodes, feeds, ["dX"])
            del m.graph.output[:]
            m.graph.output.append(helper.make_tensor_value_info("dX", TensorProto.FLOAT, shape))
            cases.append((m, feeds))
    for (m, feeds), theirs in zip(cases, ort.run_models(cases)):
        np.testing.assert_allclose(run_edgetrain(m, feeds)[0], theirs[0], rtol=1e-6, atol=1e-7)


# --- LpPool -------------------------------------------------------------------------------------------------

LP_CASES = ["3x3_s1_pad1", "asym_pads", "dilations", "ceil_mode", "ceil_mode_pads", "same_upper", "1d"]


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("case", LP_CASES)
def test_lp_pool_against_onnxruntime(case, p):
    """onnxruntime (the reference evaluator's LpPool reads past the input with ceil_mode)."""
    shape, attrs = MAX_CASES[case]
    x = _seed(case, p).standard_normal(shape).astype(np.float32)
    m = _pool_model("LpPool", x, dict(attrs, p=p), opset=18)
    assert_matches(m, {"X": x}, oracle=run_onnxruntime, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("case", ["asym_pads", "dilations", "ceil_mode_pads", "1d"])
def test_lp_pool_gradient_by_finite_differences(case, p):
    from gradcheck import check_gradients

    from edgetrain.ir import Node, TensorType
    shape, attrs = MAX_CASES[case]
    x = _seed(case, p, "grad").standard_normal(shape)
    x = np.where(np.abs(x) < 0.1, x + 0.3, x)     # away from |x|'s kink
    y = run_reference(_pool_model("LpPool", x, dict(attrs, p=p), opset=18), {"X": x})[0]
    check_gradients([Node("LpPool", ["x"], ["y"], dict(attrs, p=p), "lp")], {"x": x}, ["y"],
                    [TensorType(np.float64, y.shape)], opset=18, samples=8)


# --- MaxUnpool ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("with_shape", [False, True])
def test_max_unpool_against_onnxruntime_and_its_gradient(with_shape):
    """MaxPool's Indices unpooled (with output_shape: one larger than the pooled size gives), a bad index
    refused by name, dX by finite differences."""
    from gradcheck import check_gradients

    from edgetrain.ir import Node, TensorType
    rng = _seed("unpool", with_shape)
    x = rng.standard_normal((2, 3, 3, 2)).astype(np.float32)
    idx = np.stack([rng.permutation(36)[:6] for _ in range(6)]).reshape(2, 3, 3, 2).astype(np.int64)
    idx += (np.arange(6) * 36).reshape(2, 3, 1, 1)     # flat over the whole [2, 3, 6, 6] output
    attrs = dict(kernel_shape=[2, 2], strides=[2, 4])   # unpools [3, 2] to [6, 6]
    inputs, inits = ["X", "I"], {}
    if with_shape:
        inputs.append("S")
        inits["S"] = np.array([2, 3, 7, 6], np.int64)
        idx = idx // 36 * 42 + idx % 36               # offsets into [7, 6] planes
    m = model(helper.make_node("MaxUnpool", inputs, ["Y"], name="up", **attrs), {"X": x, "I": idx}, ["Y"],
              initializers=inits, opset=11)
    assert_matches(m, {"X": x, "I": idx}, oracle=run_onnxruntime)
    bad = idx.copy()
    bad[1, 2, 0, 1] = -3
    with pytest.raises(InputError, match=r"'up'.*input 1 \('I'\) holds -3 at \[1, 2, 0, 1\]"):
        run_edgetrain(m, {"X": x, "I": bad})
    out = (2, 3, 7, 6) if with_shape else (2, 3, 6, 6)
    check_gradients([Node("MaxUnpool", inputs, ["y"], attrs, "up")], {"X": x.astype(np.float64)}, ["y"],
                    [TensorType(np.float64, out)], consts={"I": idx, **inits}, opset=11)
