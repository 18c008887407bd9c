"""Scalar forms of the element-wise ops, inlined by the fuser into generated loops.

Each entry maps an op name to ``template(args, k) -> str``: ``args`` are the scalar expressions of the
inputs, ``k`` gives the compute type ``k.T`` (e.g. ``np.float32``), ``k.is_int``, ``k.attr(name)`` (an attribute's
value, to choose a form) and ``k.const(name)`` (the attribute as a typed literal: the only way an attribute
enters the source). Constants go through ``k.T(...)`` so float32 math stays float32.
"""
import math  # noqa: F401  (used by the generated source)


def _div(a, k):
    if k.is_int:  # ONNX integer division truncates toward zero
        return f"_trunc_div({a[0]}, {a[1]})"
    return f"{a[0]} / {a[1]}"   # the generated kernels use Numba's numpy error model: x / 0 is inf or nan


def _mod(a, k):
    if not k.attr("fmod"):
        return f"{a[0]} % {a[1]}"   # Python's %: the result takes the divisor's sign, like np.mod
    if k.is_int:                    # Numba's np.fmod is wrong for integer scalars; a - b * trunc(a / b)
        return f"({a[0]} - {a[1]} * _trunc_div({a[0]}, {a[1]}))"
    return f"np.fmod({a[0]}, {a[1]})"


def _clip(a, k):
    x = a[0]
    if len(a) > 1 and a[1] is not None:
        x = f"max({x}, {a[1]})"
    if len(a) > 2 and a[2] is not None:
        x = f"min({x}, {a[2]})"
    return x


def _elu(x, k):
    return f"({x} if {x} > 0 else {k.const('alpha')} * math.expm1({x}))"


def _extremum(fn):
    """Variadic Max / Min as nested np.maximum / np.minimum: NaN propagates as in numpy (max() drops it)."""
    def template(a, k):
        expr = a[0]
        for x in a[1:]:
            expr = f"{fn}({expr}, {x})"
        return expr
    return template


def _gelu(x, k):
    """ai.onnx Gelu with approximate="tanh": 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))); else (and
    com.microsoft's) the erf form 0.5 x (1 + erf(x / sqrt(2)))."""
    if k.domain == "" and k.attr("approximate") == "tanh":
        return (f"{k.T}(0.5) * {x} * ({k.T}(1.0) + math.tanh({k.T}(0.7978845608028654) * {x} * "
                f"({k.T}(1.0) + {k.T}(0.044715) * {x} * {x})))")
    return f"{k.T}(0.5) * {x} * ({k.T}(1.0) + {_erf(k, f'{x} * {k.T}(0.7071067811865476)')})"


def _sigmoid(a, k):
    x, one = a[0], f"{k.T}(1.0)"   # exp only of -|x|: no overflow for large |x|
    return f"({one} / ({one} + math.exp(-{x})) if {x} >= 0 else math.exp({x}) / ({one} + math.exp({x})))"


def _bitshift(a, k):
    """BitShift-28: a shift by a negative amount or by the type's width or more leaves only the sign fill (-1 for
    a right shift of a negative x, else 0); a right shift of a signed x is arithmetic."""
    x, y, width = a[0], a[1], int("".join(c for c in k.T if c.isdigit()))
    if k.attr("direction") == "LEFT":
        return f"({k.T}({x} << {y}) if 0 <= {y} < {width} else {k.T}(0))"
    return f"({k.T}({x} >> {y}) if 0 <= {y} < {width} else ({k.T}(-1) if {x} < 0 else {k.T}(0)))"


def _is_inf(a, k):
    """IsInf: the sides detect_positive / detect_negative name (a constant choice of form, not a runtime test)."""
    sides = [f"{a[0]} == np.inf"] * bool(k.attr("detect_positive")) + [f"{a[0]} == -np.inf"] * bool(
        k.attr("detect_negative"))
    return f"({' or '.join(sides)})" if sides else "False"


