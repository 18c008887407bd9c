"""Element-wise ops: broadcasting shape rule, numpy form (for constant folding) and dtypes.

Their loops are generated and fused by the planner; each op's scalar template is in
``edgetrain.kernels.elementwise.SCALAR`` under the same name.
"""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from ..ir.dtypes import FLOATS
from .base import ALL_NUMERIC, NodeContext, OpDef, broadcast_shapes

BOOL = np.dtype(np.bool_)
NUMERIC_AND_BOOL = ALL_NUMERIC + (BOOL,)


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


def _sigmoid(x):
    """1 / (1 + exp(-x)) without overflowing: exp only of -|x|."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _mod(ctx, a, b):
    return np.fmod(a, b) if ctx.attr("fmod", 0) else np.mod(a, b)


def _clip(ctx, x, lo=None, hi=None):
    if lo is not None:
        x = np.maximum(x, lo)
    if hi is not None:
        x = np.minimum(x, hi)
    return x


def _gelu(ctx, x):
    from math import erf
    return (0.5 * x * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))).astype(x.dtype)


def _erf(ctx, x):
    from math import erf
    return np.vectorize(erf, otypes=[x.dtype])(x)


def ew(op_type, fold, dtypes=FLOATS, *, out_dtype=None, t_inputs=None, cond_input=None, unidirectional=False,
       domain="", since=13, doc=""):
    """An element-wise OpDef; ``fold(ctx, *arrays)`` is its numpy form."""
    return OpDef(op_type, _rule(out_dtype, t_inputs, cond_input, unidirectional), domain=domain, since=since,
                 kind="elementwise", fold=_quiet(fold), dtypes=dtypes,
                 type_input=t_inputs[0] if t_inputs else 0, doc=doc)


def _quiet(fold):
    """Fold like the generated kernels compute: inf/nan results (log(0), x/0, overflow) without warnings."""
    def run(ctx, *xs):
        with np.errstate(all="ignore"):
            return fold(ctx, *xs)
    return run


def _np(f):
    return lambda ctx, *xs: f(*xs)


OPS = (
    ew("Abs", _np(np.abs), ALL_NUMERIC),
    ew("Add", _np(np.add), ALL_NUMERIC, since=14),
    ew("And", _np(np.logical_and), (BOOL,), since=7),
    ew("Atan", _np(np.arctan), since=7),
    ew("Ceil", _np(np.ceil)),
    ew("Clip", _clip, ALL_NUMERIC),
    ew("Cos", _np(np.cos), since=7),
    ew("Div", _np(_int_div), ALL_NUMERIC, since=14),
    ew("Elu", lambda ctx, x: np.where(x > 0, x, ctx.attr("alpha", 1.0) * np.expm1(np.minimum(x, 0))), since=6),
    ew("Equal", _np(np.equal), NUMERIC_AND_BOOL, out_dtype=BOOL, since=19),
    ew("Erf", _erf),
    ew("Exp", _np(np.exp)),
    ew("Floor", _np(np.floor)),
    ew("Gelu", _gelu, domain="com.microsoft", since=1, doc="erf form"),
    ew("Greater", _np(np.greater), ALL_NUMERIC, out_dtype=BOOL),
    ew("GreaterOrEqual", _np(np.greater_equal), ALL_NUMERIC, out_dtype=BOOL, since=16),
    ew("HardSigmoid", lambda ctx, x: np.clip(ctx.attr("alpha", 0.2) * x + ctx.attr("beta", 0.5), 0, 1), since=6),
    ew("HardSwish", lambda ctx, x: x * np.clip(x / 6 + 0.5, 0, 1), since=14),
    ew("LeakyRelu", lambda ctx, x: np.where(x >= 0, x, ctx.attr("alpha", 0.01) * x), since=16),
    ew("Less", _np(np.less), ALL_NUMERIC, out_dtype=BOOL),
    ew("LessOrEqual", _np(np.less_equal), ALL_NUMERIC, out_dtype=BOOL, since=16),
    ew("Log", _np(np.log)),
    ew("Max", _np(lambda *xs: np.maximum.reduce(np.broadcast_arrays(*xs))), ALL_NUMERIC),
    ew("Mean", _np(lambda *xs: sum(xs) / len(xs))),
    ew("Min", _np(lambda *xs: np.minimum.reduce(np.broadcast_arrays(*xs))), ALL_NUMERIC),
    ew("Mod", _mod, ALL_NUMERIC, since=13),
    ew("Mul", _np(np.multiply), ALL_NUMERIC, since=14),
    ew("Neg", _np(np.negative), ALL_NUMERIC),
    ew("Not", _np(np.logical_not), (BOOL,), since=1),
    ew("Or", _np(np.logical_or), (BOOL,), since=7),
    ew("PRelu", _np(lambda x, s: np.where(x >= 0, x, s * x)), ALL_NUMERIC, unidirectional=True, since=16),
    ew("Pow", _np(np.power), ALL_NUMERIC, t_inputs=[0], since=15),
    ew("Reciprocal", _np(np.reciprocal)),
    ew("Relu", _np(lambda x: np.maximum(x, 0)), ALL_NUMERIC, since=14),
    ew("Scale", lambda ctx, x, s: x / s if ctx.attr("scale_down", 0) else x * s, domain="com.microsoft",
       t_inputs=[0], since=1),
    ew("Selu", lambda ctx, x: ctx.attr("gamma", 1.05070102214813232421875) * np.where(
        x > 0, x, ctx.attr("alpha", 1.67326319217681884765625) * np.expm1(np.minimum(x, 0))), since=6),
    ew("Sigmoid", _np(_sigmoid)),
    ew("Sign", _np(np.sign), ALL_NUMERIC),
    ew("Sin", _np(np.sin), since=7),
    ew("Softplus", _np(lambda x: np.logaddexp(x, 0)), since=1),
    ew("Sqrt", _np(np.sqrt)),
    ew("Sub", _np(np.subtract), ALL_NUMERIC, since=14),
    ew("Sum", _np(lambda *xs: sum(xs))),
    ew("Tanh", _np(np.tanh)),
    ew("Where", _np(np.where), ALL_NUMERIC + (BOOL,), t_inputs=[1, 2], cond_input=0, since=16),
)
