"""Every gradient rule against finite differences (float64), plus dot-product tests at realistic shapes."""
import numpy as np
import pytest
from gradcheck import check_directional, check_gradients

from edgetrain.errors import UnsupportedOpError
from edgetrain.ir import Node, TensorType

F64 = np.float64


def rnd(*shape, low=None, seed=0, away_from=None):
    """Random float64; ``low`` makes it uniform in [low, low + 2); ``away_from`` keeps |x - v| > 0.1."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) if low is None else rng.uniform(low, low + 2, shape)
    if away_from is not None:
        x = np.where(np.abs(x - away_from) < 0.1, x + 0.2 * np.sign(x - away_from + 1e-9), x)
    return x.astype(F64)


def t(*shape, dtype=F64):
    return TensorType(dtype, shape)


UNARY = [
    ("Abs", {}, dict(away_from=0.0)), ("Atan", {}, {}), ("Cos", {}, {}), ("Elu", {"alpha": 0.7}, dict(away_from=0.0)),
    ("Erf", {}, {}), ("Exp", {}, {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, {}),
    ("HardSwish", {}, {}), ("LeakyRelu", {"alpha": 0.1}, dict(away_from=0.0)), ("Log", {}, dict(low=0.5)),
    ("Neg", {}, {}), ("Reciprocal", {}, dict(low=0.5)), ("Relu", {}, dict(away_from=0.0)),
    ("Selu", {}, dict(away_from=0.0)), ("Sigmoid", {}, {}), ("Sin", {}, {}), ("Softplus", {}, {}),
    ("Sqrt", {}, dict(low=0.5)), ("Tanh", {}, {}),
    ("Acos", {}, {}), ("Asin", {}, {}), ("Atanh", {}, {}),
    ("Acosh", {}, dict(low=1.2)), ("Asinh", {}, {}), ("Cosh", {}, {}), ("Sinh", {}, {}), ("Tan", {}, dict(low=-1.0)),
]


@pytest.mark.parametrize("op,attrs,domain_kw", UNARY, ids=[u[0] for u in UNARY])
def test_unary_rules(op, attrs, domain_kw):
    x = rnd(3, 5, **domain_kw)
    if op in ("HardSigmoid", "HardSwish"):   # keep off the kinks
        x = np.where(np.abs(np.abs(x) - 3) < 0.1, x + 0.3, x) if op == "HardSwish" else x
    if op in ("Acos", "Asin", "Atanh"):   # inside (-1, 1), away from the poles
        x = 0.9 * np.tanh(x)
    check_gradients([Node(op, ["x"], ["y"], attrs, "n")], {"x": x}, ["y"], [t(3, 5)])


def test_gelu_and_scale_rules():
    x = rnd(4, 3)
    check_gradients([Node("Gelu", ["x"], ["y"], {}, "g", "com.microsoft")], {"x": x}, ["y"], [t(4, 3)])
    check_gradients([Node("Scale", ["x", "s"], ["y"], {"scale_down": 1}, "s", "com.microsoft")], {"x": x},
                    ["y"], [t(4, 3)], consts={"s": np.array(2.5, F64)})


BROADCASTS = [((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 1), (1, 4)), ((2, 3, 4), (3, 1)), ((), (2, 3)), ((4,), (2, 3, 4))]


# PRelu's slope broadcasts to X only (unidirectional), so it takes the cases where X has the output shape
BINARY_CASES = [(op, shapes) for op in ("Add", "Sub", "Mul", "Div", "PRelu", "Pow") for shapes in BROADCASTS
                if op != "PRelu" or np.broadcast_shapes(*shapes) == shapes[0]]


@pytest.mark.parametrize("op,shapes", BINARY_CASES, ids=[f"{o}-{s}" for o, s in BINARY_CASES])
def test_binary_rules_with_broadcasting(op, shapes):
    a_shape, b_shape = shapes
    out = np.broadcast_shapes(a_shape, b_shape)
    a = rnd(*a_shape, low=0.5, seed=1) if op == "Pow" else rnd(*a_shape, seed=1, away_from=0.0)
    b = rnd(*b_shape, low=0.5, seed=2)
    check_gradients([Node(op, ["a", "b"], ["y"], {}, "n")], {"a": a, "b": b}, ["y"], [t(*out)])


def test_where_clip_sum_mean():
    cond = np.random.default_rng(0).random((3, 4)) > 0.5
    a, b = rnd(3, 4, seed=1), rnd(4, seed=2)
    check_gradients([Node("Where", ["c", "a", "b"], ["y"], {}, "w")], {"a": a, "b": b}, ["y"], [t(3, 4)],
                    consts={"c": cond})
    x = rnd(3, 4, seed=3)
    x = np.where(np.abs(np.abs(x) - 0.5) < 0.1, x * 1.5, x)
    for inputs in (["x", "lo", "hi"], ["x", "lo"], ["x", "", "hi"], ["x"]):
        check_gradients([Node("Clip", inputs, ["y"], {}, "c")], {"x": x}, ["y"], [t(3, 4)],
                        consts={"lo": np.array(-0.5, F64), "hi": np.array(0.5, F64)})
    for op in ("Sum", "Mean"):
        check_gradients([Node(op, ["a", "b", "x"], ["y"], {}, "s")], {"a": a, "b": b, "x": x}, ["y"], [t(3, 4)])


def test_fan_in_is_summed():
    x = rnd(3, 4)
    nodes = [Node("Mul", ["x", "x"], ["sq"], {}, "sq"), Node("Add", ["sq", "x"], ["y"], {}, "add")]
    check_gradients(nodes, {"x": x}, ["y"], [t(3, 4)])


@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("c_shape", [None, (5,), (3, 1), (3, 5), ()])
def test_gemm_rule(ta, tb, c_shape):
    a = rnd(*((4, 3) if ta else (3, 4)), seed=1)
    b = rnd(*((5, 4) if tb else (4, 5)), seed=2)
    params = {"a": a, "b": b}
    inputs = ["a", "b"]
    if c_shape is not None:
        params["c"] = rnd(*c_shape, seed=3)
        inputs.append("c")
    attrs = {"transA": ta, "transB": tb, "alpha": 0.7, "beta": 1.3}
    check_gradients([Node("Gemm", inputs, ["y"], attrs, "gemm")], params, ["y"], [t(3, 5)])


@pytest.mark.parametrize("a_shape,b_shape", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)),
                                             ((1, 3, 4), (2, 4, 5)), ((2, 2, 3, 4), (2, 1, 4, 5))], ids=str)
def test_matmul_rule(a_shape, b_shape):
    a, b = rnd(*a_shape, seed=1), rnd(*b_shape, seed=2)
    out = np.matmul(a, b).shape
    check_gradients([Node("MatMul", ["a", "b"], ["y"], {}, "mm")], {"a": a, "b": b}, ["y"], [t(*out)])


def test_matmul_of_vectors_is_refused_clearly():
    with pytest.raises(UnsupportedOpError, match="1-D"):
        check_gradients([Node("MatMul", ["a", "b"], ["y"], {}, "mm")], {"a": rnd(4), "b": rnd(4, 5)}, ["y"],
                        [t(5)])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted,ignore", [(False, None), (True, None), (True, 2), (False, 1)])
def test_softmax_cross_entropy_rule(reduction, weighted, ignore):
    scores = rnd(6, 4, 3, seed=1)
    labels = np.array([[0, 1, 2], [3, 2, 1], [1, 1, 0], [2, 3, 3], [0, 0, 2], [1, 3, 0]], np.int64)
    consts = {"labels": labels}
    inputs = ["s", "labels"]
    if weighted:
        consts["w"] = np.array([0.5, 1.0, 2.0, 1.5], F64)
        inputs.append("w")
    attrs = {"reduction": reduction} | ({"ignore_index": ignore} if ignore is not None else {})
    out = t(6, 3) if reduction == "none" else t()
    check_gradients([Node("SoftmaxCrossEntropyLoss", inputs, ["l"], attrs, "sce")], {"s": scores}, ["l"],
                    [out], consts=consts)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_rules(op, axis):
    x = rnd(3, 4, 5)
    check_gradients([Node(op, ["x"], ["y"], {"axis": axis}, "sm")], {"x": x}, ["y"], [t(3, 4, 5)])


def test_view_and_copy_rules():
    x = rnd(2, 3, 4)
    shape = np.array([4, 6], np.int64)
    cases = [
        ([Node("Reshape", ["x", "shape"], ["y"], {}, "r")], t(4, 6)),
        ([Node("Flatten", ["x"], ["y"], {"axis": 2}, "f")], t(6, 4)),
        ([Node("Unsqueeze", ["x", "ax"], ["y"], {}, "u")], t(2, 1, 3, 4)),
        ([Node("Transpose", ["x"], ["y"], {"perm": (2, 0, 1)}, "tr")], t(4, 2, 3)),
        ([Node("Identity", ["x"], ["y"], {}, "i")], t(2, 3, 4)),
        ([Node("Expand", ["x", "eshape"], ["y"], {}, "e")], t(5, 2, 3, 4)),
        ([Node("Unsqueeze", ["x", "ax"], ["u"], {}, "u"), Node("Squeeze", ["u", "ax"], ["y"], {}, "sq")],
         t(2, 3, 4)),
        ([Node("Cast", ["x"], ["y"], {"to": 11}, "c")], t(2, 3, 4)),
    ]
    for nodes, out in cases:
        check_gradients(nodes, {"x": x}, ["y"], [out], consts={"shape": shape, "ax": np.array([1], np.int64),
                                                              "eshape": np.array([5, 1, 1, 1], np.int64)})


def test_a_node_without_a_rule_is_named():
    with pytest.raises(UnsupportedOpError, match=r"'f' \(Floor\).*no gradient rule"):
        check_gradients([Node("Floor", ["x"], ["y"], {}, "f")], {"x": rnd(3)}, ["y"], [t(3)])


def test_dot_product_at_realistic_shapes():
    """In float64: ReLU's kinks, crossed by many of the 16k hidden units at float32's eps, blur the check there
    (float32 gradients of these layers are checked against torch in test_bench_gradients.py)."""
    rng = np.random.default_rng(0)
    f64 = np.float64
    params = {"w1": (rng.standard_normal((256, 784)) * 0.05).astype(f64), "b1": np.zeros(256, f64),
              "w2": (rng.standard_normal((10, 256)) * 0.05).astype(f64), "b2": np.zeros(10, f64)}
    consts = {"x": rng.standard_normal((64, 784)).astype(f64), "labels": rng.integers(0, 10, 64)}
    nodes = [Node("Gemm", ["x", "w1", "b1"], ["h"], {"transB": 1}, "fc1"), Node("Relu", ["h"], ["r"], {}, "relu"),
             Node("Gemm", ["r", "w2", "b2"], ["o"], {"transB": 1}, "fc2"),
             Node("SoftmaxCrossEntropyLoss", ["o", "labels"], ["y"], {}, "sce")]
    check_directional(nodes, params, ["y"], [TensorType(f64, ())], consts=consts)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([0, 2], 0), ([-1], 0), (None, 0), (None, 1)], ids=str)
def test_reduce_rules(op, axes, keepdims):
    x = rnd(3, 4, 5)
    inputs, consts = ["x"], {}
    if axes is not None:
        inputs.append("axes")
        consts["axes"] = np.array(axes, np.int64)
    out = np.sum(x, axis=None if axes is None else tuple(axes), keepdims=bool(keepdims)).shape
    opset = 18
    check_gradients([Node(op, inputs, ["y"], {"keepdims": keepdims}, "r")], {"x": x}, ["y"], [t(*out)],
                    consts=consts, opset=opset)


def test_reduce_all_l2_rule():
    params = {"a": rnd(3, 4, seed=1), "b": rnd(5, seed=2)}
    check_gradients([Node("ReduceAllL2", ["a", "b"], ["y"], {}, "norm", "com.microsoft")], params, ["y"], [t()])
