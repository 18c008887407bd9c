"""ReduceSum, ReduceMean, ReduceMax, ReduceMin.

Axes come from the ``axes`` attribute (ReduceMean/Max/Min before opset 18) or from a constant second input
(ReduceSum since 13, the others since 18); ``keepdims`` defaults to 1; with no axes the op reduces every axis,
or, with ``noop_with_empty_axes=1``, copies its input.
"""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from ..ir.dtypes import FLOATS, INTS
from .attrs import Flag, Int, Ints
from .base import INTEGERS, NodeContext, OpDef, normalize_axis
from .softmax import EDGETRAIN

BOOL = (np.dtype(np.bool_),)    # ReduceMax/ReduceMin of bool: any/all (opset 20)

# the axes attribute is the pre-opset-18 form (ReduceSum: pre-13); later opsets take them as an input
REDUCE_ATTRS = {"axes": Ints(), "keepdims": Flag(1), "noop_with_empty_axes": Flag(0)}


def reduce_axes(ctx: NodeContext) -> tuple[int, ...] | None:
    """The sorted axes to reduce, or None when the op is an identity (no axes, noop_with_empty_axes=1)."""
    rank = len(ctx.shape(0))
    axes = ctx.axes(1)
    if not axes:
        return None if ctx.attr("noop_with_empty_axes") else tuple(range(rank))
    norm = [normalize_axis(ctx, a, rank) for a in axes]
    if len(set(norm)) != len(norm):
        raise ctx.error(f"axes {list(axes)} name an axis twice")
    return tuple(sorted(norm))


def reduced_shape(ctx: NodeContext, keepdims: bool | None = None) -> tuple[int, ...]:
    shape = ctx.shape(0)
    axes = reduce_axes(ctx)
    if axes is None:
        return tuple(shape)
    keep = bool(ctx.attr("keepdims")) if keepdims is None else keepdims
    return tuple(1 if i in axes else d for i, d in enumerate(shape) if keep or i not in axes)


def block_view(shape: tuple, axes: tuple) -> tuple[int, int, int] | None:
    """``(outer, red, inner)`` if the reduced axes of size > 1 are adjacent, else None."""
    big = [i for i, d in enumerate(shape) if d != 1]
    red = [i for i in big if i in axes]
    if not red:
        return int(np.prod(shape, dtype=np.int64)), 1, 1
    pos = [big.index(i) for i in red]
    if pos != list(range(pos[0], pos[0] + len(pos))):
        return None
    first, last = red[0], red[-1]
    prod = lambda dims: int(np.prod(dims, dtype=np.int64))  # noqa: E731
    return prod(shape[:first]), prod(shape[first:last + 1]), prod(shape[last + 1:])


def transformed_workspace(ctx: NodeContext) -> list[TensorType]:
    """ReduceL1/L2/SumSquare/LogSumExp over axes that are not one block: the transformed input, in the arena."""
    axes = reduce_axes(ctx)
    if not axes or block_view(ctx.shape(0), axes) is not None:
        return []
    kept = TensorType(ctx.type(0).dtype, reduced_shape(ctx, keepdims=True))
    return [ctx.type(0)] + ([kept] if ctx.node.op_type == "ReduceLogSumExp" else [])


def _reduce(ctx: NodeContext):
    if ctx.has_input(1) and ctx.type(1).dtype != INTS[1]:
        raise ctx.error(f"axes must be int64, got {ctx.type(1)}")
    return [TensorType(ctx.type(0).dtype, reduced_shape(ctx))]


# --- gradient rules ---------------------------------------------------------------------------------------

def _grad_axes(g) -> tuple[int, ...] | None:
    """Reduced axes (normalized), None for an identity; from the attribute or the constant axes input."""
    rank = len(g.in_types[0].shape)
    axes = g.attr("axes")
    if axes is None and len(g.node.inputs) > 1 and g.node.inputs[1]:
        value = g.const_input(1)
        if value is None:
            raise g.error("axes must be a constant to differentiate")
        axes = value.reshape(-1).tolist()
    if not axes:
        return None if g.attr("noop_with_empty_axes") else tuple(range(rank))
    return tuple(sorted(int(a) % rank for a in axes))


