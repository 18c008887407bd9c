"""Normalization ops: BatchNormalization (inference and training mode), LayerNormalization,
GroupNormalization (opset 18 per-group and opset 21 per-channel scale/bias) and InstanceNormalization;
their gradient rules and onnxruntime's com.microsoft training ops for them.

Statistics accumulate in float64 into a planned workspace; see ``edgetrain.kernels.normalization``.

Gradients, in onnxruntime's vocabulary where it has one:

* training-mode BatchNormalization trains as ``BatchNormInternal`` (com.microsoft; ``train_form``), which also
  outputs the batch's saved_mean and saved_inv_std; its rule emits ``BatchNormalizationGrad``
  (dY, X, scale, saved_mean, saved_inv_std -> dX, dScale, dB).
* inference-mode BatchNormalization (frozen statistics, trainable scale/B) differentiates with plain ops.
* LayerNormalization keeps its Mean and InvStdDev outputs in training graphs (``grad_outputs=3``) for
  ``LayerNormalizationGrad`` (dY, X, scale, mean, inv_std_dev -> dX, dScale, dBias).
* GroupNormalization and InstanceNormalization (onnxruntime has no gradient for them) differentiate with plain
  ONNX ops that recompute the group statistics, so onnxruntime can still run the training graph.

Gradient outputs nobody needs are omitted (``""``), and the kernels skip them.
"""
from __future__ import annotations

import numpy as np

from ..ir import Node, TensorType
from ..ir.dtypes import FLOATS, computed_as, to_onnx
from .attrs import REQUIRED, Flag, Float, Int
from .base import NodeContext, OpDef, normalize_axis

MS = "com.microsoft"
EPSILON = Float(1e-5)
STASH_TYPE = Int(1, choices=(1, 11))    # float or double statistics
BN_ATTRS = {"epsilon": EPSILON, "momentum": Float(0.9), "training_mode": Flag(0)}
LAYER_NORM_ATTRS = {"axis": Int(-1), "epsilon": EPSILON, "stash_type": STASH_TYPE}


def _float_input(ctx: NodeContext, i: int, what: str) -> TensorType:
    t = ctx.type(i)
    if computed_as(t.dtype) not in FLOATS:
        raise ctx.error(f"input {i} ('{what}') must be float or double, got {t}")
    return t


def _channel_param(ctx: NodeContext, i: int, what: str, size: int) -> TensorType:
    """A per-channel (or per-group) 1-D parameter of ``size`` elements."""
    t = _float_input(ctx, i, what)
    if t.size != size or len([d for d in t.shape if d != 1]) > 1:
        raise ctx.error(f"input {i} ('{what}') must have {size} elements (shape [{size}]), got shape {t.shape}")
    return t


def _n_outputs(ctx: NodeContext) -> int:
    return len(ctx.node.outputs)


# --- BatchNormalization -----------------------------------------------------------------------------------

def bn_training_mode(ctx) -> bool:
    """training_mode of BatchNormalization (default 0) or BatchNormInternal (default 1)."""
    return bool(ctx.attr("training_mode"))


def _batch_norm_types(ctx: NodeContext, max_outputs: int, too_many: str):
    x = ctx.type(0)
    if len(x.shape) < 2:
        raise ctx.error(f"X must have rank >= 2 ([N, C, ...]), got shape {x.shape}")
    c = x.shape[1]
    for i, what in enumerate(("scale", "B", "input_mean", "input_var"), start=1):
        _channel_param(ctx, i, what, c)
    if ctx.type(3).dtype != ctx.type(4).dtype:
        raise ctx.error("input_mean and input_var must share one element type")
    training = bn_training_mode(ctx)
    n_out = _n_outputs(ctx)
    if n_out > max_outputs:
        raise ctx.error(f"has {n_out} outputs; {too_many}")
    if not training and any(ctx.node.outputs[1:]):
        raise ctx.error("running_mean/running_var outputs need training_mode=1")
    stat = TensorType(ctx.type(3).dtype, (c,))
    return [x] + [stat] * (max(1, n_out) - 1)


def _batch_norm(ctx: NodeContext):
    return _batch_norm_types(ctx, 3, "opset 15 BatchNormalization has at most 3 (Y, running_mean, running_var)")