SCALAR = {
    "Abs": lambda a, k: f"abs({a[0]})",
    "Acos": lambda a, k: f"math.acos({a[0]})",
    "Acosh": lambda a, k: f"math.acosh({a[0]})",
    "Add": lambda a, k: f"{a[0]} + {a[1]}",
    "And": lambda a, k: f"{a[0]} and {a[1]}",
    "Asin": lambda a, k: f"math.asin({a[0]})",
    "Asinh": lambda a, k: f"math.asinh({a[0]})",
    "Atan": lambda a, k: f"math.atan({a[0]})",
    "Atanh": lambda a, k: f"math.atanh({a[0]})",
    "BitShift": _bitshift,
    "BitwiseAnd": lambda a, k: f"{a[0]} & {a[1]}",
    "BitwiseNot": lambda a, k: f"~{a[0]}",
    "BitwiseOr": lambda a, k: f"{a[0]} | {a[1]}",
    "BitwiseXor": lambda a, k: f"{a[0]} ^ {a[1]}",
    "Ceil": lambda a, k: f"np.ceil({a[0]})",   # math.ceil returns an int (wrong for inf/nan/huge)
    "Clip": _clip,
    "Cos": lambda a, k: f"math.cos({a[0]})",
    "Cosh": lambda a, k: f"math.cosh({a[0]})",
    "Div": _div,
    "Elu": lambda a, k: _elu(a[0], k),
    "Equal": lambda a, k: f"{a[0]} == {a[1]}",
    "Erf": lambda a, k: _erf(k, a[0]),
    "Exp": lambda a, k: f"math.exp({a[0]})",
    "Floor": lambda a, k: f"np.floor({a[0]})",
    "Gelu": lambda a, k: _gelu(a[0], k),
    "Greater": lambda a, k: f"{a[0]} > {a[1]}",
    "GreaterOrEqual": lambda a, k: f"{a[0]} >= {a[1]}",
    # Python's max/min return their first argument when a comparison is false: x first keeps NaN NaN
    "HardSigmoid": lambda a, k: f"max(min({k.const('alpha')} * {a[0]} + {k.const('beta')}, {k.T}(1.0)), {k.T}(0.0))",
    "HardSwish": lambda a, k: f"{a[0]} * max(min({a[0]} / {k.T}(6.0) + {k.T}(0.5), {k.T}(1.0)), {k.T}(0.0))",
    "IsInf": _is_inf,
    "IsNaN": lambda a, k: f"({a[0]} != {a[0]})",
    "LeakyRelu": lambda a, k: f"({a[0]} if {a[0]} >= 0 else {k.const('alpha')} * {a[0]})",
    "Less": lambda a, k: f"{a[0]} < {a[1]}",
    "LessOrEqual": lambda a, k: f"{a[0]} <= {a[1]}",
    "Log": lambda a, k: f"math.log({a[0]})",
    "Max": _extremum("np.maximum"),
    "Mean": lambda a, k: f"({' + '.join(a)}) / {k.T}({len(a)})",
    "Min": _extremum("np.minimum"),
    "Mod": _mod,
    "Mul": lambda a, k: f"{a[0]} * {a[1]}",
    "Neg": lambda a, k: f"-{a[0]}",
    "Not": lambda a, k: f"not {a[0]}",
    "Or": lambda a, k: f"{a[0]} or {a[1]}",
    "PRelu": lambda a, k: f"({a[0]} if {a[0]} >= 0 else {a[1]} * {a[0]})",
    "Pow": lambda a, k: f"{k.T}({a[0]} ** {a[1]})",   # float32 ** int64 would otherwise widen to float64
    "Reciprocal": lambda a, k: f"{k.T}(1.0) / {a[0]}",
    "Relu": lambda a, k: f"({k.T}(0) if {a[0]} < 0 else {a[0]})",   # NaN stays NaN, as np.maximum(x, 0)
    "Round": lambda a, k: f"np.rint({a[0]})",    # halves to even, as ONNX says; Python's round() gives an int
    "Scale": lambda a, k: f"{a[0]} {'/' if k.attr('scale_down') else '*'} {k.T}({a[1]})",
    "Selu": lambda a, k: f"{k.const('gamma')} * " + _elu(a[0], k),
    "Sigmoid": _sigmoid,
    # 0 and NaN map to themselves
    "Sign": lambda a, k: f"({k.T}(1) if {a[0]} > 0 else ({k.T}(-1) if {a[0]} < 0 else {a[0]}))",
    "Sin": lambda a, k: f"math.sin({a[0]})",
    "Sinh": lambda a, k: f"math.sinh({a[0]})",
    "Softplus": lambda a, k: f"(max({a[0]}, {k.T}(0)) + math.log1p(math.exp(-abs({a[0]}))))",
    "Sqrt": lambda a, k: f"math.sqrt({a[0]})",
    "Sub": lambda a, k: f"{a[0]} - {a[1]}",
    "Sum": lambda a, k: f"({' + '.join(a)})",
    "Tan": lambda a, k: f"math.tan({a[0]})",
    "Tanh": lambda a, k: f"math.tanh({a[0]})",
    "Where": lambda a, k: f"({a[1]} if {a[0]} else {a[2]})",
    "Xor": lambda a, k: f"{a[0]} != {a[1]}",
}

