"""Pooling: MaxPool (with optional Indices), AveragePool (1-D and 2-D windows), GlobalAveragePool and
GlobalMaxPool (any rank >= 3), their gradient rules, and onnxruntime's MaxPoolGrad and AveragePoolGrad. The
window arithmetic is shared with Conv (``conv.window_geometry``)."""
from __future__ import annotations

import numpy as np

from ..ir import Node, TensorType
from ..ir.dtypes import FLOATS, to_onnx
from .attrs import Flag, Ints
from .base import NodeContext, OpDef
from .conv import DIM, POOL_ATTRS, Window, check_rank, smallest_input, window_geometry

MS = "com.microsoft"
HINT = "input_spatial_shape"   # pooling gradients: X's spatial shape where dY's does not determine it
MAX_POOL_ATTRS = POOL_ATTRS | {"ceil_mode": Flag(0), "storage_order": Flag(0)}
AVERAGE_POOL_ATTRS = POOL_ATTRS | {"ceil_mode": Flag(0), "count_include_pad": Flag(0)}
GRAD_HINT = {HINT: Ints(low=DIM[0], high=DIM[1])}


def _kernel_and_ceil(ctx: NodeContext, rank: int) -> tuple[tuple[int, ...], bool]:
    kernel = ctx.attr("kernel_shape")
    if len(kernel) != rank - 2:
        raise ctx.error(f"kernel_shape {list(kernel)} must have {rank - 2} entries (one per spatial dim)")
    return kernel, bool(ctx.attr("ceil_mode"))


def pool_geometry(ctx: NodeContext, x: tuple[int, ...] | None = None) -> Window:
    """The pooling window over the spatial dims of X (input 0, or the shape ``x``; 1-D windows are returned
    as they are)."""
    x = check_rank(ctx, 0) if x is None else x
    kernel, ceil_mode = _kernel_and_ceil(ctx, len(x))
    return window_geometry(ctx, tuple(x[2:]), kernel, ceil_mode=ceil_mode, pool=True)


def _pooled(ctx: NodeContext) -> TensorType:
    x = ctx.shape(0)
    return TensorType(ctx.type(0).dtype, x[:2] + pool_geometry(ctx).out)


def _max_pool(ctx: NodeContext):
    y = _pooled(ctx)
    if len(ctx.node.outputs) > 1:
        return [y, TensorType(np.int64, y.shape)]
    return [y]


def _average_pool(ctx: NodeContext):
    return [_pooled(ctx)]


def _global_pool(ctx: NodeContext):
    x = ctx.shape(0)
    if len(x) < 3:
        raise ctx.error(f"input must have rank >= 3 (N, C, spatial...); got shape {x}")
    return [TensorType(ctx.type(0).dtype, x[:2] + (1,) * (len(x) - 2))]


def _global_max_pool(ctx: NodeContext):
    """The maximum of an empty spatial extent does not exist: refused, as the ONNX reference and onnxruntime
    refuse it (GlobalAveragePool gives NaN there, a mean of nothing)."""
    y = _global_pool(ctx)
    x = ctx.shape(0)
    if 0 in x[2:] and x[0] * x[1]:
        raise ctx.error(f"X of shape {x} has an empty spatial extent, which has no maximum; feed at least one "
                        "element per channel")
    return y


# --- gradients --------------------------------------------------------------------------------------------
# MaxPoolGrad and AveragePoolGrad are onnxruntime's training ops, which it registers in the ai.onnx domain
# (since version 9), not in com.microsoft; they carry the forward node's attributes. Their dX shape is X's:
# N and C come from dY, the spatial dims from the window arithmetic run backwards. With strides > 1 several
# input sizes give one output size; then the rule adds ``input_spatial_shape`` (onnxruntime's schemas allow
# extra attributes, and it reads dX's shape from the graph's value_info instead), else the smallest is taken.

def _pool_vjp_attrs(g, grad_op: str, dy: str) -> dict:
    """The forward node's attributes, plus ``input_spatial_shape`` when the smallest input that pools to
    dY's shape is not X's."""
    attrs = dict(g.node.attrs)
    op = next(op for op in OPS if op.op_type == grad_op)
    probe = NodeContext(Node(grad_op, [dy], ["dX"], attrs, g.node.name), op, g.opset, [g.out_types[0]], [None])
    x = tuple(g.in_types[0].shape)
    if _pool_grad_type(probe, hint=False).shape != x:
        attrs[HINT] = list(x[2:])
    return attrs