def _batch_norm_internal(ctx: NodeContext):
    return _batch_norm_types(ctx, 5, "BatchNormInternal has at most 5 (Y, running_mean, running_var, saved_mean, "
                                     "saved_inv_std)")


def _bn_eval_form(node: Node, opset: int) -> Node:
    """Eval models normalize with the running statistics and output Y only (ORT keeps the running-stat
    outputs with training_mode=0, a model its own loader then rejects)."""
    return Node(node.op_type, list(node.inputs), node.outputs[:1], dict(node.attrs) | {"training_mode": 0},
                node.name, node.domain)


def _bn_train_form(node: Node, opset: int) -> Node:
    """Training-mode BatchNormalization -> com.microsoft BatchNormInternal with all 5 outputs (as onnxruntime
    trains it); Y, running_mean and running_var keep their names, the saved statistics get theirs from
    ``prepare_for_training``. Inference-mode nodes stay as they are."""
    if not BATCH_NORM.attr(node, "training_mode"):
        return node
    outputs = (list(node.outputs) + [""] * 5)[:5]
    return Node("BatchNormInternal", list(node.inputs), outputs, dict(node.attrs), node.name, MS)


def _batch_norm_grad(ctx: NodeContext):
    dy, x = ctx.type(0), ctx.type(1)
    if len(x.shape) < 2:
        raise ctx.error(f"X must have rank >= 2 ([N, C, ...]), got shape {x.shape}")
    if tuple(dy.shape) != tuple(x.shape) or dy.dtype != x.dtype:
        raise ctx.error(f"dY {dy} must have X's type {x}")
    c = x.shape[1]
    for i, what in enumerate(("scale", "saved_mean", "saved_inv_std"), start=2):
        _channel_param(ctx, i, what, c)
    if len(ctx.node.outputs) > 3:
        raise ctx.error("BatchNormalizationGrad has 3 outputs (dX, dScale, dB)")
    return [x, TensorType(x.dtype, (c,)), TensorType(x.dtype, (c,))][:max(1, _n_outputs(ctx))]


# --- LayerNormalization -----------------------------------------------------------------------------------

STASH_TYPES = {1: np.dtype(np.float32), 11: np.dtype(np.float64)}


def stash_dtype(ctx: NodeContext) -> np.dtype:
    return STASH_TYPES[ctx.attr("stash_type")]


def layer_norm_axis(ctx: NodeContext) -> int:
    rank = len(ctx.shape(0))
    if rank == 0:
        raise ctx.error("X must have rank >= 1")
    return normalize_axis(ctx, ctx.attr("axis"), rank)


def _norm_param(ctx: NodeContext, i: int, what: str, norm_shape: tuple):
    """Scale/B of LayerNormalization: X[axis:]'s shape, give or take dims of 1, so one row serves every row."""
    t = _float_input(ctx, i, what)
    shape = list(t.shape)
    while len(shape) > len(norm_shape) and shape[0] == 1:
        shape.pop(0)
    aligned = norm_shape[len(norm_shape) - len(shape):] if len(shape) <= len(norm_shape) else None
    if (aligned is None or t.size != int(np.prod(norm_shape, dtype=np.int64))
            or any(a != b and a != 1 for a, b in zip(shape, aligned))):
        raise ctx.error(f"input {i} ('{what}') has shape {t.shape}; edgetrain needs the normalized shape "
                        f"{tuple(norm_shape)} (X[axis:]), without broadcasting")


def _layer_norm(ctx: NodeContext):
    x = ctx.type(0)
    axis = layer_norm_axis(ctx)
    norm_shape = x.shape[axis:]
    _norm_param(ctx, 1, "Scale", norm_shape)
    if ctx.has_input(2):
        _norm_param(ctx, 2, "B", norm_shape)
    if _n_outputs(ctx) > 3:
        raise ctx.error("LayerNormalization has at most 3 outputs (Y, Mean, InvStdDev)")
    stat = TensorType(stash_dtype(ctx), x.shape[:axis] + (1,) * (len(x.shape) - axis))
    return [x, stat, stat][:max(1, _n_outputs(ctx))]