# onnxruntime's element-wise gradient ops (com.microsoft); inputs are (dY, X or Y). GeluGrad's Gaussian is
# floored at exp(-80) (~1e-35, times x): libm's underflow path for exp(-x^2/2) at |x| > 13 is ~3x slower.
SCALAR.update({
    "GeluGrad": lambda a, k: _gelu_grad_at(a[0], a[1], k),
    "LeakyReluGrad": lambda a, k: f"({a[0]} if {a[1]} > 0 else {k.const('alpha')} * {a[0]})",
    "ReluGrad": lambda a, k: f"({a[0]} if {a[1]} > 0 else {k.T}(0))",
    "SigmoidGrad": lambda a, k: f"{a[0]} * {a[1]} * ({k.T}(1.0) - {a[1]})",
    "TanhGrad": lambda a, k: f"{a[0]} * ({k.T}(1.0) - {a[1]} * {a[1]})",
})

# Helpers the generated modules import by name.
HELPERS = {
    "_trunc_div": '''
@njit(cache=True, inline="always", error_model="numpy")
def _trunc_div(a, b):
    q = a // b
    return q + 1 if (q < 0 and q * b != a) else q
''',
    # erf for float32 as x * P(x^2) / Q(x^2) on [-4, 4] (least-squares fit made for edgetrain; |error| < 4e-7,
    # float32's own rounding near 1 is 6e-8): polynomials vectorize where libm's erf is a scalar call, ~11x
    # faster on Gelu and its gradient.
    "_erf_f32": '''
@njit(cache=True, inline="always", error_model="numpy")
def _erf_f32(x):
    x = np.float32(4.0) if x > 4.0 else (np.float32(-4.0) if x < -4.0 else x)     # NaN passes through
    z = x * x
    p = np.float32(1.96891537e-06)
    p = p * z + np.float32(2.88724126e-04)
    p = p * z + np.float32(4.03548662e-03)
    p = p * z + np.float32(5.35670832e-02)
    p = p * z + np.float32(1.96993938e-01)
    p = p * z + np.float32(1.12837899e+00)
    q = np.float32(3.74547235e-05)
    q = q * z + np.float32(1.22398540e-03)
    q = q * z + np.float32(1.55087727e-02)
    q = q * z + np.float32(1.16785140e-01)
    q = q * z + np.float32(5.07912440e-01)
    q = q * z + np.float32(1.0)
    return x * p / q
''',
    # exp for float32 as Cephes' expf (2**n exp(r), |r| <= ln2/2, degree-7 polynomial; within 3 ulp, as
    # kernels/softmax.py's fast_exp): libm's exp is a scalar call that keeps GeluGrad's loop from vectorizing
    # (4 ns of its 4.5 ns per element). 0 below -87.3 (2**n would be subnormal), inf above 88.4, NaN kept.
    "_exp_f32": '''
@njit(cache=True, inline="always", error_model="numpy")
def _exp_f32(x):
    xc = x if x > np.float32(-87.33654) else np.float32(-87.33654)     # NaN too: n stays an integer
    xc = xc if xc < np.float32(88.37626) else np.float32(88.37626)
    n = np.floor(xc * np.float32(1.44269504088896341) + np.float32(0.5))
    r = xc - n * np.float32(0.693359375) - n * np.float32(-2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1.0)
    e = p * np.int32((np.int32(n) + np.int32(127)) << np.int32(23)).view(np.float32)
    if x < np.float32(-87.33654):
        return np.float32(0.0)
    if x > np.float32(88.37626):
        return np.float32(np.inf)
    return e if x == x else x
''',
}


