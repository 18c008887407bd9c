"""GatherND and ScatterND (N-dimensional index tuples) with their gradients: GatherND's is onnxruntime's
com.microsoft GatherNDGrad(shape, indices, dY); ScatterND's (reduction none or add) is made of ScatterND
and GatherND.

Both view data as [batch, cells, slice]: ``batch`` the first batch_dims dims (GatherND only), ``cells`` the k
dims an index tuple addresses (k = indices.shape[-1]), ``slice`` the rest, copied whole.
"""
from __future__ import annotations


import numpy as np

from ..ir import TensorType
from ..record import Frozen
from .attrs import Int, String
from .base import ANY, NodeContext, OpDef

MS = "com.microsoft"
REDUCTIONS = ("none", "add", "mul", "max", "min")


class NDGeometry(Frozen):
    batch: int                 # product of the batch dims
    tuples: int                # index tuples per batch entry
    dims: tuple[int, ...]      # the k dims an index tuple addresses
    slice: int                 # elements per addressed slice
    out: tuple[int, ...]       # GatherND's output shape (ScatterND's updates shape)

    def __init__(self, batch, tuples, dims, slice, out):     # noqa: A002 - the field's name
        self._set(batch=batch, tuples=tuples, dims=dims, slice=slice, out=out)

    @property
    def cells(self) -> int:
        return int(np.prod(self.dims, dtype=np.int64))


def nd_geometry(ctx: NodeContext, data: tuple[int, ...], idx: int, batch_dims: int = 0) -> NDGeometry:
    indices = tuple(ctx.shape(idx))
    if ctx.type(idx).dtype != np.int64:
        raise ctx.error(f"indices must be int64, got {ctx.type(idx).dtype}")
    if not data or not indices:
        raise ctx.error(f"data {list(data)} and indices {list(indices)} must have rank >= 1")
    b, k = batch_dims, indices[-1]
    if not 0 <= b < min(len(data), len(indices)):
        raise ctx.error(f"batch_dims {b} must be in [0, {min(len(data), len(indices))})")
    if indices[:b] != tuple(data[:b]):
        raise ctx.error(f"the first {b} dims of indices {list(indices)} and data {list(data)} must match")
    if not 1 <= k <= len(data) - b:
        raise ctx.error(f"index tuples of length {k} (indices' last dim) must address 1 to {len(data) - b} "
                        f"dims of data {list(data)}")
    return NDGeometry(int(np.prod(data[:b], dtype=np.int64)), int(np.prod(indices[b:-1], dtype=np.int64)),
                      tuple(data[b:b + k]), int(np.prod(data[b + k:], dtype=np.int64)),
                      indices[:-1] + tuple(data[b + k:]))


def _offsets_workspace(geometry: NDGeometry):
    return [TensorType(np.int64, (geometry.batch * geometry.tuples,))]


def _gather_nd(ctx: NodeContext):
    g = nd_geometry(ctx, ctx.shape(0), 1, ctx.attr("batch_dims"))
    return [TensorType(ctx.type(0).dtype, g.out)]


def _gather_nd_vjp(g, dys):
    """onnxruntime's GatherNDGrad(Shape(data), indices, dY): zeros, dY's slices added where GatherND read."""
    dx = g.emit("GatherNDGrad", [g.shape_of(g.x(0)), g.x(1), dys[0]], {"batch_dims": g.attr("batch_dims")},
                MS)
    return [dx, None]


def gather_nd_grad_shape(ctx: NodeContext) -> tuple[int, ...]:
    return tuple(int(d) for d in ctx.const(0, "shape").reshape(-1))


def _gather_nd_grad(ctx: NodeContext):
    shape = gather_nd_grad_shape(ctx)
    g = nd_geometry(ctx, shape, 1, ctx.attr("batch_dims"))
    if tuple(ctx.shape(2)) != g.out:
        raise ctx.error(f"dY {ctx.type(2)} does not match GatherND's output shape {list(g.out)}")
    return [TensorType(ctx.type(2).dtype, shape)]


def _scatter_nd(ctx: NodeContext):
    g = nd_geometry(ctx, ctx.shape(0), 1)
    if tuple(ctx.shape(2)) != g.out or ctx.type(2).dtype != ctx.type(0).dtype:
        raise ctx.error(f"updates {ctx.type(2)} must have shape {list(g.out)} and data's element type")
    return [ctx.type(0)]


def _scatter_nd_vjp(g, dys):
    """none: d data = dY with the written slices zeroed (ScatterND of zeros), d updates = GatherND(dY,
    indices); add: d data = dY, d updates the same gather. mul/max/min: no gradient rule."""
    reduction = g.attr("reduction")
    if reduction not in ("none", "add"):
        raise g.error(f"ScatterND with reduction '{reduction}' has no gradient rule (none, add)")
    dx = dys[0] if g.needs[0] else None
    if reduction == "none" and g.needs[0]:
        zeros = g.emit("ConstantOfShape", [g.shape_of(g.x(2))], {"value": np.zeros(1, g.in_types[2].dtype)})
        dx = g.emit("ScatterND", [dys[0], g.x(1), zeros])
    dupdates = g.emit("GatherND", [dys[0], g.x(1)]) if g.needs[2] else None
    return [dx, None, dupdates]


OPS = (
    OpDef("GatherND", _gather_nd, since=13, kernel="indexing.gather_nd", dtypes=ANY, vjp=_gather_nd_vjp,
          workspace=lambda ctx: _offsets_workspace(nd_geometry(ctx, ctx.shape(0), 1, ctx.attr("batch_dims"))),
          attrs={"batch_dims": Int(0, low=0)},
          doc="int64 index tuples, batch_dims; negative indices count back"),
    OpDef("GatherNDGrad", _gather_nd_grad, domain=MS, since=1, kernel="indexing.gather_nd_grad", type_input=2,
          workspace=lambda ctx: _offsets_workspace(nd_geometry(ctx, gather_nd_grad_shape(ctx), 1,
                                                               ctx.attr("batch_dims"))),
          attrs={"batch_dims": Int(0, low=0)},
          doc="inputs shape, indices, dY: zeros of shape, dY's slices added at the index tuples"),
    OpDef("ScatterND", _scatter_nd, since=18, kernel="indexing.scatter_nd", dtypes=ANY, vjp=_scatter_nd_vjp,
          workspace=lambda ctx: _offsets_workspace(nd_geometry(ctx, ctx.shape(0), 1)),
          attrs={"reduction": String("none", REDUCTIONS)},
          doc="reduction none/add/mul/max/min; gradient for none and add"),
)