def _pool_grad_type(ctx: NodeContext, hint: bool = True) -> TensorType:
    dy = check_rank(ctx, 0)
    kernel, ceil_mode = _kernel_and_ceil(ctx, len(dy))
    spatial = ctx.attr(HINT) if hint else None
    if spatial is None:
        spatial = smallest_input(ctx, tuple(dy[2:]), kernel, ceil_mode)
    else:
        if len(spatial) != len(kernel):
            raise ctx.error(f"{HINT} {list(spatial)} must have {len(kernel)} entries")
    x = tuple(dy[:2]) + tuple(spatial)
    out = pool_geometry(ctx, x).out
    if out != tuple(dy[2:]):
        raise ctx.error(f"dY's spatial shape {list(dy[2:])} is not the pooled shape {list(out)} of X's "
                        f"{list(spatial)} ({HINT} holds X's spatial shape when the graph was built: symbolic "
                        "spatial dims are not supported)")
    return TensorType(ctx.type(0).dtype, x)


def _max_pool_vjp(g, dys):
    """dX[Indices[k]] += dY[k]: MaxPoolGrad(dY, Indices) with MaxPool's attributes."""
    return [g.emit("MaxPoolGrad", [dys[0], g.y(1)], _pool_vjp_attrs(g, "MaxPoolGrad", dys[0]))]


def _average_pool_vjp(g, dys):
    """dX[window taps] += dY / (the window's tap count): AveragePoolGrad(dY) with AveragePool's attributes."""
    return [g.emit("AveragePoolGrad", [dys[0]], _pool_vjp_attrs(g, "AveragePoolGrad", dys[0]))]


def _global_average_pool_vjp(g, dys):
    """dX = Expand(dY / (H*W...), Shape(X)), as onnxruntime emits it for symbolic shapes (Size, folded)."""
    count = g.emit("Div", [g.emit("Size", [g.x(0)]), g.emit("Size", [g.y()])])
    scaled = g.emit("Scale", [dys[0], count], {"scale_down": 1}, MS)
    return [g.emit("Expand", [scaled, g.shape_of(g.x(0))])]


def _global_max_pool_vjp(g, dys):
    """dX = (X == Y) * dY / (number of maxima): the gradient is shared equally among ties."""
    axes = list(range(2, len(g.in_types[0].shape)))
    hit = g.emit("Cast", [g.emit("Equal", [g.x(0), g.y()])], {"to": to_onnx(g.in_types[0].dtype)})
    ties = g.emit("ReduceSum", [hit, g.const(axes, "int64", "axes")], {"keepdims": 1})
    return [g.emit("Mul", [hit, g.emit("Div", [dys[0], ties])])]


def _max_pool_grad(ctx: NodeContext):
    idx = ctx.type(1)
    if idx.dtype != np.int64 or idx.shape != ctx.shape(0):
        raise ctx.error(f"Indices must be int64 with dY's shape {ctx.shape(0)}; got {idx}")
    return [_pool_grad_type(ctx)]


def _average_pool_grad(ctx: NodeContext):
    return [_pool_grad_type(ctx)]


OPS = (
    OpDef("AveragePool", _average_pool, since=19, kernel="pool.average_pool", vjp=_average_pool_vjp,
          attrs=AVERAGE_POOL_ATTRS,
          doc="1-D/2-D; count_include_pad, ceil_mode, dilations"),
    OpDef("AveragePoolGrad", _average_pool_grad, since=9, kernel="pool.average_pool_grad",
          attrs=AVERAGE_POOL_ATTRS | GRAD_HINT,
          doc="onnxruntime's (ai.onnx domain): input dY, AveragePool's attributes; dX = the pool's adjoint"),
    OpDef("GlobalAveragePool", _global_pool, since=1, kernel="pool.global_average_pool",
          vjp=_global_average_pool_vjp),
    OpDef("GlobalMaxPool", _global_max_pool, since=1, kernel="pool.global_max_pool", vjp=_global_max_pool_vjp),
    OpDef("MaxPool", _max_pool, since=12, kernel="pool.max_pool", vjp=_max_pool_vjp, grad_outputs=2,
          dtypes=FLOATS + tuple(np.dtype(t) for t in (np.int8, np.uint8)),     # 8-bit: lowered (plan/lower.py)
          attrs=MAX_POOL_ATTRS,
          doc="1-D/2-D; optional Indices output (flattened over N*C*H*W, storage_order 0 or 1)"),
    OpDef("MaxPoolGrad", _max_pool_grad, since=9, kernel="pool.max_pool_grad", attrs=MAX_POOL_ATTRS | GRAD_HINT,
          doc="onnxruntime's (ai.onnx domain): inputs dY, Indices; dX = 0, then dX[Indices] += dY"),
)
