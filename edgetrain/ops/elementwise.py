"""Element-wise ops: broadcasting shape rule, numpy form (for constant folding) and dtypes.

Their loops are generated and fused by the planner; each op's scalar template is in
``edgetrain.kernels.elementwise.SCALAR`` under the same name.
"""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from ..ir.dtypes import FLOATS
from .attrs import REQUIRED, Flag, Float, String
from .base import ALL_NUMERIC, ANY, INTEGERS, NUMERIC, SIGNED, NodeContext, OpDef, broadcast_shapes

BOOL = np.dtype(np.bool_)
LEAKY_ALPHA = Float(0.01)    # LeakyRelu's slope, which its gradient op LeakyReluGrad carries too


def _rule(out_dtype=None, same_dtype_inputs=None, cond_input=None, unidirectional=False):
    """Broadcast every present input; output dtype = ``out_dtype`` or that of the first T input.

    ``cond_input``: an input that must be bool (Where's condition). ``unidirectional``: the other inputs
    must broadcast to input 0's shape, which is the output shape (PRelu's slope).
    """
    def infer(ctx: NodeContext):
        present = [i for i in range(len(ctx.node.inputs)) if ctx.has_input(i)]
        if not present:
            raise ctx.error("needs at least one input")
        t_inputs = same_dtype_inputs if same_dtype_inputs is not None else present
        t_inputs = [i for i in t_inputs if ctx.has_input(i)]
        if not t_inputs:
            raise ctx.error("input 0 is required")
        dtypes = {ctx.type(i).dtype for i in t_inputs}
        if len(dtypes) > 1:
            raise ctx.error("inputs must share one element type, got " + ", ".join(str(d) for d in sorted(dtypes, key=str)))
        if cond_input is not None and ctx.type(cond_input).dtype != BOOL:
            raise ctx.error(f"input {cond_input} (condition) must be bool, got {ctx.type(cond_input).dtype}")
        shape = broadcast_shapes(ctx, *(ctx.shape(i) for i in present))
        if unidirectional and shape != tuple(ctx.shape(0)):
            shapes = [ctx.shape(i) for i in present]
            raise ctx.error(f"input shapes {shapes} must broadcast to input 0's shape {ctx.shape(0)}")
        dtype = out_dtype if out_dtype is not None else ctx.type(t_inputs[0]).dtype
        return [TensorType(dtype, shape)]
    return infer


def _int_div(a, b):
    """ONNX Div: true division for floats, truncation toward zero for integers (exact, in integers)."""
    if np.issubdtype(np.result_type(a, b), np.integer):
        q = np.floor_divide(a, b)
        return q + ((np.remainder(a, b) != 0) & ((a < 0) != (b < 0))).astype(q.dtype)
    return np.true_divide(a, b)


def _bitshift(ctx, x, y):
    width = np.dtype(x.dtype).itemsize * 8
    inside = (y >= 0) & (y < width)
    safe = np.where(inside, y, 0).astype(x.dtype)
    if ctx.attr("direction") == "LEFT":
        return np.where(inside, np.left_shift(x, safe), 0).astype(x.dtype)
    fill = np.where(x < 0, -1, 0) if np.issubdtype(x.dtype, np.signedinteger) else 0
    return np.where(inside, np.right_shift(x, safe), fill).astype(x.dtype)


