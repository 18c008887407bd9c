"""Pooling: MaxPool (with optional Indices), AveragePool (1-D and 2-D windows), GlobalAveragePool and
GlobalMaxPool (any rank >= 3), their gradient rules, and onnxruntime's MaxPoolGrad and AveragePoolGrad. The
window arithmetic is shared with Conv (``conv.window_geometry``)."""
from __future__ import annotations

import numpy as np

from ..ir import Node, TensorType
from ..ir.dtypes import FLOATS, to_onnx
from .attrs import REQUIRED, Flag, Int, Ints
from .base import NodeContext, OpDef
from .conv import DIM, POOL_ATTRS, Window, check_rank, smallest_input, window_geometry

MS = "com.microsoft"
HINT = "input_spatial_shape"   # pooling gradients: X's spatial shape where dY's does not determine it
MAX_POOL_ATTRS = POOL_ATTRS | {"ceil_mode": Flag(0), "storage_order": Flag(0)}
AVERAGE_POOL_ATTRS = POOL_ATTRS | {"ceil_mode": Flag(0), "count_include_pad": Flag(0)}
GRAD_HINT = {HINT: Ints(low=DIM[0], high=DIM[1])}
LP_POOL_ATTRS = POOL_ATTRS | {"ceil_mode": Flag(0), "p": Int(2, low=1, high=64)}


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


def _lp_pool_vjp(g, dys):
    """y = (sum over the window of |x|^p)^(1/p): dX = sign(x) |x|^(p-1) * W^T(dY * y^(1-p)), with W^T the window
    sum's adjoint: com.microsoft ConvGrad's dX for a depthwise convolution with a kernel of ones (pads at the
    end grown so the convolution's floor arithmetic gives ceil_mode's output)."""
    x, y, p = g.x(0), g.y(), g.attr("p")
    t = g.in_types[0]
    probe = NodeContext(g.node, next(op for op in OPS if op.op_type == "LpPool"), g.opset, [t], [None])
    win = pool_geometry(probe)
    spatial = t.shape[2:]
    ends = [(o - 1) * s + d * (k - 1) + 1 - n - b if o else e for o, s, d, k, n, b, e in zip(
        win.out, win.strides, win.dilations, win.kernel, spatial, win.pads_begin, win.pads_end)]
    attrs = {"kernel_shape": list(win.kernel), "strides": list(win.strides), "dilations": list(win.dilations),
             "pads": list(win.pads_begin) + [max(a, b) for a, b in zip(ends, win.pads_end)], "group": t.shape[1]}
    ones = g.const(np.ones((t.shape[1], 1) + tuple(win.kernel)), t.dtype, "ones")
    scaled = g.emit("Mul", [dys[0], g.emit("Pow", [y, g.const(1 - p, t.dtype, "one_minus_p")])])
    spread = g.emit("ConvGrad", [scaled, x, ones], attrs, MS, outputs=[f"{g.node.name}_Grad/window_sum_adjoint",
                                                                         "", ""])
    local = g.emit("Mul", [g.emit("Sign", [x]), g.emit("Pow", [g.emit("Abs", [x]), g.const(p - 1, t.dtype, "p_1")])])
    return [g.emit("Mul", [spread, local])]


def max_unpool_shape(ctx: NodeContext) -> tuple[int, ...]:
    """Y's shape: output_shape (input 2) when given, else (in - 1) * stride + kernel - pads per spatial dim;
    Indices must be int64 with X's shape."""
    x = tuple(ctx.shape(0))
    if len(x) < 3:
        raise ctx.error(f"X must be [N, C, spatial...], got shape {list(x)}")
    idx = ctx.type(1)
    if idx.dtype != np.int64 or tuple(idx.shape) != x:
        raise ctx.error(f"Indices must be int64 with X's shape {list(x)}; got {idx}")
    n = len(x) - 2
    kernel = tuple(ctx.attr("kernel_shape"))
    strides = tuple(ctx.attr("strides") or (1,) * n)
    pads = tuple(ctx.attr("pads") or (0,) * (2 * n))
    if len(kernel) != n or len(strides) != n or len(pads) != 2 * n:
        raise ctx.error(f"kernel_shape {list(kernel)}, strides {list(strides)} and pads {list(pads)} must have "
                        f"{n}, {n} and {2 * n} entries")
    if ctx.has_input(2):
        shape = tuple(int(d) for d in ctx.const(2, "output_shape").reshape(-1))
        if len(shape) != len(x) or shape[:2] != x[:2] or min(shape) < 0:
            raise ctx.error(f"output_shape {list(shape)} must be X's N, C and {n} spatial sizes")
        return shape
    out = tuple((d - 1) * s + k - pb - pe for d, s, k, pb, pe in zip(x[2:], strides, kernel, pads[:n], pads[n:]))
    if min(out) < 0:
        raise ctx.error(f"the unpooled spatial shape {list(out)} is negative")
    return x[:2] + out


def _max_unpool(ctx: NodeContext):
    return [TensorType(ctx.type(0).dtype, max_unpool_shape(ctx))]


def _max_unpool_vjp(g, dys):
    """Y holds X's values at Indices (flat over Y): dX = dY flattened, gathered at Indices."""
    flat = g.emit("Reshape", [dys[0], g.const([-1], "int64", "flat")])
    return [g.emit("Gather", [flat, g.x(1)], {"axis": 0}), None, None]


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
    OpDef("LpPool", _average_pool, since=18, kernel="pool.lp_pool", vjp=_lp_pool_vjp, attrs=LP_POOL_ATTRS,
          doc="1-D/2-D; p, ceil_mode, dilations; gradient through com.microsoft ConvGrad"),
    OpDef("MaxPool", _max_pool, since=12, kernel="pool.max_pool", vjp=_max_pool_vjp, grad_outputs=2,
          dtypes=FLOATS + tuple(np.dtype(t) for t in (np.int8, np.uint8)),     # 8-bit: lowered (plan/lower.py)
          attrs=MAX_POOL_ATTRS,
          doc="1-D/2-D; optional Indices output (flattened over N*C*H*W, storage_order 0 or 1)"),
    OpDef("MaxUnpool", _max_unpool, since=22, kernel="pool.max_unpool", vjp=_max_unpool_vjp,
          attrs={"kernel_shape": Ints(REQUIRED, low=1, high=DIM[1]), "pads": Ints(low=DIM[0], high=DIM[1]),
                 "strides": Ints(low=1, high=DIM[1])},
          doc="zeros with X's values at Indices (flat over the output, range-checked); optional output_shape"),
    OpDef("MaxPoolGrad", _max_pool_grad, since=9, kernel="pool.max_pool_grad", attrs=MAX_POOL_ATTRS | GRAD_HINT,
          doc="onnxruntime's (ai.onnx domain): inputs dY, Indices; dX = 0, then dX[Indices] += dY"),
)