def _spread(g, dy: str, axes) -> str:
    """dy broadcast back over the reduced axes: Unsqueeze (if keepdims=0), then Expand to Shape(x)."""
    if not g.attr("keepdims"):
        dy = g.emit("Unsqueeze", [dy, g.const(list(axes), "int64", "axes")])
    return g.emit("Expand", [dy, g.shape_of(g.x(0))])


def _reduce_sum_vjp(g, dys):
    axes = _grad_axes(g)
    dx = dys[0] if axes is None else _spread(g, dys[0], axes)
    return [dx] + [None] * (len(g.node.inputs) - 1)


def _reduce_mean_vjp(g, dys):
    axes = _grad_axes(g)
    if axes is None:
        return [dys[0]] + [None] * (len(g.node.inputs) - 1)
    # count = Size(x) / Size(y), folded when planning (works for symbolic dims too)
    count = g.emit("Cast", [g.emit("Div", [g.emit("Size", [g.x(0)]), g.emit("Size", [g.y()])])],
                   {"to": _onnx(g.in_types[0].dtype)})
    return [_spread(g, g.emit("Div", [dys[0], count]), axes)] + [None] * (len(g.node.inputs) - 1)


def _reduce_extreme_vjp(g, dys):
    """The gradient goes to the elements equal to the max (min), shared equally among ties."""
    axes = _grad_axes(g)
    if axes is None:
        return [dys[0]] + [None] * (len(g.node.inputs) - 1)
    y = g.y() if g.attr("keepdims") else g.emit("Unsqueeze", [g.y(), g.const(list(axes), "int64", "axes")])
    hit = g.emit("Cast", [g.emit("Equal", [g.x(0), y])], {"to": _onnx(g.in_types[0].dtype)})
    ties = g.emit("ReduceSum", [hit, g.const(list(axes), "int64", "axes")], {"keepdims": 1})
    dy = dys[0] if g.attr("keepdims") else g.emit("Unsqueeze", [dys[0], g.const(list(axes), "int64", "axes")])
    return [g.emit("Mul", [hit, g.emit("Div", [dy, ties])])] + [None] * (len(g.node.inputs) - 1)


def _transformed_vjp(make):
    """A rule for ReduceL1/L2/SumSquare/LogSumExp: dX = make(g, x, y with the reduced axes kept) * dY spread."""
    def rule(g, dys):
        axes = _grad_axes(g)
        rest = [None] * (len(g.node.inputs) - 1)
        if axes is None:
            return [dys[0]] + rest
        y = g.y() if g.attr("keepdims") else g.emit("Unsqueeze", [g.y(), g.const(list(axes), "int64", "axes")])
        return [g.emit("Mul", [make(g, g.x(0), y), _spread(g, dys[0], axes)])] + rest
    return rule


def _reduce_prod_vjp(g, dys):
    """dX = dY * (the product of the other reduced elements), exact with zeros: with z the zeros of x and p the
    product of its nonzero elements, that is p / x where a group has no zero, p at a group's only zero, else 0."""
    axes = _grad_axes(g)
    rest = [None] * (len(g.node.inputs) - 1)
    if axes is None:
        return [dys[0]] + rest
    x, dtype = g.x(0), g.in_types[0].dtype
    axes_name = g.const(list(axes), "int64", "axes")
    zero = g.emit("Equal", [x, _one(g, 0, "zero")])
    safe = g.emit("Where", [zero, _one(g, 1, "one"), x])
    nonzero_prod = g.emit("ReduceProd", [safe, axes_name], {"keepdims": 1})
    zeros = g.emit("ReduceSum", [g.emit("Cast", [zero], {"to": _onnx(dtype)}), axes_name], {"keepdims": 1})
    lone_zero = g.emit("And", [zero, g.emit("Equal", [zeros, _one(g, 1, "one")])])
    others = g.emit("Where", [g.emit("Equal", [zeros, _one(g, 0, "zero")]), g.emit("Div", [nonzero_prod, safe]),
                              g.emit("Where", [lone_zero, nonzero_prod, _one(g, 0, "zero")])])
    return [g.emit("Mul", [others, _spread(g, dys[0], axes)])] + rest