def _sigmoid(x):
    """1 / (1 + exp(-x)) without overflowing: exp only of -|x|."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _mod(ctx, a, b):
    return np.fmod(a, b) if ctx.attr("fmod") else np.mod(a, b)


def _clip(ctx, x, lo=None, hi=None):
    if lo is not None:
        x = np.maximum(x, lo)
    if hi is not None:
        x = np.minimum(x, hi)
    return x


GELU_TANH = (0.7978845608028654, 0.044715)     # sqrt(2 / pi), and the cubic term of the tanh approximation


def _gelu(ctx, x):
    if ctx.op.domain == "" and ctx.attr("approximate") == "tanh":
        c, a = GELU_TANH
        return (0.5 * x * (1.0 + np.tanh(c * (x + a * x ** 3)))).astype(x.dtype)
    from math import erf
    return (0.5 * x * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))).astype(x.dtype)


def _gelu_vjp(g, dy):
    """erf form: com.microsoft GeluGrad(dY, X); tanh form, with t = tanh(c x (1 + a x^2)):
    dX = dY (0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2)), in plain ops (fused into one loop)."""
    if g.node.domain != "" or g.attr("approximate") == "none":
        return g.emit("GeluGrad", [dy, g.x(0)], domain="com.microsoft")
    c, a = GELU_TANH
    x = g.x(0)
    x2 = g.emit("Mul", [x, x])
    t = g.emit("Tanh", [g.emit("Mul", [_c(g, c, "c"), g.emit("Mul", [x, g.emit("Add", [_c(g, 1, "one"), g.emit(
        "Mul", [_c(g, a, "a"), x2])])])])])
    slope = g.emit("Mul", [_c(g, c, "c"), g.emit("Add", [_c(g, 1, "one"), g.emit("Mul", [_c(g, 3 * a, "a3"), x2])])])
    half = _c(g, 0.5, "half")
    first = g.emit("Mul", [half, g.emit("Add", [_c(g, 1, "one"), t])])
    second = g.emit("Mul", [g.emit("Mul", [half, x]), g.emit("Mul", [g.emit("Sub", [_c(g, 1, "one"), g.emit(
        "Mul", [t, t])]), slope])])
    return g.emit("Mul", [dy, g.emit("Add", [first, second])])


def _erf(ctx, x):
    from math import erf
    return np.vectorize(erf, otypes=[x.dtype])(x)


def ew(op_type, fold, dtypes=FLOATS, *, out_dtype=None, t_inputs=None, cond_input=None, unidirectional=False,
       domain="", since=13, attrs=None, doc=""):
    """An element-wise OpDef; ``fold(ctx, *arrays)`` is its numpy form, its gradient rule ``GRADIENTS[op_type]``."""
    return OpDef(op_type, _rule(out_dtype, t_inputs, cond_input, unidirectional), domain=domain, since=since,
                 kind="elementwise", fold=_quiet(fold), dtypes=dtypes,
                 type_input=t_inputs[0] if t_inputs else 0, vjp=GRADIENTS.get((domain, op_type)), attrs=attrs or {},
                 doc=doc)


def _quiet(fold):
    """Fold like the generated kernels compute: inf/nan results (log(0), x/0, overflow) without warnings."""
    def run(ctx, *xs):
        with np.errstate(all="ignore"):
            return fold(ctx, *xs)
    return run


def _np(f):
    return lambda ctx, *xs: f(*xs)


# --- gradient rules: (g, [dY]) -> [dX per input]; they emit nodes (see edgetrain.autodiff) --------------------

def _dtype(g, i=0):
    return g.in_types[i].dtype


def _per_input(g, grads):
    """Unbroadcast each needed input's gradient; ``grads[i]()`` builds it only when input i needs one."""
    return [g.unbroadcast(make(), i) if g.needs[i] and make is not None else None for i, make in enumerate(grads)]


def _add_vjp(g, dys):
    return _per_input(g, [lambda: dys[0], lambda: dys[0]])


def _sub_vjp(g, dys):
    return _per_input(g, [lambda: dys[0], lambda: g.emit("Neg", [dys[0]])])


def _mul_vjp(g, dys):
    return _per_input(g, [lambda: g.emit("Mul", [dys[0], g.x(1)]), lambda: g.emit("Mul", [dys[0], g.x(0)])])


def _div_vjp(g, dys):
    # d(a/b)/da = 1/b, d(a/b)/db = -(a/b)/b
    return _per_input(g, [lambda: g.emit("Div", [dys[0], g.x(1)]),
                          lambda: g.emit("Neg", [g.emit("Mul", [dys[0], g.emit("Div", [g.y(), g.x(1)])])])])


def _mod_vjp(g, dys):
    """a = q b + y with q = trunc(a / b) (fmod) or floor (integers, no gradient): d/da = 1, d/db = -q = -(a - y) / b."""
    return _per_input(g, [lambda: dys[0], lambda: g.emit("Neg", [g.emit("Mul", [dys[0], g.emit("Div", [
        g.emit("Sub", [g.x(0), g.y()]), g.x(1)])])])])