def _layer_norm_grad(ctx: NodeContext):
    dy, x = ctx.type(0), ctx.type(1)
    if tuple(dy.shape) != tuple(x.shape) or dy.dtype != x.dtype:
        raise ctx.error(f"dY {dy} must have X's type {x}")
    axis = layer_norm_axis(ctx)
    _norm_param(ctx, 2, "scale", x.shape[axis:])
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    for i, what in ((3, "mean"), (4, "inv_std_dev")):
        t = _float_input(ctx, i, what)
        if t.size != rows:
            raise ctx.error(f"input {i} ('{what}') must have one value per normalized row ({rows}), got {t}")
    if len(ctx.node.outputs) > 3:
        raise ctx.error("LayerNormalizationGrad has 3 outputs (dX, dScale, dBias)")
    return [x, ctx.type(2), ctx.type(2)][:max(1, _n_outputs(ctx))]


# --- GroupNormalization / InstanceNormalization ----------------------------------------------------------

def group_norm_per_channel(ctx: NodeContext) -> bool:
    """Opset 21 changed scale/bias from one value per group to one per channel."""
    return ctx.opset >= 21


def _group_norm(ctx: NodeContext):
    x = ctx.type(0)
    if len(x.shape) < 2:
        raise ctx.error(f"X must have rank >= 2 ([N, C, ...]), got shape {x.shape}")
    c = x.shape[1]
    g = ctx.attr("num_groups")
    if c % g:
        raise ctx.error(f"num_groups {g} must be positive and divide the {c} channels")
    size = c if group_norm_per_channel(ctx) else g
    _channel_param(ctx, 1, "scale", size)
    _channel_param(ctx, 2, "bias", size)
    if ctx.opset >= 21:
        stash_dtype(ctx)
    return [x]


def _instance_norm(ctx: NodeContext):
    x = ctx.type(0)
    if len(x.shape) < 3:
        raise ctx.error(f"X must have rank >= 3 ([N, C, D1, ...]), got shape {x.shape}")
    _channel_param(ctx, 1, "scale", x.shape[1])
    _channel_param(ctx, 2, "B", x.shape[1])
    return [x]


# --- workspaces: float64 statistics, one (mean, var or 1/std) pair per normalized group ----------------------

STATS = np.dtype(np.float64)


def _bn_workspace(ctx: NodeContext) -> list[TensorType]:
    return [TensorType(STATS, (ctx.shape(0)[1], 2))] if bn_training_mode(ctx) else []


def _layer_norm_workspace(ctx: NodeContext) -> list[TensorType]:
    shape = ctx.shape(0)
    return [TensorType(STATS, (int(np.prod(shape[:layer_norm_axis(ctx)], dtype=np.int64)), 2))]


def _group_norm_workspace(ctx: NodeContext) -> list[TensorType]:
    return [TensorType(STATS, (ctx.shape(0)[0] * ctx.attr("num_groups"), 2))]


def _instance_norm_workspace(ctx: NodeContext) -> list[TensorType]:
    return [TensorType(STATS, (ctx.shape(0)[0] * ctx.shape(0)[1], 2))]


def _layer_norm_grad_workspace(ctx: NodeContext) -> list[TensorType]:
    """float64 sums of dY * xhat and dY per normalized position, for dScale and dBias."""
    shape = ctx.shape(1)
    return [TensorType(STATS, (2, int(np.prod(shape[layer_norm_axis(ctx):], dtype=np.int64))))]


# --- gradient rules: (g, [dY per output]) -> [dX per input]; they emit nodes (see edgetrain.autodiff) ------------

def _grad_names(g, op_type: str, wanted: list[bool]) -> list[str]:
    """Output names of a gradient node: one per wanted output, "" (omitted, not computed) for the others."""
    base = f"{g.node.name or g.y(0)}_Grad/{op_type}"
    return [f"{base}_out{k}" if want else "" for k, want in enumerate(wanted)]


def _only_through_y(g, dys, what: str):
    if any(d is not None for d in dys[1:]):
        raise g.error(f"the loss depends on {what}; only Y is differentiated")


def _has_input(g, i: int) -> bool:
    return i < len(g.node.inputs) and bool(g.node.inputs[i])


