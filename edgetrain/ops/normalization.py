"""Normalization ops: BatchNormalization (inference and training mode), LayerNormalization,
GroupNormalization (opset 18 per-group and opset 21 per-channel scale/bias) and InstanceNormalization.

Statistics accumulate in float64 into a planned workspace; see ``edgetrain.kernels.normalization``.
"""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from ..ir.dtypes import FLOATS
from .base import NodeContext, OpDef, normalize_axis


def _float_input(ctx: NodeContext, i: int, what: str) -> TensorType:
    t = ctx.type(i)
    if t.dtype not in FLOATS:
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

def _batch_norm(ctx: NodeContext):
    x = ctx.type(0)
    if len(x.shape) < 2:
        raise ctx.error(f"X must have rank >= 2 ([N, C, ...]), got shape {x.shape}")
    c = x.shape[1]
    for i, what in enumerate(("scale", "B", "input_mean", "input_var"), start=1):
        _channel_param(ctx, i, what, c)
    if ctx.type(3).dtype != ctx.type(4).dtype:
        raise ctx.error("input_mean and input_var must share one element type")
    training = int(ctx.attr("training_mode", 0))
    if training not in (0, 1):
        raise ctx.error(f"training_mode must be 0 or 1, got {training}")
    n_out = _n_outputs(ctx)
    if n_out > 3:
        raise ctx.error(f"has {n_out} outputs; opset 15 BatchNormalization has at most 3 "
                        "(Y, running_mean, running_var)")
    if not training and any(ctx.node.outputs[1:]):
        raise ctx.error("running_mean/running_var outputs need training_mode=1")
    stat = TensorType(ctx.type(3).dtype, (c,))
    return [x, stat, stat][:max(1, n_out)]


# --- LayerNormalization -----------------------------------------------------------------------------------

STASH_TYPES = {1: np.dtype(np.float32), 11: np.dtype(np.float64)}


def stash_dtype(ctx: NodeContext) -> np.dtype:
    code = int(ctx.attr("stash_type", 1))
    if code not in STASH_TYPES:
        raise ctx.error(f"stash_type {code} is not supported; supported: 1 (float), 11 (double)")
    return STASH_TYPES[code]


def layer_norm_axis(ctx: NodeContext) -> int:
    rank = len(ctx.shape(0))
    if rank == 0:
        raise ctx.error("X must have rank >= 1")
    return normalize_axis(ctx, int(ctx.attr("axis", -1)), rank)


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


# --- GroupNormalization / InstanceNormalization ----------------------------------------------------------

def group_norm_per_channel(ctx: NodeContext) -> bool:
    """Opset 21 changed scale/bias from one value per group to one per channel."""
    return ctx.opset >= 21


def _group_norm(ctx: NodeContext):
    x = ctx.type(0)
    if len(x.shape) < 2:
        raise ctx.error(f"X must have rank >= 2 ([N, C, ...]), got shape {x.shape}")
    c = x.shape[1]
    g = int(ctx.attr("num_groups"))
    if g <= 0 or c % g:
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
    return [TensorType(STATS, (ctx.shape(0)[1], 2))] if ctx.attr("training_mode", 0) else []


def _layer_norm_workspace(ctx: NodeContext) -> list[TensorType]:
    shape = ctx.shape(0)
    return [TensorType(STATS, (int(np.prod(shape[:layer_norm_axis(ctx)], dtype=np.int64)), 2))]


def _group_norm_workspace(ctx: NodeContext) -> list[TensorType]:
    return [TensorType(STATS, (ctx.shape(0)[0] * int(ctx.attr("num_groups")), 2))]


def _instance_norm_workspace(ctx: NodeContext) -> list[TensorType]:
    return [TensorType(STATS, (ctx.shape(0)[0] * ctx.shape(0)[1], 2))]


OPS = (
    OpDef("BatchNormalization", _batch_norm, since=15, kernel="normalization.batch_norm", workspace=_bn_workspace,
          doc="inference mode, or training_mode=1 with outputs Y, running_mean, running_var (biased batch var)"),
    OpDef("GroupNormalization", _group_norm, since=18, kernel="normalization.group_norm",
          workspace=_group_norm_workspace, doc="opset 18-20: scale/bias per group; opset >= 21: per channel"),
    OpDef("InstanceNormalization", _instance_norm, since=6, kernel="normalization.instance_norm",
          workspace=_instance_norm_workspace),
    OpDef("LayerNormalization", _layer_norm, since=17, kernel="normalization.layer_norm",
          workspace=_layer_norm_workspace, doc="outputs Y and optional Mean, InvStdDev (element type from stash_type)"),
)