def _pow_vjp(g, dys):
    # d(x^p)/dx = p x^(p-1); d(x^p)/dp = x^p ln x
    def dx():
        p = g.x(1) if _dtype(g, 1) == _dtype(g) else g.emit("Cast", [g.x(1)], {"to": _onnx_type(_dtype(g))})
        one = g.const(1, _dtype(g), "one")
        return g.emit("Mul", [dys[0], g.emit("Mul", [p, g.emit("Pow", [g.x(0), g.emit("Sub", [p, one])])])])
    return _per_input(g, [dx, lambda: g.emit("Mul", [dys[0], g.emit("Mul", [g.y(), g.emit("Log", [g.x(0)])])])])


def _onnx_type(dtype):
    from ..ir.dtypes import to_onnx
    return to_onnx(dtype)


def _unary(build):
    """A rule for a one-input op: ``build(g, dy) -> dx``."""
    return lambda g, dys: [build(g, dys[0])] + [None] * (len(g.node.inputs) - 1)


def _clip_vjp(g, dys):
    # pass the gradient where lo <= x <= hi, as torch.clamp does
    x, conds = g.x(0), []
    if len(g.node.inputs) > 1 and g.node.inputs[1]:
        conds.append(g.emit("GreaterOrEqual", [x, g.x(1)]))
    if len(g.node.inputs) > 2 and g.node.inputs[2]:
        conds.append(g.emit("LessOrEqual", [x, g.x(2)]))
    if not conds:
        return [dys[0], None, None]
    keep = conds[0] if len(conds) == 1 else g.emit("And", conds)
    return [g.emit("Where", [keep, dys[0], g.const(0, _dtype(g), "zero")])] + [None] * (len(g.node.inputs) - 1)


def _where_vjp(g, dys):
    zero = g.const(0, _dtype(g, 1), "zero")
    return [None] + _per_input(g, [None, lambda: g.emit("Where", [g.x(0), dys[0], zero]),
                                   lambda: g.emit("Where", [g.x(0), zero, dys[0]])])[1:]


def _variadic_vjp(scale_by_count: bool):
    def rule(g, dys):
        dy = dys[0]
        if scale_by_count:
            dy = g.emit("Div", [dy, g.const(len(g.node.inputs), _dtype(g), "count")])
        return _per_input(g, [lambda: dy] * len(g.node.inputs))
    return rule


def _prelu_vjp(g, dys):
    pos = g.emit("GreaterOrEqual", [g.x(0), g.const(0, _dtype(g), "zero")])
    zero = g.const(0, _dtype(g), "zero")
    return _per_input(g, [lambda: g.emit("Where", [pos, dys[0], g.emit("Mul", [dys[0], g.x(1)])]),
                          lambda: g.emit("Where", [pos, zero, g.emit("Mul", [dys[0], g.x(0)])])])


def _elu_like(g, dy, alpha, gamma=1.0):
    # x > 0: gamma; else gamma * alpha * e^x = y + gamma * alpha
    t = _dtype(g)
    neg = g.emit("Mul", [dy, g.emit("Add", [g.y(), g.const(gamma * alpha, t, "ga")])])
    pos = dy if gamma == 1.0 else g.emit("Mul", [dy, g.const(gamma, t, "gamma")])
    return g.emit("Where", [g.emit("Greater", [g.x(0), g.const(0, t, "zero")]), pos, neg])


def _hard_sigmoid(g, dy):
    t = _dtype(g)
    inside = g.emit("And", [g.emit("Greater", [g.y(), g.const(0, t, "zero")]),
                            g.emit("Less", [g.y(), g.const(1, t, "one")])])
    return g.emit("Where", [inside, g.emit("Mul", [dy, g.const(g.attr("alpha"), t, "alpha")]),
                            g.const(0, t, "zero")])


def _hard_swish(g, dy):
    # x < -3: 0; x > 3: 1; else (2x + 3) / 6
    t, x = _dtype(g), g.x(0)
    mid = g.emit("Add", [g.emit("Mul", [x, g.const(1 / 3, t, "third")]), g.const(0.5, t, "half")])
    slope = g.emit("Where", [g.emit("Less", [x, g.const(-3, t, "m3")]), g.const(0, t, "zero"),
                             g.emit("Where", [g.emit("Greater", [x, g.const(3, t, "p3")]), g.const(1, t, "one"),
                                              mid])])
    return g.emit("Mul", [dy, slope])


def _c(g, value, label):
    return g.const(value, _dtype(g), label)


def _square(g):
    return g.emit("Mul", [g.x(0), g.x(0)])