def _param_shaped(g, grad: str | None, i: int) -> str | None:
    """A per-channel gradient ([C] or [G]) in input ``i``'s shape, when that is not 1-D ([1, C], ...)."""
    if grad is None or len(g.in_types[i].shape) == 1:
        return grad
    return g.emit("Reshape", [grad, g.shape_of(g.x(i))])


def _reduce(g, op_type: str, x: str, axes, keepdims: int, opset: int | None = None) -> str:
    """ReduceSum/ReduceMean over ``axes``, the axes as an input or an attribute, as the opset wants them."""
    opset = g.opset if opset is None else opset
    if opset >= (13 if op_type == "ReduceSum" else 18):
        return g.emit(op_type, [x, g.const(np.array(list(axes)), np.int64, "axes")], {"keepdims": keepdims})
    return g.emit(op_type, [x], {"axes": list(axes), "keepdims": keepdims})


def _bn_inference_vjp(g, dys):
    """Frozen statistics: Y = (X - mean) * scale * inv + B with inv = 1 / sqrt(var + epsilon) per channel, so
    dX = dY * scale * inv, dScale = sum(dY * (X - mean) * inv), dB = sum(dY), d mean = -sum(dY) * scale * inv,
    d var = -sum(dY * (X - mean)) * scale * inv^3 / 2 (sums over every axis but the channel axis)."""
    dy, needs = dys[0], g.needs
    x_type = g.in_types[0]
    rank, dtype = len(x_type.shape), x_type.dtype
    # BatchNormInternal (com.microsoft) runs in graphs of opset >= 13: ReduceSum takes its axes as an input
    opset = g.opset if not g.node.domain else 13
    axes = [0] + list(range(2, rank))
    column = g.const([-1] + [1] * (rank - 2), np.int64, "channel_column")
    flat = g.const([-1], np.int64, "flat")

    def channel(i: int, shape) -> str:       # input i in X's element type, as a [C, 1, ...] column or [C]
        v = g.x(i)
        if g.in_types[i].dtype != dtype:
            v = g.emit("Cast", [v], {"to": to_onnx(dtype)})
        return g.emit("Reshape", [v, shape])

    def stat_grad(v: str, i: int) -> str:   # a [C] gradient in input i's element type and shape
        if g.in_types[i].dtype != dtype:
            v = g.emit("Cast", [v], {"to": to_onnx(g.in_types[i].dtype)})
        return _param_shaped(g, v, i)

    eps = g.const(g.attr("epsilon"), dtype, "epsilon")
    inv = g.emit("Reciprocal", [g.emit("Sqrt", [g.emit("Add", [channel(4, column), eps])])])
    dx = [None] * 5
    if needs[0]:
        dx[0] = g.emit("Mul", [dy, g.emit("Mul", [channel(1, column), inv])])
    centered_sum = sum_dy = None
    if needs[1] or needs[4]:
        centered = g.emit("Sub", [g.x(0), channel(3, column)])
        centered_sum = _reduce(g, "ReduceSum", g.emit("Mul", [dy, centered]), axes, 0, opset)   # [C]
    if needs[2] or needs[3]:
        sum_dy = _reduce(g, "ReduceSum", dy, axes, 0, opset)
    if needs[1] or needs[3] or needs[4]:
        inv_flat = g.emit("Reshape", [inv, flat])
    if needs[1]:
        dx[1] = _param_shaped(g, g.emit("Mul", [centered_sum, inv_flat]), 1)
    if needs[2]:
        dx[2] = _param_shaped(g, sum_dy, 2)
    if needs[3] or needs[4]:
        scale_inv = g.emit("Mul", [channel(1, flat), inv_flat])
        if needs[3]:
            dx[3] = stat_grad(g.emit("Neg", [g.emit("Mul", [sum_dy, scale_inv])]), 3)
        if needs[4]:
            k = g.emit("Mul", [scale_inv, g.emit("Mul", [inv_flat, inv_flat])])
            half = g.const(-0.5, dtype, "minus_half")
            dx[4] = stat_grad(g.emit("Mul", [g.emit("Mul", [centered_sum, k]), half]), 4)
    return dx