def _one(g, value, label):
    return g.const(value, g.in_types[0].dtype, label)


TRANSFORMED_VJPS = {
    # d sum|x| = sign(x); d sum x^2 = 2x; d sqrt(sum x^2) = x / y (0 where y = 0: then x = 0 too)
    "ReduceL1": lambda g, x, y: g.emit("Sign", [x]),
    "ReduceSumSquare": lambda g, x, y: g.emit("Mul", [x, _one(g, 2, "two")]),
    "ReduceL2": lambda g, x, y: g.emit("Div", [x, g.emit("Where", [g.emit("Equal", [y, _one(g, 0, "zero")]),
                                                                    _one(g, 1, "one"), y])]),
    # d log sum exp(x) = softmax: exp(x - y)
    "ReduceLogSumExp": lambda g, x, y: g.emit("Exp", [g.emit("Sub", [x, y])]),
}


def _onnx(dtype) -> int:
    from ..ir.dtypes import to_onnx
    return to_onnx(dtype)


def _reduce_all_l2(ctx: NodeContext):
    present = [i for i in range(len(ctx.node.inputs)) if ctx.has_input(i)]
    if not present:
        raise ctx.error("needs at least one input")
    dtypes = {ctx.type(i).dtype for i in present}
    if len(dtypes) > 1:
        raise ctx.error("inputs must share one element type")
    return [TensorType(dtypes.pop(), ())]


def _reduce_all_l2_vjp(g, dys):
    """d sqrt(sum x_i^2) / d x_i = x_i / norm."""
    scale = g.emit("Div", [dys[0], g.y()])
    return [g.emit("Mul", [g.x(i), scale]) if g.needs[i] else None for i in range(len(g.node.inputs))]


# --- along one axis: CumSum, ArgMax, ArgMin -------------------------------------------------------------------

def cumsum_axis(ctx: NodeContext) -> int:
    axis = ctx.const(1, "axis")
    if axis.size != 1 or axis.dtype not in INTS:
        raise ctx.error(f"axis must be one int32/int64 value, got {axis.dtype}{list(axis.shape)}")
    return normalize_axis(ctx, int(axis.reshape(())), len(ctx.shape(0)))


def _cumsum(ctx: NodeContext):
    if not ctx.shape(0):
        raise ctx.error("input must have rank >= 1")
    cumsum_axis(ctx)
    return [ctx.type(0)]


def _cumsum_fold(ctx, x, axis):
    axis = cumsum_axis(ctx)
    flip = (lambda a: np.flip(a, axis)) if ctx.attr("reverse") else (lambda a: a)
    if ctx.op.op_type == "CumProd":
        y = np.cumprod(flip(x), axis=axis, dtype=x.dtype)
        if ctx.attr("exclusive"):     # shift by one along the axis, a leading 1 (no division: x may hold zeros)
            y = np.concatenate([np.ones_like(np.take(y, [0], axis)), np.delete(y, -1, axis)], axis) if x.shape[
                axis] else y
        return flip(y)
    y = np.cumsum(flip(x), axis=axis, dtype=x.dtype)
    if ctx.attr("exclusive"):
        y = y - flip(x)
    return flip(y)


def _cumsum_vjp(g, dys):
    """dX = the sums of dY taken the other way: CumSum(dY, axis, exclusive, reverse = not reverse)."""
    return [g.emit("CumSum", [dys[0], g.x(1)], {"exclusive": g.attr("exclusive"),
                                                 "reverse": 1 - g.attr("reverse")}), None]


def _cumprod_vjp(g, dys):
    """dX_k = (product of the x before k) * sum over the y_j that hold x_k of dY_j * (product of the x after k
    up to j), computed by a backward recurrence without dividing by x (ai.edgetrain CumProdGrad: ORT has none)."""
    return [g.emit("CumProdGrad", [dys[0], g.x(0), g.x(1)], {"exclusive": g.attr("exclusive"),
                                                               "reverse": g.attr("reverse")}, EDGETRAIN), None]