def _sqrt_of(g, op, a, b):
    """sqrt(a op b), numbers among a and b made constants of the input's type (the inverse trig derivatives)."""
    a, b = (_c(g, v, f"k{v}") if isinstance(v, (int, float)) else v for v in (a, b))
    return g.emit("Sqrt", [g.emit(op, [a, b])])


GRADIENTS = {
    ("", "Abs"): _unary(lambda g, dy: g.emit("Mul", [dy, g.emit("Sign", [g.x(0)])])),
    ("", "Add"): _add_vjp,
    ("", "Acos"): _unary(lambda g, dy: g.emit("Neg", [g.emit("Div", [dy, _sqrt_of(g, "Sub", 1, _square(g))])])),
    ("", "Acosh"): _unary(lambda g, dy: g.emit("Div", [dy, _sqrt_of(g, "Sub", _square(g), 1)])),
    ("", "Asin"): _unary(lambda g, dy: g.emit("Div", [dy, _sqrt_of(g, "Sub", 1, _square(g))])),
    ("", "Asinh"): _unary(lambda g, dy: g.emit("Div", [dy, _sqrt_of(g, "Add", _square(g), 1)])),
    ("", "Atan"): _unary(lambda g, dy: g.emit("Div", [dy, g.emit("Add", [_c(g, 1, "one"),
                                                                         g.emit("Mul", [g.x(0), g.x(0)])])])),
    ("", "Atanh"): _unary(lambda g, dy: g.emit("Div", [dy, g.emit("Sub", [_c(g, 1, "one"), _square(g)])])),
    ("", "Clip"): _clip_vjp,
    ("", "Cos"): _unary(lambda g, dy: g.emit("Neg", [g.emit("Mul", [dy, g.emit("Sin", [g.x(0)])])])),
    ("", "Cosh"): _unary(lambda g, dy: g.emit("Mul", [dy, g.emit("Sinh", [g.x(0)])])),
    ("", "Div"): _div_vjp,
    ("", "Elu"): _unary(lambda g, dy: _elu_like(g, dy, g.attr("alpha"))),
    ("", "Erf"): _unary(lambda g, dy: g.emit("Mul", [dy, g.emit("Mul", [_c(g, 2 / np.sqrt(np.pi), "k"), g.emit(
        "Exp", [g.emit("Neg", [g.emit("Mul", [g.x(0), g.x(0)])])])])])),
    ("", "Exp"): _unary(lambda g, dy: g.emit("Mul", [dy, g.y()])),
    ("", "HardSigmoid"): _unary(_hard_sigmoid),
    ("", "HardSwish"): _unary(_hard_swish),
    ("", "LeakyRelu"): _unary(lambda g, dy: g.emit("LeakyReluGrad", [dy, g.y()], {"alpha": g.attr("alpha")},
                                                   "com.microsoft")),
    ("", "Log"): _unary(lambda g, dy: g.emit("Div", [dy, g.x(0)])),
    ("", "Mean"): _variadic_vjp(scale_by_count=True),
    ("", "Mod"): _mod_vjp,
    ("", "Mul"): _mul_vjp,
    ("", "Neg"): _unary(lambda g, dy: g.emit("Neg", [dy])),
    ("", "PRelu"): _prelu_vjp,
    ("", "Pow"): _pow_vjp,
    ("", "Reciprocal"): _unary(lambda g, dy: g.emit("Neg", [g.emit("Mul", [dy, g.emit("Mul", [g.y(), g.y()])])])),
    ("", "Relu"): _unary(lambda g, dy: g.emit("ReluGrad", [dy, g.y()], domain="com.microsoft")),
    ("", "Selu"): _unary(lambda g, dy: _elu_like(g, dy, g.attr("alpha"), g.attr("gamma"))),
    ("", "Sigmoid"): _unary(lambda g, dy: g.emit("SigmoidGrad", [dy, g.y()], domain="com.microsoft")),
    ("", "Sin"): _unary(lambda g, dy: g.emit("Mul", [dy, g.emit("Cos", [g.x(0)])])),
    ("", "Sinh"): _unary(lambda g, dy: g.emit("Mul", [dy, g.emit("Cosh", [g.x(0)])])),
    ("", "Softplus"): _unary(lambda g, dy: g.emit("Mul", [dy, g.emit("Sigmoid", [g.x(0)])])),
    ("", "Sqrt"): _unary(lambda g, dy: g.emit("Div", [dy, g.emit("Mul", [g.y(), _c(g, 2, "two")])])),
    ("", "Sub"): _sub_vjp,
    ("", "Sum"): _variadic_vjp(scale_by_count=False),
    ("", "Tan"): _unary(lambda g, dy: g.emit("Mul", [dy, g.emit("Add", [_c(g, 1, "one"), g.emit("Mul", [g.y(), g.y()])])])),
    ("", "Tanh"): _unary(lambda g, dy: g.emit("TanhGrad", [dy, g.y()], domain="com.microsoft")),
    ("", "Where"): _where_vjp,
    ("", "Gelu"): _unary(_gelu_vjp),
    ("com.microsoft", "Gelu"): _unary(_gelu_vjp),
    ("com.microsoft", "Scale"): lambda g, dys: [g.emit("Scale", [dys[0], g.x(1)],
                                                       {"scale_down": g.attr("scale_down")}, "com.microsoft"),
                                                None],
}