def _bn_vjp(g, dys):
    if bn_training_mode(g):
        raise g.error("training-mode BatchNormalization is differentiated in its training form, com.microsoft "
                      "BatchNormInternal (edgetrain.autodiff.prepare_for_training)")
    return _bn_inference_vjp(g, dys)


def _bn_internal_vjp(g, dys):
    """Training mode: BatchNormalizationGrad(dY, X, scale, saved_mean, saved_inv_std) -> dX, dScale, dB, as
    onnxruntime emits it; the batch statistics do not depend on input_mean/input_var (no gradient)."""
    _only_through_y(g, dys, "running_mean, running_var, saved_mean or saved_inv_std")
    if not bn_training_mode(g):
        return _bn_inference_vjp(g, dys)
    if len(g.node.outputs) < 5 or not g.node.outputs[3] or not g.node.outputs[4]:
        raise g.error("needs its saved_mean and saved_inv_std outputs (edgetrain.autodiff.prepare_for_training "
                      "adds them)")
    wanted = g.needs[:3]
    if not any(wanted):
        return [None] * 5
    outs = _grad_names(g, "BatchNormalizationGrad", wanted)
    g.emit("BatchNormalizationGrad", [dys[0], g.x(0), g.x(1), g.y(3), g.y(4)],
           {"epsilon": g.attr("epsilon")}, MS, outputs=outs)
    return [outs[0] or None, _param_shaped(g, outs[1] or None, 1), _param_shaped(g, outs[2] or None, 2), None, None]


def _layer_norm_vjp(g, dys):
    """LayerNormalizationGrad(dY, X, scale, mean, inv_std_dev) -> dX, dScale, dBias with the node's attributes,
    as onnxruntime emits it."""
    _only_through_y(g, dys, "Mean or InvStdDev")
    if len(g.node.outputs) < 3 or not g.node.outputs[1] or not g.node.outputs[2]:
        raise g.error("needs its Mean and InvStdDev outputs (edgetrain.autodiff.prepare_for_training adds them)")
    has_bias = _has_input(g, 2)
    wanted = [g.needs[0], g.needs[1], has_bias and g.needs[2]]
    outs = _grad_names(g, "LayerNormalizationGrad", wanted)
    g.emit("LayerNormalizationGrad", [dys[0], g.x(0), g.x(1), g.y(1), g.y(2)], dict(g.node.attrs), MS,
           outputs=outs)
    dbias = outs[2] or None
    if dbias is not None and tuple(g.in_types[2].shape) != tuple(g.in_types[1].shape):
        dbias = g.emit("Reshape", [dbias, g.shape_of(g.x(2))])    # dBias comes shaped like scale
    return [outs[0] or None, outs[1] or None, dbias]