def _cumprod_grad(ctx: NodeContext):
    if ctx.type(0) != ctx.type(1):
        raise ctx.error(f"dY {ctx.type(0)} must match X {ctx.type(1)}")
    cumprod_grad_axis(ctx)
    return [ctx.type(1)]


def cumprod_grad_axis(ctx: NodeContext) -> int:
    """CumProdGrad's axis (its input 2), read as CumProd's (input 1) from the context without dY."""
    return cumsum_axis(NodeContext(ctx.node, ctx.op, ctx.opset, ctx.in_types[1:], ctx.consts[1:]))


def arg_axis(ctx: NodeContext) -> int:
    shape = ctx.shape(0)
    if not shape:
        raise ctx.error("input must have rank >= 1")
    axis = normalize_axis(ctx, ctx.attr("axis"), len(shape))
    if shape[axis] == 0:
        raise ctx.error(f"axis {axis} is empty: there is no element to pick")
    return axis


def _arg(ctx: NodeContext):
    shape, axis = ctx.shape(0), arg_axis(ctx)
    out = tuple(1 if d == axis else n for d, n in enumerate(shape) if ctx.attr("keepdims") or d != axis)
    return [TensorType(np.int64, out)]


def _arg_fold(pick):
    def fold(ctx, x):
        axis = arg_axis(ctx)
        if ctx.attr("select_last_index"):
            idx = x.shape[axis] - 1 - pick(np.flip(x, axis), axis=axis)
        else:
            idx = pick(x, axis=axis)
        return np.expand_dims(idx, axis) if ctx.attr("keepdims") else idx
    return fold


ARG_ATTRS = {"axis": Int(0), "keepdims": Flag(1), "select_last_index": Flag(0)}


def topk_geometry(ctx: NodeContext) -> tuple[int, int]:
    """(axis, k) of TopK; k (input 1) must be known when planning and no larger than the axis."""
    shape = ctx.shape(0)
    if not shape:
        raise ctx.error("input must have rank >= 1")
    axis = normalize_axis(ctx, ctx.attr("axis"), len(shape))
    k = ctx.const(1, "K").reshape(-1)
    if k.size != 1 or k.dtype != np.int64 or not 0 <= int(k[0]) <= shape[axis]:
        raise ctx.error(f"K must be one int64 in [0, {shape[axis]}] (axis {axis} of {shape}), got {k.tolist()}")
    return axis, int(k[0])


def _topk(ctx: NodeContext):
    axis, k = topk_geometry(ctx)
    if len(ctx.node.outputs) != 2:
        raise ctx.error("TopK has 2 outputs (Values, Indices)")
    shape = tuple(k if d == axis else n for d, n in enumerate(ctx.shape(0)))
    return [TensorType(ctx.type(0).dtype, shape), TensorType(np.int64, shape)]


def _topk_vjp(g, dys):
    """dX = zeros with dValues added where the values came from: onnxruntime's GatherElementsGrad along the axis."""
    if dys[1] is not None:
        raise g.error("the loss depends on TopK's Indices; only Values are differentiated")
    axis = normalize_axis(g, g.attr("axis"), len(g.in_types[0].shape))
    return [g.emit("GatherElementsGrad", [dys[0], g.shape_of(g.x(0)), g.y(1)], {"axis": axis}, "com.microsoft"),
            None]

