"""Element-wise ops against the ONNX reference evaluator (numpy formulas for the com.microsoft ops).

Every op of ``edgetrain.ops.elementwise.OPS`` runs twice: as a generated fused kernel (inputs fed) and as
its numpy fold form (inputs as initializers, folded when planning). Shapes are random, and each multi-input
case broadcasts in one of the patterns of ``PATTERNS``.
"""
from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from onnx import helper
from oracle import assert_matches, model, run_edgetrain, run_reference

import edgetrain
from edgetrain.errors import EdgetrainError, ShapeError
from edgetrain.ops import elementwise

pytestmark = pytest.mark.arm64   # also on the emulated arm64 stage (.ci/run, README "Platforms")

F32, F64, I64, BOOL = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64), np.dtype(np.bool_)
FLOATS = (F32, F64)
NUMERIC = (F32, F64, I64)
NARROW = tuple(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.uint32, np.uint64))
INTEGERS = (np.dtype(np.int32), I64) + NARROW


def rng_for(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


# --- shapes ------------------------------------------------------------------------------------------------

PATTERNS = ("same", "scalar", "row", "column", "leading1", "both")


def shapes_for(pattern: str, rng: np.random.Generator, n: int = 2) -> list[tuple[int, ...]]:
    """``n`` input shapes that broadcast together as ``pattern`` says (the first input is the big one)."""
    rank = int(rng.integers(2, 4))
    base = tuple(int(d) for d in rng.integers(2, 5, size=rank))
    if pattern == "same":
        other = base
    elif pattern == "scalar":
        other = ()
    elif pattern == "row":           # [..., N] against [N]
        other = base[-1:]
    elif pattern == "column":        # [..., M, N] against [M, 1]
        other = base[-2:-1] + (1,)
    elif pattern == "leading1":      # [A, B, ...] against [1, B, ...]
        other = (1,) + base[1:]
    elif pattern == "both":          # both sides broadcast: [A, 1, C] against [B, 1]
        first = base[:-2] + (1, base[-1])
        return ([first] + [(base[-2], 1)] * (n - 1))[:n]
    else:
        raise ValueError(pattern)
    return [base] + [other] * (n - 1)


# --- input domains -----------------------------------------------------------------------------------------

def values(rng, shape, dtype, domain="any"):
    """Random values of ``dtype``; ``domain`` keeps ops away from their poles and branch cuts."""
    dtype = np.dtype(dtype)
    if dtype == BOOL:
        return np.asarray(rng.random(shape) < 0.5)
    if dtype.kind == "u":
        return np.asarray(rng.integers(0, 60 if domain != "nonzero" else 8, size=shape) + (domain == "nonzero"),
                          dtype)
    if dtype.kind == "i":
        lo, hi = {"any": (-20, 21), "small": (-3, 4), "exp": (0, 4), "nonzero": (1, 8)}.get(domain, (-20, 21))
        x = rng.integers(lo, hi, size=shape).astype(dtype)
        if domain == "nonzero":
            x = x * np.where(rng.random(shape) < 0.5, -1, 1).astype(dtype)
        return np.asarray(x, dtype)
    if domain == "positive":
        x = rng.uniform(0.1, 3.0, size=shape)
    elif domain == "nonzero":
        x = rng.uniform(0.5, 2.0, size=shape) * np.where(rng.random(shape) < 0.5, -1, 1)
    elif domain == "small":         # a few distinct values, so comparisons see ties
        x = rng.integers(-2, 3, size=shape).astype(np.float64)
    elif domain == "base":          # Pow bases: positive, so fractional exponents stay real
        x = rng.uniform(0.5, 2.0, size=shape)
    elif domain == "exp":
        x = rng.uniform(-2.0, 2.0, size=shape)
    elif domain == "unit":          # inside (-1, 1): Asin, Acos, Atanh (and Tan away from its poles)
        x = rng.uniform(-0.95, 0.95, size=shape)
    elif domain == "above1":        # Acosh
        x = rng.uniform(1.05, 4.0, size=shape)
    elif domain == "halves":        # Round's ties (to even) among ordinary values
        x = np.where(rng.random(shape) < 0.5, rng.integers(-8, 9, size=shape) * 0.5, rng.standard_normal(shape) * 3)
    elif domain == "special":       # IsInf, IsNaN
        x = rng.choice(np.array([0.0, -1.5, 2.0, 1e30, np.inf, -np.inf, np.nan]), size=shape)
    elif domain == "int_exp":
        x = rng.integers(-3, 4, size=shape).astype(np.float64)
    else:
        x = rng.standard_normal(shape) * 2.0
    return np.asarray(x, dtype)


# --- one case per (op, variant) ----------------------------------------------------------------------------

class Case:
    """One single-node graph: ``op`` with inputs made by ``make(rng, dtype, pattern)``."""

    def __init__(self, op, make, dtypes=FLOATS, attrs=None, domain="", oracle=None, tol=None, label=""):
        self.op, self.make, self.dtypes, self.attrs = op, make, dtypes, attrs or {}
        self.domain, self.oracle, self.tol, self.label = domain, oracle, tol, label

    @property
    def id(self):
        return self.op + (f"[{self.label}]" if self.label else "")

    def inputs(self, dtype, pattern):
        return self.make(rng_for(self.id, str(dtype), pattern), np.dtype(dtype), pattern)

    def build(self, inputs: dict, as_initializers=False, opset=17):
        names = [k if v is not None else "" for k, v in inputs.items()]
        while names and names[-1] == "":
            names.pop()
        present = {k: v for k, v in inputs.items() if v is not None}
        node = helper.make_node(self.op, names, ["out"], domain=self.domain, **self.attrs)
        if as_initializers:
            return model(node, {}, ["out"], initializers=present, opset=opset), {}
        return model(node, present, ["out"], opset=opset), present

    def check(self, inputs, as_initializers=False):
        m, feeds = self.build(inputs, as_initializers)
        rtol, atol = self.tol or (1e-5, 1e-6)
        if self.oracle is None:
            return assert_matches(m, feeds, rtol=rtol, atol=atol)
        ours = run_edgetrain(m, feeds)[0]
        args = [v for v in inputs.values()]
        want = np.asarray(self.oracle(self.attrs, *args))
        assert (ours.shape, ours.dtype) == (want.shape, want.dtype)
        np.testing.assert_allclose(ours, want, rtol=rtol, atol=atol)
        return [ours]


def unary(domain="any"):
    return lambda rng, dt, pattern: {"x": values(rng, shapes_for("same", rng)[0], dt, domain)}


def binary(domain_a="any", domain_b="any", dtype_b=None):
    def make(rng, dt, pattern):
        sa, sb = shapes_for(pattern, rng)
        return {"a": values(rng, sa, dt, domain_a), "b": values(rng, sb, dtype_b or dt, domain_b)}
    return make


def variadic(n, domain="any"):
    def make(rng, dt, pattern):
        shapes = shapes_for(pattern, rng, n)
        return {f"x{k}": values(rng, s, dt, domain) for k, s in enumerate(shapes)}
    return make


def clip(has_min, has_max):
    def make(rng, dt, pattern):
        x = values(rng, shapes_for("same", rng)[0], dt, "small" if dt.kind == "i" else "any")
        lo = np.array(-1, dt) if has_min else None
        hi = np.array(2, dt) if has_max else None
        return {"x": x, "min": lo, "max": hi}
    return make


def where(rng, dt, pattern):
    sc, sx = shapes_for(pattern, rng)
    return {"c": values(rng, sc, BOOL), "x": values(rng, sx, dt), "y": values(rng, (), dt)}


def prelu(rng, dt, pattern):
    shape = shapes_for("same", rng)[0]
    slope_shape = {"same": shape, "scalar": (1,), "row": shape[-1:], "column": shape[-2:-1] + (1,),
                   "leading1": (1,) + shape[1:], "both": shape[-2:-1] + (1,)}[pattern]
    return {"x": values(rng, shape, dt), "slope": values(rng, slope_shape, dt, "exp")}


def scale_inputs(rng, dt, pattern):
    x = values(rng, shapes_for("same", rng)[0], dt)
    return {"x": x, "scale": np.array(rng.uniform(0.5, 2.0), np.float32)}


def shift_inputs(rng, dt, pattern):
    sa, sb = shapes_for(pattern, rng)
    bits = dt.itemsize * 8
    lo = -2 if dt.kind == "i" else 0
    return {"x": values(rng, sa, dt), "y": rng.integers(lo, bits + 3, size=sb).astype(dt)}


def shift_oracle(attrs, x, y):
    """BitShift-28 in Python integers: out-of-range shifts leave the sign fill; left shifts wrap to the type."""
    x, y = np.broadcast_arrays(x, y)
    bits, dt = x.dtype.itemsize * 8, x.dtype
    out = []
    for a, b in zip(x.reshape(-1).tolist(), y.reshape(-1).tolist()):
        if not 0 <= b < bits:
            out.append(-1 if attrs["direction"] == "RIGHT" and a < 0 else 0)
        elif attrs["direction"] == "LEFT":
            v = (a << b) & ((1 << bits) - 1)
            out.append(v - (1 << bits) if dt.kind == "i" and v >= 1 << (bits - 1) else v)
        else:
            out.append(a >> b)
    return np.array(out, dt).reshape(x.shape)


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def gelu_oracle(attrs, x):
    return (0.5 * x.astype(np.float64) * (1.0 + _erf(x.astype(np.float64) / np.sqrt(2.0)))).astype(x.dtype)


def mean_oracle(attrs, *xs):
    return (sum(x.astype(np.float64) for x in xs) / len(xs)).astype(xs[0].dtype)


def scale_oracle(attrs, x, s):
    return (x / s if attrs.get("scale_down", 0) else x * s).astype(x.dtype)


def grad_inputs(rng, dt, pattern):
    """(dY, X or Y) of one shape, as onnxruntime's element-wise gradient ops take them. A third of X/Y is exactly
    0, as in Relu's output, where ReluGrad must pass nothing (y > 0, not y >= 0)."""
    shape = shapes_for("same", rng)[0]
    x = values(rng, shape, dt)
    x.reshape(-1)[::3] = 0
    return {"dy": values(rng, shape, dt), "x": x}


def _f64(f):
    return lambda attrs, dy, x: f(attrs, dy.astype(np.float64), x.astype(np.float64)).astype(dy.dtype)


# the math of onnxruntime's gradient ops (com.microsoft), written out in numpy
GRAD_ORACLES = {
    "GeluGrad": _f64(lambda a, dy, x: dy * (0.5 * (1 + _erf(x / np.sqrt(2))) + x * np.exp(-x * x / 2) / np.sqrt(
        2 * np.pi))),
    "LeakyReluGrad": _f64(lambda a, dy, y: np.where(y > 0, dy, a.get("alpha", 0.01) * dy)),
    "ReluGrad": _f64(lambda a, dy, y: np.where(y > 0, dy, 0.0)),
    "SigmoidGrad": _f64(lambda a, dy, y: dy * y * (1 - y)),
    "TanhGrad": _f64(lambda a, dy, y: dy * (1 - y * y)),
}

UNARY_FLOAT = {"Acos": "unit", "Acosh": "above1", "Asin": "unit", "Asinh": "any", "Atanh": "unit",
               "Cosh": "exp", "Round": "halves", "Sinh": "exp", "Tan": "unit", "IsNaN": "special",
               "Atan": "any", "Ceil": "any", "Cos": "any", "Erf": "any", "Exp": "any", "Floor": "any",
               "Log": "positive", "Reciprocal": "nonzero", "Sigmoid": "any", "Sin": "any", "Softplus": "any",
               "Sqrt": "positive", "Tanh": "any"}
UNARY_NUMERIC = ("Abs", "Neg", "Relu", "Sign")

CASES = (
    [Case(op, unary(d)) for op, d in UNARY_FLOAT.items()]
    + [Case(op, unary("any"), NUMERIC) for op in UNARY_NUMERIC]
    + [Case("Elu", unary(), attrs={"alpha": 0.7}), Case("Elu", unary(), label="default"),
       Case("HardSigmoid", unary(), attrs={"alpha": 0.3, "beta": 0.4}),
       Case("HardSigmoid", unary(), label="default"),
       Case("HardSwish", unary("any")),
       Case("LeakyRelu", unary(), attrs={"alpha": 0.2}), Case("LeakyRelu", unary(), label="default"),
       Case("Selu", unary(), label="default"), Case("Selu", unary(), attrs={"alpha": 1.5, "gamma": 2.0}),
       Case("Gelu", unary(), domain="com.microsoft", oracle=gelu_oracle),
       Case("Not", unary(), (BOOL,))]
    + [Case("IsInf", unary("special"), attrs={"detect_negative": n, "detect_positive": p}, label=f"n{n}p{p}")
       for n in (0, 1) for p in (0, 1)]
    + [Case(op, binary(), NUMERIC) for op in ("Add", "Sub", "Mul")]
    + [Case("Div", binary("any", "nonzero"), NUMERIC)]
    + [Case("Pow", binary("base", "exp"), FLOATS, label="float_exp"),
       Case("Pow", binary("any", "exp", dtype_b=I64), FLOATS, label="int_exp"),
       Case("Pow", binary("small", "exp"), (I64,), label="int_base")]
    + [Case("Mod", binary("any", "nonzero"), (I64,), attrs={"fmod": 0}, label="fmod0"),
       Case("Mod", binary("any", "nonzero"), NUMERIC, attrs={"fmod": 1}, label="fmod1"),
       Case("Mod", binary("any", "nonzero"), FLOATS, attrs={"fmod": 0}, label="fmod0_float")]
    + [Case(op, binary("small", "small"), NUMERIC) for op in ("Equal", "Greater", "GreaterOrEqual", "Less",
                                                              "LessOrEqual")]
    + [Case("Equal", binary(), (BOOL,), label="bool"), Case("And", binary(), (BOOL,)),
       Case("Or", binary(), (BOOL,))]
    + [Case("Xor", binary(), (BOOL,))]
    + [Case(op, binary(), NARROW, label="narrow") for op in ("Add", "Sub", "Mul", "Max", "Min", "Less")]
    + [Case("Div", binary("any", "nonzero"), NARROW, label="narrow")]
    # opset 18+ ops beyond the reference evaluator's opset 17 models here: numpy's integer ops are the oracle
    + [Case(op, binary(), INTEGERS, oracle=lambda attrs, a, b, f=f: f(a, b))
       for op, f in (("BitwiseAnd", np.bitwise_and), ("BitwiseOr", np.bitwise_or), ("BitwiseXor", np.bitwise_xor))]
    + [Case("BitwiseNot", unary(), INTEGERS, oracle=lambda attrs, x: np.invert(x))]
    + [Case("BitShift", shift_inputs, INTEGERS, attrs={"direction": d}, oracle=shift_oracle, label=d.lower())
       for d in ("LEFT", "RIGHT")]
    + [Case("PRelu", prelu, NUMERIC), Case("Where", where, NUMERIC + (BOOL,))]
    + [Case("Clip", clip(lo, hi), NUMERIC, label=f"min{int(lo)}_max{int(hi)}")
       for lo in (False, True) for hi in (False, True)]
    # the reference evaluator's Mean adds in place into its first input, so it cannot broadcast that one, and
    # onnxruntime has no double Mean: its oracle is the numpy formula
    + [Case(op, variadic(n), dtypes, label=f"{n}in", oracle=mean_oracle if op == "Mean" else None)
       for op, dtypes in (("Max", NUMERIC), ("Min", NUMERIC), ("Sum", FLOATS), ("Mean", FLOATS))
       for n in (1, 2, 3)]
    + [Case("Scale", scale_inputs, domain="com.microsoft", oracle=scale_oracle, label="up"),
       Case("Scale", scale_inputs, attrs={"scale_down": 1}, domain="com.microsoft", oracle=scale_oracle,
            label="down")]
    + [Case(op, grad_inputs, domain="com.microsoft", oracle=oracle) for op, oracle in GRAD_ORACLES.items()]
    + [Case("LeakyReluGrad", grad_inputs, attrs={"alpha": 0.3}, domain="com.microsoft",
            oracle=GRAD_ORACLES["LeakyReluGrad"], label="alpha")]
)


def _params():
    """(case, dtype, pattern): every dtype of every case; broadcast patterns taken in turn down the table."""
    out, k = [], 0
    for case in CASES:
        for dt in case.dtypes:
            pattern = PATTERNS[k % len(PATTERNS)]
            k += 1
            out.append(pytest.param(case, dt, pattern, id=f"{case.id}-{dt}-{pattern}"))
    return out


PARAMS = _params()


def test_every_elementwise_op_is_covered():
    tested = {(c.domain, c.op) for c in CASES} | {("", "Gelu")}    # opset 20: its own tests at the end
    assert {op.key for op in elementwise.OPS} <= tested


@pytest.mark.parametrize("case, dtype, pattern", PARAMS)
def test_kernel_matches_oracle(case, dtype, pattern):
    case.check(case.inputs(dtype, pattern))


@pytest.mark.parametrize("case, dtype, pattern", PARAMS)
def test_fold_matches_oracle(case, dtype, pattern):
    """All inputs are initializers: planning folds the node with its numpy form."""
    inputs = case.inputs(dtype, pattern)
    m, _ = case.build(inputs, as_initializers=True)
    sess = edgetrain.InferenceSession(m.SerializeToString())
    assert sess.program({}).plan.n_kernels == 0
    case.check(inputs, as_initializers=True)


@pytest.mark.parametrize("op", ["Add", "Div", "Where", "Max"])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_broadcast_patterns(op, pattern):
    case = next(c for c in CASES if c.op == op)
    case.check(case.inputs(F32, pattern))


INT32_OPS = ("Add", "Sub", "Mul", "Div", "Mod[fmod0]", "Mod[fmod1]", "Abs", "Neg", "Relu", "Sign", "Max[3in]",
             "Clip[min1_max1]", "Pow[int_base]", "Greater", "Where")


@pytest.mark.parametrize("case", [c for c in CASES if c.id in INT32_OPS], ids=lambda c: c.id)
def test_int32(case):
    case.check(case.inputs(np.int32, "both" if case.op in ("Add", "Where", "Max") else "row"))


def test_max_min_propagate_nan():
    a = np.array([np.nan, 1.0, np.nan, -np.inf], np.float32)
    b = np.array([1.0, np.nan, np.nan, 2.0], np.float32)
    nodes = [helper.make_node("Max", ["a", "b"], ["mx"]), helper.make_node("Min", ["a", "b", "b"], ["mn"])]
    m = model(nodes, {"a": a, "b": b}, ["mx", "mn"])
    mx, mn = assert_matches(m, {"a": a, "b": b})
    assert np.isnan(mx[:3]).all() and np.isnan(mn[:3]).all()


def test_broadcast_rank_mismatch_both_sides_and_empty():
    rng = rng_for("ranks")
    a, b = values(rng, (2, 1, 4, 1), F32), values(rng, (3, 1, 5), F32)
    m = model(helper.make_node("Sub", ["a", "b"], ["y"]), {"a": a, "b": b}, ["y"])
    assert assert_matches(m, {"a": a, "b": b})[0].shape == (2, 3, 4, 5)
    a, b = values(rng, (0, 3), F32), values(rng, (3,), F32)
    m = model(helper.make_node("Mul", ["a", "b"], ["y"]), {"a": a, "b": b}, ["y"])
    assert assert_matches(m, {"a": a, "b": b})[0].shape == (0, 3)


# --- edge values -------------------------------------------------------------------------------------------

SPECIAL = np.array([0.0, -0.0, 1e-30, -1e-30, 0.5, -0.5, 1.5, -2.5, 50, -50, 100, -100, 1e30, -1e30,
                    np.inf, -np.inf, np.nan], np.float32)

# numpy formulas where the reference evaluator is itself naive about overflow
STABLE = {"Softplus": lambda x: np.logaddexp(x, np.float32(0)),
          "Sigmoid": lambda x: (1 / (1 + np.exp(-x.astype(np.float64)))).astype(np.float32)}


@pytest.mark.parametrize("op", sorted(UNARY_FLOAT) + list(UNARY_NUMERIC) + ["Elu", "HardSigmoid", "HardSwish",
                                                                            "LeakyRelu", "Selu", "IsInf"])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_special_values(op):
    """inf, nan, signed zeros and overflow-prone magnitudes: no exception, no int conversion, NaN kept."""
    x = SPECIAL.reshape(1, -1)
    m = model(helper.make_node(op, ["x"], ["y"]), {"x": x}, ["y"])
    ours = run_edgetrain(m, {"x": x})[0]
    with np.errstate(all="ignore"):
        want = STABLE[op](x) if op in STABLE else run_reference(m, {"x": x})[0]
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-6)
    # and the folded form agrees
    m0 = model(helper.make_node(op, ["x"], ["y"]), {}, ["y"], initializers={"x": x})
    np.testing.assert_allclose(run_edgetrain(m0, {})[0], want, rtol=1e-5, atol=1e-6)