def _grouped_vjp(g, dys, groups: int | None, per_channel: bool):
    """GroupNormalization / InstanceNormalization with plain ops. X is viewed as [N, G, M] (``groups`` None: one
    group per channel); the statistics are recomputed, xhat = (X - mean) * inv, and
    dX = inv * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) per group, dxhat = dY * scale;
    dScale = sum(dY * xhat), dB = sum(dY) per channel (or per group, opset 18-20 GroupNormalization)."""
    dy, needs = dys[0], g.needs
    x, x_type = g.x(0), g.in_types[0]
    rank, dtype = len(x_type.shape), x_type.dtype
    grouped = g.const([0, groups or 0, -1], np.int64, "grouped_shape")
    dx = dscale = dbias = xhat = inv = dxhat = None
    if needs[0] or needs[1]:
        xg = g.emit("Reshape", [x, grouped])
        centered = g.emit("Sub", [xg, _reduce(g, "ReduceMean", xg, [2], 1)])
        var = _reduce(g, "ReduceMean", g.emit("Mul", [centered, centered]), [2], 1)
        eps = g.const(g.attr("epsilon"), dtype, "epsilon")
        inv = g.emit("Reciprocal", [g.emit("Sqrt", [g.emit("Add", [var, eps])])])
        xhat = g.emit("Mul", [centered, inv])                                          # [N, G, M]
    if per_channel:
        axes = [0] + list(range(2, rank))
        if needs[0]:
            column = g.emit("Reshape", [g.x(1), g.const([-1] + [1] * (rank - 2), np.int64, "channel_column")])
            dxhat = g.emit("Reshape", [g.emit("Mul", [dy, column]), grouped])
        if needs[1]:
            xhat_x = g.emit("Reshape", [xhat, g.shape_of(x)])
            dscale = _reduce(g, "ReduceSum", g.emit("Mul", [dy, xhat_x]), axes, 0)
        if needs[2]:
            dbias = _reduce(g, "ReduceSum", dy, axes, 0)
    else:
        dyg = g.emit("Reshape", [dy, grouped])
        if needs[0]:
            dxhat = g.emit("Mul", [dyg, g.emit("Reshape", [g.x(1), g.const([-1, 1], np.int64, "group_column")])])
        if needs[1]:
            dscale = _reduce(g, "ReduceSum", g.emit("Mul", [dyg, xhat]), [0, 2], 0)
        if needs[2]:
            dbias = _reduce(g, "ReduceSum", dyg, [0, 2], 0)
    if needs[0]:
        mean_dxhat = _reduce(g, "ReduceMean", dxhat, [2], 1)
        projection = g.emit("Mul", [xhat, _reduce(g, "ReduceMean", g.emit("Mul", [dxhat, xhat]), [2], 1)])
        dxg = g.emit("Mul", [inv, g.emit("Sub", [g.emit("Sub", [dxhat, mean_dxhat]), projection])])
        dx = g.emit("Reshape", [dxg, g.shape_of(x)])
    return [dx, _param_shaped(g, dscale, 1), _param_shaped(g, dbias, 2)]


def _group_norm_vjp(g, dys):
    return _grouped_vjp(g, dys, g.attr("num_groups"), g.opset >= 21)


def _instance_norm_vjp(g, dys):
    return _grouped_vjp(g, dys, None, True)


BATCH_NORM = OpDef(
    "BatchNormalization", _batch_norm, since=15, kernel="normalization.batch_norm", workspace=_bn_workspace,
    vjp=_bn_vjp, train_form=_bn_train_form, eval_form=_bn_eval_form, attrs=BN_ATTRS,
    doc="inference mode, or training_mode=1 with outputs Y, running_mean, running_var (biased batch var); "
        "trains as com.microsoft BatchNormInternal in training mode")

# --- LpNormalization ----------------------------------------------------------------------------------------

def lp_axis(ctx, rank: int) -> int:
    if not rank:
        raise ctx.error("input must have rank >= 1")
    return normalize_axis(ctx, ctx.attr("axis"), rank)


def _lp_normalization(ctx: NodeContext):
    _float_input(ctx, 0, "input")
    lp_axis(ctx, len(ctx.shape(0)))
    return [ctx.type(0)]


def _lp_normalization_vjp(g, dys):
    """y = x / n with n = ||x||_p along the axis: dX = (dY - t * sum(dY * y)) / n, t = y (p = 2) or sign(x)
    (p = 1)."""
    axis, x, y = lp_axis(g, len(g.in_types[0].shape)), g.x(0), g.y()
    norm = _reduce(g, "ReduceL2" if g.attr("p") == 2 else "ReduceL1", x, [axis], 1)
    t = y if g.attr("p") == 2 else g.emit("Sign", [x])
    projection = g.emit("Mul", [t, _reduce(g, "ReduceSum", g.emit("Mul", [dys[0], y]), [axis], 1)])
    return [g.emit("Div", [g.emit("Sub", [dys[0], projection]), norm])]


LRN_ATTRS = {"alpha": Float(0.0001), "beta": Float(0.75), "bias": Float(1.0), "size": Int(REQUIRED, low=1)}


def lrn_view(ctx: NodeContext, i: int = 0) -> tuple[int, int, int]:
    """Input ``i`` as [N, C, spatial]; LRN sums squares over a window of ``size`` channels."""
    shape = tuple(ctx.shape(i))
    if len(shape) < 2:
        raise ctx.error(f"input must be [N, C, ...], got shape {list(shape)}")
    return shape[0], shape[1], int(np.prod(shape[2:], dtype=np.int64))


