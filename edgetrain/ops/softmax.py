"""Softmax, LogSoftmax (opset 13 semantics: one axis, default -1), SoftmaxCrossEntropyLoss and
NegativeLogLikelihoodLoss.

Each is one fused kernel (max, sum of exponentials, normalize) in ``edgetrain.kernels.softmax``.
NegativeLogLikelihoodLoss is SoftmaxCrossEntropyLoss over scores that already are log-probabilities: one
kernel serves both, and its gradient ai.edgetrain NegativeLogLikelihoodLossGrad (onnxruntime has none) is
SoftmaxCrossEntropyLossGrad without the softmax term.
"""
from __future__ import annotations

from ..ir import TensorType
from ..ir.dtypes import FLOATS, INTS, computed_as
from .attrs import Int, String
from .base import NodeContext, OpDef, axis_view, normalize_axis

EDGETRAIN = "ai.edgetrain"
REDUCTIONS = ("none", "sum", "mean")
AXIS = {"axis": Int(-1)}
SCE_ATTRS = {"ignore_index": Int(), "reduction": String("mean", REDUCTIONS)}


def softmax_axis(ctx: NodeContext) -> int:
    shape = ctx.shape(0)
    if not shape:
        raise ctx.error("input must have rank >= 1")
    return normalize_axis(ctx, ctx.attr("axis"), len(shape))


def softmax_view(ctx: NodeContext) -> tuple[int, int, int]:
    """X as [outer, n, inner] with n the softmax axis."""
    return axis_view(ctx, softmax_axis(ctx))


def _softmax(ctx: NodeContext):
    softmax_view(ctx)
    return [ctx.type(0)]


def _softmax_workspace(ctx: NodeContext) -> list[TensorType]:
    """Running max and sum per inner position when the axis is not the last one."""
    inner = softmax_view(ctx)[2]
    return [TensorType(ctx.type(0).dtype, (2, inner))] if inner > 1 else []


def sce_reduction(ctx: NodeContext) -> str:
    return ctx.attr("reduction")


def _label_loss(ctx: NodeContext, max_outputs: int) -> list[TensorType]:
    """Loss [, log_prob] of SoftmaxCrossEntropyLoss (scores) or NegativeLogLikelihoodLoss (log-probabilities)."""
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
    if len(ctx.node.outputs) > max_outputs:
        raise ctx.error(f"{ctx.node.op_type} has at most {max_outputs} output(s)"
                        + (" (loss, log_prob)" if max_outputs > 1 else " (loss)"))
    loss = TensorType(scores.dtype, want if reduction == "none" else ())
    return [loss, scores][:max(1, len(ctx.node.outputs))]


def _softmax_cross_entropy(ctx: NodeContext):
    return _label_loss(ctx, 2)


def _nll(ctx: NodeContext):
    return _label_loss(ctx, 1)


def _sce_attrs(g) -> dict:
    attrs = {"reduction": g.attr("reduction")}
    if g.attr("ignore_index") is not None:
        attrs["ignore_index"] = g.attr("ignore_index")
    return attrs


def _sce_vjp(g, dys):
    """d scores = (softmax - onehot(label)) * w[label] * dloss (/ sum of weights for mean)."""
    inputs = [dys[0], g.y(1), g.x(1)] + ([g.x(2)] if len(g.node.inputs) > 2 and g.node.inputs[2] else [])
    return [g.emit("SoftmaxCrossEntropyLossGrad", inputs, _sce_attrs(g), "com.microsoft"), None, None]


def _nll_vjp(g, dys):
    """d input = -onehot(label) * w[label] * dloss (/ sum of weights for mean): reads the input only for its
    shape, as the kernel's size."""
    inputs = [dys[0], g.x(0), g.x(1)] + ([g.x(2)] if len(g.node.inputs) > 2 and g.node.inputs[2] else [])
    return [g.emit("NegativeLogLikelihoodLossGrad", inputs, _sce_attrs(g), EDGETRAIN), None, None]


def _softmax_vjp(grad_op: str):
    """Softmax: dX = Y * (dY - sum(dY * Y)); LogSoftmax: dX = dY - exp(Y) * sum(dY), along the axis."""
    return lambda g, dys: [g.emit(grad_op, [dys[0], g.y()], {"axis": g.attr("axis")}, "com.microsoft")]