def test_sigmoid_softplus_do_not_warn_when_folding():
    x = np.array([-1000.0, -100.0, 0.0, 100.0, 1000.0], np.float32)
    for op in ("Sigmoid", "Softplus"):
        m = model(helper.make_node(op, ["x"], ["y"]), {}, ["y"], initializers={"x": x})
        with np.errstate(all="raise"):
            y = run_edgetrain(m, {})[0]
        assert np.all(np.isfinite(y))


@pytest.mark.parametrize("as_init", [False, True])
def test_float_division_by_zero_gives_inf(as_init):
    a = np.array([1.0, -1.0, 0.0, 2.0], np.float32)
    b = np.array([0.0, 0.0, 0.0, 4.0], np.float32)
    nodes = [helper.make_node("Div", ["a", "b"], ["q"]), helper.make_node("Reciprocal", ["b"], ["r"]),
             helper.make_node("Mod", ["a", "b"], ["m"], fmod=1)]
    if as_init:
        m, feeds = model(nodes, {}, ["q", "r", "m"], initializers={"a": a, "b": b}), {}
    else:
        m, feeds = model(nodes, {"a": a, "b": b}, ["q", "r", "m"]), {"a": a, "b": b}
    q, r, md = run_edgetrain(m, feeds)
    np.testing.assert_array_equal(q, [np.inf, -np.inf, np.nan, 0.5])
    np.testing.assert_array_equal(r, [np.inf, np.inf, np.inf, 0.25])
    np.testing.assert_array_equal(md, [np.nan, np.nan, np.nan, 2.0])


