"""Pooling: MaxPool (with optional Indices), AveragePool (1-D and 2-D windows), GlobalAveragePool and
GlobalMaxPool (any rank >= 3). The window arithmetic is shared with Conv (``conv.window_geometry``)."""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from .base import NodeContext, OpDef
from .conv import Window, check_rank, window_geometry


def pool_geometry(ctx: NodeContext) -> Window:
    """The pooling window over input 0's spatial dims (1-D windows are returned as they are)."""
    x = check_rank(ctx, 0)
    kernel = tuple(int(k) for k in ctx.attr("kernel_shape"))
    if len(kernel) != len(x) - 2:
        raise ctx.error(f"kernel_shape {list(kernel)} must have {len(x) - 2} entries (one per spatial dim)")
    ceil_mode = ctx.attr("ceil_mode", 0)
    if ceil_mode not in (0, 1):
        raise ctx.error(f"ceil_mode must be 0 or 1; got {ceil_mode}")
    return window_geometry(ctx, tuple(x[2:]), kernel, ceil_mode=bool(ceil_mode), pool=True)


def _pooled(ctx: NodeContext) -> TensorType:
    x = ctx.shape(0)
    return TensorType(ctx.type(0).dtype, x[:2] + pool_geometry(ctx).out)


def _max_pool(ctx: NodeContext):
    if ctx.attr("storage_order", 0) not in (0, 1):
        raise ctx.error("storage_order must be 0 (row major) or 1 (column major); "
                        f"got {ctx.attr('storage_order')}")
    y = _pooled(ctx)
    if len(ctx.node.outputs) > 1:
        return [y, TensorType(np.int64, y.shape)]
    return [y]


def _average_pool(ctx: NodeContext):
    if ctx.attr("count_include_pad", 0) not in (0, 1):
        raise ctx.error(f"count_include_pad must be 0 or 1; got {ctx.attr('count_include_pad')}")
    return [_pooled(ctx)]


def _global_pool(ctx: NodeContext):
    x = ctx.shape(0)
    if len(x) < 3:
        raise ctx.error(f"input must have rank >= 3 (N, C, spatial...); got shape {x}")
    return [TensorType(ctx.type(0).dtype, x[:2] + (1,) * (len(x) - 2))]


OPS = (
    OpDef("AveragePool", _average_pool, since=19, kernel="pool.average_pool",
          doc="1-D/2-D; count_include_pad, ceil_mode, dilations"),
    OpDef("GlobalAveragePool", _global_pool, since=1, kernel="pool.global_average_pool"),
    OpDef("GlobalMaxPool", _global_pool, since=1, kernel="pool.global_max_pool"),
    OpDef("MaxPool", _max_pool, since=12, kernel="pool.max_pool",
          doc="1-D/2-D; optional Indices output (flattened over N*C*H*W, storage_order 0 or 1)"),
)
