"""Scalar forms of the element-wise ops, inlined by the fuser into generated loops.

Each entry maps an op name to ``template(args, k) -> str``: ``args`` are the scalar expressions of the
inputs, ``k`` gives the compute type ``k.T`` (e.g. ``np.float32``), ``k.is_int`` and ``k.attr(name, default)``.
Constants go through ``k.T(...)`` so float32 math stays float32.
"""
import math  # noqa: F401  (used by the generated source)


def _div(a, k):
    if k.is_int:  # ONNX integer division truncates toward zero
        return f"_trunc_div({a[0]}, {a[1]})"
    return f"{a[0]} / {a[1]}"


def _clip(a, k):
    x = a[0]
    if len(a) > 1 and a[1] is not None:
        x = f"max({x}, {a[1]})"
    if len(a) > 2 and a[2] is not None:
        x = f"min({x}, {a[2]})"
    return x


def _elu(x, alpha, k):
    return f"({x} if {x} > 0 else {k.T}({alpha}) * math.expm1({x}))"


SCALAR = {
    "Abs": lambda a, k: f"abs({a[0]})",
    "Add": lambda a, k: f"{a[0]} + {a[1]}",
    "And": lambda a, k: f"{a[0]} and {a[1]}",
    "Atan": lambda a, k: f"math.atan({a[0]})",
    "Ceil": lambda a, k: f"math.ceil({a[0]})",
    "Clip": _clip,
    "Cos": lambda a, k: f"math.cos({a[0]})",
    "Div": _div,
    "Elu": lambda a, k: _elu(a[0], k.attr("alpha", 1.0), k),
    "Equal": lambda a, k: f"{a[0]} == {a[1]}",
    "Erf": lambda a, k: f"math.erf({a[0]})",
    "Exp": lambda a, k: f"math.exp({a[0]})",
    "Floor": lambda a, k: f"math.floor({a[0]})",
    "Gelu": lambda a, k: f"{k.T}(0.5) * {a[0]} * ({k.T}(1.0) + math.erf({a[0]} * {k.T}(0.7071067811865476)))",
    "Greater": lambda a, k: f"{a[0]} > {a[1]}",
    "GreaterOrEqual": lambda a, k: f"{a[0]} >= {a[1]}",
    "HardSigmoid": lambda a, k: (f"max({k.T}(0.0), min({k.T}(1.0), {k.T}({k.attr('alpha', 0.2)}) * {a[0]}"
                                 f" + {k.T}({k.attr('beta', 0.5)})))"),
    "HardSwish": lambda a, k: f"{a[0]} * max({k.T}(0.0), min({k.T}(1.0), {a[0]} / {k.T}(6.0) + {k.T}(0.5)))",
    "LeakyRelu": lambda a, k: f"({a[0]} if {a[0]} >= 0 else {k.T}({k.attr('alpha', 0.01)}) * {a[0]})",
    "Less": lambda a, k: f"{a[0]} < {a[1]}",
    "LessOrEqual": lambda a, k: f"{a[0]} <= {a[1]}",
    "Log": lambda a, k: f"math.log({a[0]})",
    "Max": lambda a, k: f"max({', '.join(a)})" if len(a) > 1 else a[0],
    "Mean": lambda a, k: f"({' + '.join(a)}) / {k.T}({len(a)})",
    "Min": lambda a, k: f"min({', '.join(a)})" if len(a) > 1 else a[0],
    "Mod": lambda a, k: f"np.fmod({a[0]}, {a[1]})" if k.attr("fmod", 0) else f"{a[0]} % {a[1]}",
    "Mul": lambda a, k: f"{a[0]} * {a[1]}",
    "Neg": lambda a, k: f"-{a[0]}",
    "Not": lambda a, k: f"not {a[0]}",
    "Or": lambda a, k: f"{a[0]} or {a[1]}",
    "PRelu": lambda a, k: f"({a[0]} if {a[0]} >= 0 else {a[1]} * {a[0]})",
    "Pow": lambda a, k: f"{a[0]} ** {a[1]}",
    "Reciprocal": lambda a, k: f"{k.T}(1.0) / {a[0]}",
    "Relu": lambda a, k: f"({a[0]} if {a[0]} > 0 else {k.T}(0))",
    "Scale": lambda a, k: f"{a[0]} / {a[1]}" if k.attr("scale_down", 0) else f"{a[0]} * {a[1]}",
    "Selu": lambda a, k: (f"{k.T}({k.attr('gamma', 1.05070102214813232421875)}) * "
                          + _elu(a[0], k.attr("alpha", 1.67326319217681884765625), k)),
    "Sigmoid": lambda a, k: f"{k.T}(1.0) / ({k.T}(1.0) + math.exp(-{a[0]}))",
    "Sign": lambda a, k: f"(({a[0]} > 0) - ({a[0]} < 0))",
    "Sin": lambda a, k: f"math.sin({a[0]})",
    "Softplus": lambda a, k: f"(max({a[0]}, {k.T}(0)) + math.log1p(math.exp(-abs({a[0]}))))",
    "Sqrt": lambda a, k: f"math.sqrt({a[0]})",
    "Sub": lambda a, k: f"{a[0]} - {a[1]}",
    "Sum": lambda a, k: f"({' + '.join(a)})",
    "Tanh": lambda a, k: f"math.tanh({a[0]})",
    "Where": lambda a, k: f"({a[1]} if {a[0]} else {a[2]})",
}

# Helpers the generated modules import by name.
HELPERS = '''
@njit(cache=True, inline="always")
def _trunc_div(a, b):
    q = a // b
    return q + 1 if (q < 0 and q * b != a) else q
'''
