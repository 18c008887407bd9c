"""Softmax, LogSoftmax (opset 13 semantics: one axis, default -1) and SoftmaxCrossEntropyLoss.

Each is one fused kernel (max, sum of exponentials, normalize) in ``edgetrain.kernels.softmax``.
"""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from ..ir.dtypes import INTS
from .base import NodeContext, OpDef, normalize_axis

REDUCTIONS = ("none", "sum", "mean")


def softmax_axis(ctx: NodeContext) -> int:
    shape = ctx.shape(0)
    if not shape:
        raise ctx.error("input must have rank >= 1")
    return normalize_axis(ctx, int(ctx.attr("axis", -1)), len(shape))


def softmax_view(ctx: NodeContext) -> tuple[int, int, int]:
    """X as [outer, n, inner] with n the softmax axis."""
    shape = ctx.shape(0)
    axis = softmax_axis(ctx)
    return (int(np.prod(shape[:axis], dtype=np.int64)), int(shape[axis]),
            int(np.prod(shape[axis + 1:], dtype=np.int64)))


def _softmax(ctx: NodeContext):
    softmax_view(ctx)
    return [ctx.type(0)]


def _softmax_workspace(ctx: NodeContext) -> list[TensorType]:
    """Running max and sum per inner position when the axis is not the last one."""
    inner = softmax_view(ctx)[2]
    return [TensorType(ctx.type(0).dtype, (2, inner))] if inner > 1 else []


def sce_reduction(ctx: NodeContext) -> str:
    reduction = ctx.attr("reduction", "mean")
    if reduction not in REDUCTIONS:
        raise ctx.error(f"reduction '{reduction}' is not one of {', '.join(REDUCTIONS)}")
    return reduction


def _softmax_cross_entropy(ctx: NodeContext):
    scores, labels = ctx.type(0), ctx.type(1)
    if len(scores.shape) < 2:
        raise ctx.error(f"scores must have shape [N, C] or [N, C, D1, ...], got {scores.shape}")
    if scores.shape[1] < 1:
        raise ctx.error("scores must have at least one class (C >= 1)")
    if labels.dtype not in INTS:
        raise ctx.error(f"labels must be int32 or int64, got {labels}")
    want = (scores.shape[0],) + scores.shape[2:]
    if tuple(labels.shape) != want:
        raise ctx.error(f"labels must have shape {want} (scores shape without C), got {labels.shape}")
    if ctx.has_input(2):
        w = ctx.type(2)
        if w.dtype != scores.dtype or tuple(w.shape) != (scores.shape[1],):
            raise ctx.error(f"weights must be {TensorType(scores.dtype, (scores.shape[1],))}, got {w}")
    reduction = sce_reduction(ctx)
    if len(ctx.node.outputs) > 2:
        raise ctx.error("SoftmaxCrossEntropyLoss has at most 2 outputs (loss, log_prob)")
    loss = TensorType(scores.dtype, want if reduction == "none" else ())
    return [loss, scores][:max(1, len(ctx.node.outputs))]


OPS = (
    OpDef("LogSoftmax", _softmax, since=13, kernel="softmax.log_softmax", workspace=_softmax_workspace),
    OpDef("Softmax", _softmax, since=13, kernel="softmax.softmax", workspace=_softmax_workspace),
    OpDef("SoftmaxCrossEntropyLoss", _softmax_cross_entropy, since=13, kernel="softmax.softmax_cross_entropy",
          doc="reduction none/sum/mean, optional weights and ignore_index; outputs loss and optional log_prob"),
)