def test_integer_division_truncates_and_mod_signs():
    a = np.array([7, -7, 7, -7, 0, 6, -6, 9_007_199_254_740_993], np.int64)
    b = np.array([2, 2, -2, -2, 3, -3, 4, 2], np.int64)
    nodes = [helper.make_node("Div", ["a", "b"], ["q"]), helper.make_node("Mod", ["a", "b"], ["m0"]),
             helper.make_node("Mod", ["a", "b"], ["m1"], fmod=1)]
    expect = [np.array([3, -3, -3, 3, 0, -2, -1, 4_503_599_627_370_496]),
              np.array([1, 1, -1, -1, 0, 0, 2, 1]), np.array([1, -1, 1, -1, 0, 0, -2, 1])]
    for as_init in (False, True):
        if as_init:
            m, feeds = model(nodes, {}, ["q", "m0", "m1"], initializers={"a": a, "b": b}), {}
        else:
            m, feeds = model(nodes, {"a": a, "b": b}, ["q", "m0", "m1"]), {"a": a, "b": b}
        for got, want in zip(run_edgetrain(m, feeds), expect):
            np.testing.assert_array_equal(got, want)
        assert_matches(m, feeds)


# --- fusion ------------------------------------------------------------------------------------------------

def _chain_model(rng):
    x = values(rng, (3, 4, 5), F32)
    b = values(rng, (4, 1), F32)
    s = values(rng, (5,), F32)
    nodes = [helper.make_node("Add", ["x", "b"], ["t"]),
             helper.make_node("Relu", ["t"], ["r"]),
             helper.make_node("Mul", ["r", "s"], ["y"]),
             helper.make_node("Sigmoid", ["y"], ["z"]),
             helper.make_node("Sub", ["z", "t"], ["w"])]
    feeds = {"x": x, "b": b, "s": s}
    return model(nodes, feeds, ["w", "r"]), feeds