def _sce_grad(ctx: NodeContext):
    """Inputs dY, log_prob [N, C, D...], labels [N, D...][, weights [C]]; dY is the loss's gradient: labels'
    shape for reduction none, one element otherwise. The kernel indexes weights by label, so its length is C."""
    dy, log_prob, labels = ctx.type(0), ctx.type(1), ctx.type(2)
    if len(log_prob.shape) < 2 or log_prob.shape[1] < 1 or computed_as(log_prob.dtype) not in FLOATS:
        raise ctx.error(f"log_prob must be float [N, C, D1, ...] with C >= 1, got {log_prob}")
    if labels.dtype not in INTS or tuple(labels.shape) != (log_prob.shape[0],) + tuple(log_prob.shape[2:]):
        raise ctx.error(f"labels {labels} do not match log_prob {log_prob}")
    reduction = sce_reduction(ctx)
    loss_shape = tuple(labels.shape) if reduction == "none" else ()
    if dy.dtype != log_prob.dtype or (tuple(dy.shape) != loss_shape if reduction == "none" else dy.size != 1):
        raise ctx.error(f"dY must be the gradient of the {reduction}-reduced loss, "
                        f"{TensorType(log_prob.dtype, loss_shape)}, got {dy}")
    if ctx.has_input(3):
        w = ctx.type(3)
        if w.dtype != log_prob.dtype or tuple(w.shape) != (log_prob.shape[1],):
            raise ctx.error(f"weights must be {TensorType(log_prob.dtype, (log_prob.shape[1],))} (one per class), "
                            f"got {w}")
    return [log_prob]


def _softmax_grad(ctx: NodeContext):
    if ctx.shape(0) != ctx.shape(1):
        raise ctx.error("dY and Y must have the same shape")
    softmax_view(ctx)
    return [ctx.type(0)]


OPS = (
    OpDef("Hardmax", _softmax, since=13, kernel="softmax.hardmax", attrs=AXIS,
          doc="1 at the first largest value along the axis (NaN counts as the largest), 0 elsewhere"),
    OpDef("LogSoftmax", _softmax, since=13, kernel="softmax.log_softmax", workspace=_softmax_workspace,
          vjp=_softmax_vjp("LogSoftmaxGrad_13"), attrs=AXIS),
    OpDef("LogSoftmaxGrad_13", _softmax_grad, domain="com.microsoft", since=1, kernel="softmax.log_softmax_grad",
          attrs=AXIS,
          doc="dX = dY - exp(Y) * sum(dY) along axis"),
    OpDef("NegativeLogLikelihoodLoss", _nll, since=13, kernel="softmax.nll_loss", vjp=_nll_vjp, attrs=SCE_ATTRS,
          doc="input: log-probabilities [N, C, D...]; reduction none/sum/mean, optional weight and ignore_index"),
    OpDef("NegativeLogLikelihoodLossGrad", _sce_grad, domain=EDGETRAIN, since=1, kernel="softmax.nll_loss_grad",
          attrs=SCE_ATTRS,
          doc="inputs dY, input, target[, weight]: d input = -onehot * w * dY (/ sum w for mean)"),
    OpDef("Softmax", _softmax, since=13, kernel="softmax.softmax", workspace=_softmax_workspace,
          vjp=_softmax_vjp("SoftmaxGrad_13"), attrs=AXIS),
    OpDef("SoftmaxCrossEntropyLoss", _softmax_cross_entropy, since=13, kernel="softmax.softmax_cross_entropy",
          vjp=_sce_vjp, grad_outputs=2, attrs=SCE_ATTRS,
          doc="reduction none/sum/mean, optional weights and ignore_index; outputs loss and optional log_prob"),
    OpDef("SoftmaxCrossEntropyLossGrad", _sce_grad, domain="com.microsoft", since=1,
          kernel="softmax.softmax_cross_entropy_grad", attrs=SCE_ATTRS,
          doc="inputs dY, log_prob, labels[, weights]: dX = (exp(log_prob) - onehot) * w * dY (/ sum w for mean)"),
    OpDef("SoftmaxGrad_13", _softmax_grad, domain="com.microsoft", since=1, kernel="softmax.softmax_grad",
          attrs=AXIS,
          doc="dX = Y * (dY - sum(dY * Y)) along axis"),
)