OPS = (
    OpDef("ArgMax", _arg, since=13, kernel="reduce.arg_max", fold=_arg_fold(np.argmax), dtypes=FLOATS + INTS,
          attrs=ARG_ATTRS, doc="int64 indices; the first NaN wins, as numpy's argmax"),
    OpDef("ArgMin", _arg, since=13, kernel="reduce.arg_min", fold=_arg_fold(np.argmin), dtypes=FLOATS + INTS,
          attrs=ARG_ATTRS, doc="int64 indices; the first NaN wins, as numpy's argmin"),
    OpDef("TopK", _topk, since=11, kernel="reduce.topk", dtypes=FLOATS + INTEGERS, vjp=_topk_vjp,
          attrs={"axis": Int(-1), "largest": Flag(1), "sorted": Flag(1)},
          doc="K (input 1) known when planning; always sorted, ties by lower index, NaN as the largest value; "
              "gradient through Values"),
    OpDef("CumSum", _cumsum, since=14, kernel="reduce.cumsum", fold=_cumsum_fold, dtypes=FLOATS + INTS,
          vjp=_cumsum_vjp, attrs={"exclusive": Flag(0), "reverse": Flag(0)},
          doc="axis (input 1) must be known when planning"),
    OpDef("CumProd", _cumsum, since=26, kernel="reduce.cumprod", fold=_cumsum_fold, dtypes=FLOATS + INTS,
          vjp=_cumprod_vjp, attrs={"exclusive": Flag(0), "reverse": Flag(0)},
          doc="axis (input 1) must be known when planning; gradient exact where x holds zeros"),
    OpDef("CumProdGrad", _cumprod_grad, domain=EDGETRAIN, since=1, kernel="reduce.cumprod_grad",
          attrs={"exclusive": Flag(0), "reverse": Flag(0)},
          doc="inputs dY, X, axis: CumProd's gradient (edgetrain's own: onnxruntime has none)"),
    OpDef("ReduceAllL2", _reduce_all_l2, domain="com.microsoft", since=1, kernel="reduce.reduce_all_l2",
          vjp=_reduce_all_l2_vjp, doc="the L2 norm of all elements of all inputs, a scalar"),
    OpDef("ReduceL1", _reduce, since=18, kernel="reduce.reduce_l1", workspace=transformed_workspace,
          vjp=_transformed_vjp(TRANSFORMED_VJPS["ReduceL1"]), attrs=REDUCE_ATTRS, doc="sum of |x|"),
    OpDef("ReduceL2", _reduce, since=18, kernel="reduce.reduce_l2", workspace=transformed_workspace,
          vjp=_transformed_vjp(TRANSFORMED_VJPS["ReduceL2"]), attrs=REDUCE_ATTRS, doc="sqrt of the sum of x^2"),
    OpDef("ReduceLogSumExp", _reduce, since=18, kernel="reduce.reduce_log_sum_exp", workspace=transformed_workspace,
          vjp=_transformed_vjp(TRANSFORMED_VJPS["ReduceLogSumExp"]), attrs=REDUCE_ATTRS,
          doc="log of the sum of exp(x), computed around the max"),
    OpDef("ReduceMax", _reduce, since=18, kernel="reduce.reduce_max", dtypes=FLOATS + INTS + BOOL,
          vjp=_reduce_extreme_vjp,
          attrs=REDUCE_ATTRS),
    OpDef("ReduceMean", _reduce, since=18, kernel="reduce.reduce_mean", vjp=_reduce_mean_vjp, attrs=REDUCE_ATTRS),
    OpDef("ReduceMin", _reduce, since=18, kernel="reduce.reduce_min", dtypes=FLOATS + INTS + BOOL,
          vjp=_reduce_extreme_vjp,
          attrs=REDUCE_ATTRS),
    OpDef("ReduceProd", _reduce, since=18, kernel="reduce.reduce_prod", dtypes=FLOATS + INTS, vjp=_reduce_prod_vjp,
          attrs=REDUCE_ATTRS),
    OpDef("ReduceSumSquare", _reduce, since=18, kernel="reduce.reduce_sum_square", workspace=transformed_workspace,
          vjp=_transformed_vjp(TRANSFORMED_VJPS["ReduceSumSquare"]), attrs=REDUCE_ATTRS, doc="sum of x^2"),
    OpDef("ReduceSum", _reduce, since=13, kernel="reduce.reduce_sum", dtypes=FLOATS + INTS, vjp=_reduce_sum_vjp,
          attrs=REDUCE_ATTRS),
)