def test_fused_chain_with_broadcast_and_intermediate_output():
    m, feeds = _chain_model(rng_for("chain"))
    plan = edgetrain.InferenceSession(m.SerializeToString()).program(feeds).plan
    assert plan.n_kernels == 1 and plan.n_ops == 5          # Add->Relu->Mul->Sigmoid->Sub in one loop
    assert_matches(m, feeds)


@pytest.mark.parametrize("env", ["EDGETRAIN_NO_FUSION", "EDGETRAIN_NO_PLANNER", "both"])
def test_switches_give_same_answer(monkeypatch, env):
    m, feeds = _chain_model(rng_for("chain"))
    base = run_edgetrain(m, feeds)
    for name in (["EDGETRAIN_NO_FUSION", "EDGETRAIN_NO_PLANNER"] if env == "both" else [env]):
        monkeypatch.setenv(name, "1")
    plan = edgetrain.InferenceSession(m.SerializeToString()).program(feeds).plan
    if env != "EDGETRAIN_NO_PLANNER":
        assert plan.n_kernels == 5
    other = run_edgetrain(m, feeds)
    for a, b in zip(base, other):
        np.testing.assert_array_equal(a, b)
    assert_matches(m, feeds)


def test_groups_of_different_shapes_and_outside_reader():
    """A column-shaped chain feeding a full-shaped one, and a value read both inside a group and by MatMul."""
    rng = rng_for("groups")
    x, c, w = values(rng, (4, 6), F32), values(rng, (4, 1), F32), values(rng, (6, 3), F32)
    nodes = [helper.make_node("Exp", ["c"], ["ce"]),          # group of shape (4, 1)
             helper.make_node("Neg", ["ce"], ["cn"]),
             helper.make_node("Tanh", ["x"], ["xt"]),         # group of shape (4, 6)
             helper.make_node("Add", ["xt", "cn"], ["s"]),    # reads both groups
             helper.make_node("MatMul", ["s", "w"], ["mm"]),   # outside reader of s
             helper.make_node("Mul", ["s", "s"], ["sq"]),
             helper.make_node("Relu", ["mm"], ["out"])]
    feeds = {"x": x, "c": c, "w": w}
    m = model(nodes, feeds, ["out", "sq", "cn"])
    assert_matches(m, feeds, rtol=1e-5, atol=1e-5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGETRAIN_NO_FUSION", "1")
        assert_matches(m, feeds, rtol=1e-5, atol=1e-5)


def test_repeated_runs_reuse_the_arena():
    m, feeds = _chain_model(rng_for("chain"))
    sess = edgetrain.InferenceSession(m.SerializeToString())
    first = sess.run(None, feeds)
    feeds2 = {k: v + np.float32(1) for k, v in feeds.items()}
    second = sess.run(None, feeds2)
    again = sess.run(None, feeds)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(second, run_reference(m, feeds2)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# --- shape-rule errors -------------------------------------------------------------------------------------

def _plan(m, feeds):
    return edgetrain.InferenceSession(m.SerializeToString()).program(feeds)


def test_non_broadcastable_add_names_the_node():
    a, b = np.zeros((3, 4), np.float32), np.zeros((3, 5), np.float32)
    m = model(helper.make_node("Add", ["a", "b"], ["y"], name="bad_add"), {"a": a, "b": b}, ["y"])
    with pytest.raises(ShapeError, match="bad_add.*do not broadcast"):
        _plan(m, {"a": a, "b": b})


def test_mixed_dtypes_rejected():
    a, b = np.zeros((3,), np.float32), np.zeros((3,), np.float64)
    m = model(helper.make_node("Mul", ["a", "b"], ["y"], name="mixed"), {"a": a, "b": b}, ["y"])
    with pytest.raises(ShapeError, match="mixed"):
        _plan(m, {"a": a, "b": b})


def test_where_condition_must_be_bool():
    c, x = np.zeros((3,), np.float32), np.zeros((3,), np.float32)
    m = model(helper.make_node("Where", ["c", "x", "x"], ["y"], name="w"), {"c": c, "x": x}, ["y"])
    with pytest.raises(ShapeError, match="'w'.*bool"):
        _plan(m, {"c": c, "x": x})


def test_prelu_slope_must_broadcast_to_x():
    x, s = np.zeros((3, 1), np.float32), np.zeros((4,), np.float32)
    m = model(helper.make_node("PRelu", ["x", "s"], ["y"], name="pr"), {"x": x, "s": s}, ["y"])
    with pytest.raises(ShapeError, match="'pr'"):
        _plan(m, {"x": x, "s": s})


def test_unsupported_dtype_names_the_node():
    x = np.zeros((3,), np.int64)
    m = model(helper.make_node("Exp", ["x"], ["y"], name="int_exp"), {"x": x}, ["y"])
    with pytest.raises(EdgetrainError, match="int_exp"):
        _plan(m, {"x": x})


# --- ai.onnx Gelu (opset 20): both approximations ------------------------------------------------------------

@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
def test_onnx_gelu_against_the_reference_and_onnxruntime(approximate, dtype):
    x = np.linspace(-6, 6, 60).astype(dtype).reshape(5, 12)
    m = model(helper.make_node("Gelu", ["x"], ["y"], approximate=approximate), {"x": x}, ["y"], opset=20)
    assert_matches(m, {"x": x}, oracle=run_reference)
    if dtype == F32:                   # onnxruntime implements Gelu for float only
        from oracle import run_onnxruntime
        assert_matches(m, {"x": x}, oracle=run_onnxruntime)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_onnx_gelu_gradient_by_finite_differences(approximate):
    from gradcheck import check_gradients

    from edgetrain.ir import Node, TensorType
    x = np.linspace(-4, 4, 24).reshape(4, 6)
    check_gradients([Node("Gelu", ["x"], ["y"], {"approximate": approximate}, "gelu")], {"x": x}, ["y"],
                    [TensorType(F64, (4, 6))], opset=20)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_gelu_grad_float32_over_the_whole_range():
    """GeluGrad's float32 loop (polynomial erf and exp, ``kernels/elementwise.HELPERS``) against the float64
    formula from the Gaussian's tails to the middle, where its exp(-x^2/2) term is largest, and at NaN."""
    x = np.concatenate([np.linspace(-14, 14, 4001), [np.nan, -0.0, 40.0, -40.0]]).astype(F32)
    dy = np.linspace(-2, 3, x.size).astype(F32)
    node = helper.make_node("GeluGrad", ["dy", "x"], ["dx"], domain="com.microsoft")
    m = model(node, {"dy": dy, "x": x}, ["dx"])
    ours = run_edgetrain(m, {"dy": dy, "x": x})[0]
    want = GRAD_ORACLES["GeluGrad"]({}, dy, x)
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-6)


def test_mod_gradient_by_finite_differences():
    """fmod: d/da = 1, d/db = -trunc(a / b), away from the jumps at multiples of b; b broadcast over rows."""
    from gradcheck import check_gradients

    from edgetrain.ir import Node, TensorType
    a = np.array([[5.3, -7.2, 2.9], [9.1, -0.4, 3.3]])
    b = np.array([2.1, 1.9, -1.3])
    check_gradients([Node("Mod", ["a", "b"], ["y"], {"fmod": 1}, "mod")], {"a": a, "b": b}, ["y"],
                    [TensorType(F64, (2, 3))])