# --- gradient ops (onnxruntime's com.microsoft vocabulary); element-wise, so they fuse like any other -------

def grad_op(op_type, fold, doc, attrs=None):
    return OpDef(op_type, _rule(same_dtype_inputs=[0, 1]), domain="com.microsoft", since=1, kind="elementwise",
                 fold=_quiet(fold), attrs=attrs or {}, doc=doc)


def _gelu_grad(ctx, dy, x):
    from math import erf
    cdf = 0.5 * (1.0 + np.vectorize(erf, otypes=[np.float64])(x / np.sqrt(2.0)))
    return (dy * (cdf + x * np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi))).astype(x.dtype)


GRAD_OPS = (
    grad_op("GeluGrad", _gelu_grad, "dX = dY * (Phi(x) + x * phi(x))"),
    grad_op("LeakyReluGrad", lambda ctx, dy, y: np.where(y > 0, dy, ctx.attr("alpha") * dy),
            "dX = dY where Y > 0, alpha * dY elsewhere", {"alpha": LEAKY_ALPHA}),
    grad_op("ReluGrad", lambda ctx, dy, y: np.where(y > 0, dy, 0).astype(dy.dtype), "dX = dY where X (or Y) > 0"),
    grad_op("SigmoidGrad", lambda ctx, dy, y: dy * y * (1 - y), "dX = dY * Y * (1 - Y)"),
    grad_op("TanhGrad", lambda ctx, dy, y: dy * (1 - y * y), "dX = dY * (1 - Y^2)"),
)


def _is_inf(ctx, x):
    return (np.isposinf(x) & bool(ctx.attr("detect_positive"))) | (np.isneginf(x) & bool(ctx.attr("detect_negative")))