def _erf(k, x: str) -> str:
    return f"_erf_f32({x})" if k.T == "np.float32" else f"math.erf({x})"


def _exp(k, x: str) -> str:
    return f"_exp_f32({x})" if k.T == "np.float32" else f"math.exp({x})"


# onnxruntime's fused activations and their gradient ops (edgetrain.ops.ort_training)
def _tanh_gelu_t(x, k):
    """tanh(sqrt(2/pi) x (1 + 0.044715 x^2)) of FastGelu."""
    return f"math.tanh({k.T}(0.7978845608028654) * {x} * ({k.T}(1.0) + {k.T}(0.044715) * {x} * {x}))"


def _fast_gelu(a, k):
    x = a[0] if len(a) < 2 or a[1] is None else f"({a[0]} + {a[1]})"
    return f"{k.T}(0.5) * {x} * ({k.T}(1.0) + {_tanh_gelu_t(x, k)})"


def _fast_gelu_grad(a, k):
    dy, x = a[0], a[1]
    t = _tanh_gelu_t(x, k)
    return (f"{dy} * ({k.T}(0.5) * ({k.T}(1.0) + {t}) + {k.T}(0.5) * {x} * ({k.T}(1.0) - {t} * {t}) * "
            f"{k.T}(0.7978845608028654) * ({k.T}(1.0) + {k.T}(0.134145) * {x} * {x}))")


def _gelu_grad_at(dy, x, k):
    return (f"{dy} * ({k.T}(0.5) * ({k.T}(1.0) + {_erf(k, f'{x} * {k.T}(0.7071067811865476)')})"
            f" + {x} * {k.T}(0.3989422804014327) * {_exp(k, f'max({k.T}(-0.5) * {x} * {x}, {k.T}(-80.0))')})")


def _quick_gelu_s(x, k):
    return _sigmoid([f"({k.const('alpha')} * {x})"], k)


SCALAR.update({
    "BiasGelu": lambda a, k: _gelu(f"({a[0]} + {a[1]})", k),
    "BiasGeluGrad_dX": lambda a, k: _gelu_grad_at(a[0], f"({a[1]} + {a[2]})", k),
    "FastGelu": _fast_gelu,
    "FastGeluGrad": _fast_gelu_grad,
    "QuickGelu": lambda a, k: f"{a[0]} * {_quick_gelu_s(a[0], k)}",
    "QuickGeluGrad": lambda a, k: (f"{a[0]} * {_quick_gelu_s(a[1], k)} * ({k.T}(1.0) + {k.const('alpha')} * {a[1]} * "
                                   f"({k.T}(1.0) - {_quick_gelu_s(a[1], k)}))"),
})
SCALAR["BiasFastGeluGrad_dX"] = lambda a, k: _fast_gelu_grad([a[0], f"({a[1]} + {a[2]})"], k)