def _lrn(ctx: NodeContext):
    lrn_view(ctx)
    return [ctx.type(0)]


def _lrn_vjp(g, dys):
    """s_c = bias + alpha / size * sum of x^2 over c's window, y_c = x_c s_c^-beta:
    dx_k = dy_k s_k^-beta - 2 alpha beta / size * x_k * sum over the windows c holding k of dy_c y_c / s_c.
    ai.edgetrain LRNGrad(dY, X, Y) (onnxruntime has no LRN gradient op)."""
    from .softmax import EDGETRAIN
    attrs = {k: g.attr(k) for k in LRN_ATTRS}
    return [g.emit("LRNGrad", [dys[0], g.x(0), g.y()], attrs, EDGETRAIN)]


def _lrn_grad(ctx: NodeContext):
    if not ctx.type(0) == ctx.type(1) == ctx.type(2):
        raise ctx.error("dY, X and Y must share one type")
    lrn_view(ctx, 1)
    return [ctx.type(1)]


OPS = (
    OpDef("LRN", _lrn, since=13, kernel="normalization.lrn", vjp=_lrn_vjp, attrs=LRN_ATTRS,
          doc="across channels; gradient ai.edgetrain LRNGrad"),
    OpDef("LRNGrad", _lrn_grad, domain="ai.edgetrain", since=1, kernel="normalization.lrn_grad", attrs=LRN_ATTRS,
          doc="inputs dY, X, Y: LRN's gradient (edgetrain's own: onnxruntime has none)"),
    OpDef("LpNormalization", _lp_normalization, since=1, kernel="normalization.lp_normalization",
          vjp=_lp_normalization_vjp, attrs={"axis": Int(-1), "p": Int(2, choices=(1, 2))},
          doc="x / ||x||_p along one axis (p 1 or 2); a zero norm gives NaN, as the ONNX reference"),
    BATCH_NORM,
    OpDef("BatchNormInternal", _batch_norm_internal, domain=MS, since=1, kernel="normalization.batch_norm",
          workspace=_bn_workspace, vjp=_bn_internal_vjp, grad_outputs=5,
          attrs=BN_ATTRS | {"training_mode": Flag(1)},
          doc="onnxruntime's training form of BatchNormalization (training_mode defaults to 1): outputs Y, "
              "running_mean, running_var, saved_mean, saved_inv_std = 1 / sqrt(biased batch var + epsilon)"),
    OpDef("BatchNormalizationGrad", _batch_norm_grad, domain=MS, since=1, kernel="normalization.batch_norm_grad",
          attrs={"epsilon": EPSILON},
          doc="inputs dY, X, scale, saved_mean, saved_inv_std; attribute epsilon (unused: inv_std is given); "
              "outputs dX, dScale, dB of training-mode batch normalization"),
    OpDef("GroupNormalization", _group_norm, since=18, kernel="normalization.group_norm",
          workspace=_group_norm_workspace, vjp=_group_norm_vjp,
          attrs={"epsilon": EPSILON, "num_groups": Int(REQUIRED, low=1), "stash_type": STASH_TYPE},
          doc="opset 18-20: scale/bias per group; opset >= 21: per channel; gradient with plain ops"),
    OpDef("InstanceNormalization", _instance_norm, since=6, kernel="normalization.instance_norm",
          workspace=_instance_norm_workspace, vjp=_instance_norm_vjp, attrs={"epsilon": EPSILON},
          doc="gradient with plain ops"),
    OpDef("LayerNormalization", _layer_norm, since=17, kernel="normalization.layer_norm",
          workspace=_layer_norm_workspace, vjp=_layer_norm_vjp, grad_outputs=3, attrs=LAYER_NORM_ATTRS,
          doc="outputs Y and optional Mean, InvStdDev (element type from stash_type)"),
    OpDef("LayerNormalizationGrad", _layer_norm_grad, domain=MS, since=1, kernel="normalization.layer_norm_grad",
          workspace=_layer_norm_grad_workspace, attrs=LAYER_NORM_ATTRS,
          doc="inputs dY, X, scale, mean, inv_std_dev; attributes axis (and LayerNormalization's epsilon, "
              "stash_type: unused); outputs dX, dScale, dBias"),
)