OPS = GRAD_OPS + (
    ew("Abs", _np(np.abs), NUMERIC),
    ew("Acos", _np(np.arccos), since=7),
    ew("Acosh", _np(np.arccosh), since=9),
    ew("Add", _np(np.add), NUMERIC, since=14),
    ew("And", _np(np.logical_and), (BOOL,), since=7),
    ew("Asin", _np(np.arcsin), since=7),
    ew("Asinh", _np(np.arcsinh), since=9),
    ew("Atan", _np(np.arctan), since=7),
    ew("Atanh", _np(np.arctanh), since=9),
    ew("BitShift", _bitshift, INTEGERS, since=28, attrs={"direction": String(REQUIRED, ("LEFT", "RIGHT"))},
       doc="opset 28: signed types; out-of-range shifts leave the sign fill"),
    ew("BitwiseAnd", _np(np.bitwise_and), INTEGERS, since=18),
    ew("BitwiseNot", _np(np.invert), INTEGERS, since=18),
    ew("BitwiseOr", _np(np.bitwise_or), INTEGERS, since=18),
    ew("BitwiseXor", _np(np.bitwise_xor), INTEGERS, since=18),
    ew("Ceil", _np(np.ceil)),
    ew("Clip", _clip, NUMERIC),
    ew("Cos", _np(np.cos), since=7),
    ew("Cosh", _np(np.cosh), since=9),
    ew("Div", _np(_int_div), NUMERIC, since=14),
    ew("Elu", lambda ctx, x: np.where(x > 0, x, ctx.attr("alpha") * np.expm1(np.minimum(x, 0))), since=6,
       attrs={"alpha": Float(1.0)}),
    ew("Equal", _np(np.equal), NUMERIC + (BOOL,), out_dtype=BOOL, since=19),
    ew("Erf", _erf),
    ew("Exp", _np(np.exp)),
    ew("Floor", _np(np.floor)),
    ew("Gelu", _gelu, since=20, attrs={"approximate": String("none", ("none", "tanh"))},
       doc="approximate none (erf form) or tanh"),
    ew("Gelu", _gelu, domain="com.microsoft", since=1, doc="erf form"),
    ew("Greater", _np(np.greater), NUMERIC, out_dtype=BOOL),
    ew("GreaterOrEqual", _np(np.greater_equal), NUMERIC, out_dtype=BOOL, since=16),
    ew("HardSigmoid", lambda ctx, x: np.clip(ctx.attr("alpha") * x + ctx.attr("beta"), 0, 1), since=6,
       attrs={"alpha": Float(0.2), "beta": Float(0.5)}),
    ew("HardSwish", lambda ctx, x: x * np.clip(x / 6 + 0.5, 0, 1), since=14),
    ew("IsInf", _is_inf, FLOATS, out_dtype=BOOL, since=20,
       attrs={"detect_negative": Flag(1), "detect_positive": Flag(1)}),
    ew("IsNaN", _np(np.isnan), FLOATS, out_dtype=BOOL, since=20),
    ew("LeakyRelu", lambda ctx, x: np.where(x >= 0, x, ctx.attr("alpha") * x), since=16,
       attrs={"alpha": LEAKY_ALPHA}),
    ew("Less", _np(np.less), NUMERIC, out_dtype=BOOL),
    ew("LessOrEqual", _np(np.less_equal), NUMERIC, out_dtype=BOOL, since=16),
    ew("Log", _np(np.log)),
    ew("Max", _np(lambda *xs: np.maximum.reduce(np.broadcast_arrays(*xs))), NUMERIC),
    ew("Mean", _np(lambda *xs: sum(xs) / len(xs))),
    ew("Min", _np(lambda *xs: np.minimum.reduce(np.broadcast_arrays(*xs))), NUMERIC),
    ew("Mod", _mod, NUMERIC, since=13, attrs={"fmod": Flag(0)}),
    ew("Mul", _np(np.multiply), NUMERIC, since=14),
    ew("Neg", _np(np.negative), SIGNED),
    ew("Not", _np(np.logical_not), (BOOL,), since=1),
    ew("Or", _np(np.logical_or), (BOOL,), since=7),
    ew("PRelu", _np(lambda x, s: np.where(x >= 0, x, s * x)), ALL_NUMERIC, unidirectional=True, since=16),
    ew("Pow", _np(np.power), ALL_NUMERIC, t_inputs=[0], since=15),
    ew("Reciprocal", _np(np.reciprocal)),
    ew("Relu", _np(lambda x: np.maximum(x, 0)), SIGNED, since=14),
    ew("Round", _np(np.round), since=11, doc="halves to even"),
    ew("Scale", lambda ctx, x, s: x / s if ctx.attr("scale_down") else x * s, domain="com.microsoft",
       t_inputs=[0], since=1, attrs={"scale_down": Flag(0)}),
    ew("Selu", lambda ctx, x: ctx.attr("gamma") * np.where(
        x > 0, x, ctx.attr("alpha") * np.expm1(np.minimum(x, 0))), since=6,
       attrs={"alpha": Float(1.67326319217681884765625), "gamma": Float(1.05070102214813232421875)}),
    ew("Sigmoid", _np(_sigmoid)),
    ew("Sign", _np(np.sign), NUMERIC),
    ew("Sin", _np(np.sin), since=7),
    ew("Sinh", _np(np.sinh), since=9),
    ew("Softplus", _np(lambda x: np.logaddexp(x, 0)), since=1),
    ew("Sqrt", _np(np.sqrt)),
    ew("Sub", _np(np.subtract), NUMERIC, since=14),
    ew("Sum", _np(lambda *xs: sum(xs))),
    ew("Tan", _np(np.tan), since=7),
    ew("Tanh", _np(np.tanh)),
    ew("Xor", _np(np.logical_xor), (BOOL,), since=7),
    ew("Where", _np(np.where), ANY, t_inputs=[1, 2], cond_input=0, since=16),
)
