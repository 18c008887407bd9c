"""ReduceSum, ReduceMean, ReduceMax, ReduceMin.

Axes come from the ``axes`` attribute (ReduceMean/Max/Min before opset 18) or from a constant second input
(ReduceSum since 13, the others since 18); ``keepdims`` defaults to 1; with no axes the op reduces every axis,
or, with ``noop_with_empty_axes=1``, copies its input.
"""
from __future__ import annotations

from ..ir import TensorType
from ..ir.dtypes import FLOATS, INTS
from .base import NodeContext, OpDef, normalize_axis


def reduce_axes(ctx: NodeContext) -> tuple[int, ...] | None:
    """The sorted axes to reduce, or None when the op is an identity (no axes, noop_with_empty_axes=1)."""
    rank = len(ctx.shape(0))
    axes = ctx.axes(1)
    if not axes:
        return None if ctx.attr("noop_with_empty_axes", 0) else tuple(range(rank))
    norm = [normalize_axis(ctx, a, rank) for a in axes]
    if len(set(norm)) != len(norm):
        raise ctx.error(f"axes {list(axes)} name an axis twice")
    return tuple(sorted(norm))


def reduced_shape(ctx: NodeContext, keepdims: bool | None = None) -> tuple[int, ...]:
    shape = ctx.shape(0)
    axes = reduce_axes(ctx)
    if axes is None:
        return tuple(shape)
    keep = bool(ctx.attr("keepdims", 1)) if keepdims is None else keepdims
    return tuple(1 if i in axes else d for i, d in enumerate(shape) if keep or i not in axes)


def _reduce(ctx: NodeContext):
    if ctx.has_input(1) and ctx.type(1).dtype != INTS[1]:
        raise ctx.error(f"axes must be int64, got {ctx.type(1)}")
    return [TensorType(ctx.type(0).dtype, reduced_shape(ctx))]


OPS = (
    OpDef("ReduceMax", _reduce, since=18, kernel="reduce.reduce_max", dtypes=FLOATS + INTS),
    OpDef("ReduceMean", _reduce, since=18, kernel="reduce.reduce_mean"),
    OpDef("ReduceMin", _reduce, since=18, kernel="reduce.reduce_min", dtypes=FLOATS + INTS),
    OpDef("ReduceSum", _reduce, since=13, kernel="reduce.reduce_sum", dtypes=FLOATS + INTS),
)
