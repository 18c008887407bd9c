"""Ops that only training graphs use: gradient accumulation and the optimizer updates.

Optimizer models take ``params``, ``gradients`` and the moments as tensor sequences; edgetrain's runtime keeps
each kind of state as ONE contiguous flat array (tensors concatenated in one order) and plans the optimizer
graph with those inputs typed as flat 1-D tensors of one length. AdamW, SGD and the global-norm clip are
element-wise or global over the concatenation, so one pass over the flat arrays is exact. The update ops
write their inputs in place (the runtime binds them to the state store) and are never folded.
"""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from .attrs import Flag, Float, Int, String
from .base import NodeContext, OpDef


def _accumulator(ctx: NodeContext):
    buffer, value = ctx.type(0), ctx.type(1)
    if buffer.shape != value.shape or buffer.dtype != value.dtype:
        raise ctx.error(f"buffer {buffer} and value {value} must have one type")
    if ctx.has_input(2) and (ctx.type(2).dtype != np.bool_ or ctx.type(2).size != 1):
        raise ctx.error(f"overwrite flag must be bool[1], got {ctx.type(2)}")
    return [TensorType(np.bool_, (1,)), buffer][:max(1, len(ctx.node.outputs))]


# --- optimizers ---------------------------------------------------------------------------------------------

_FLAG = TensorType(np.bool_, (1,))


def _scalar(ctx: NodeContext, i: int, what: str, dtypes) -> None:
    t = ctx.type(i)
    if not isinstance(t, TensorType) or t.dtype not in dtypes or t.size != 1:
        want = " or ".join(np.dtype(d).name for d in dtypes)
        raise ctx.error(f"input {i} ('{what}') must be a {want} tensor of one element, got {t}")


def _flat_state(ctx: NodeContext, slots: dict[int, str]) -> TensorType:
    """The one flat type shared by the state inputs ``slots`` (input index -> name)."""
    first = None
    for i, what in slots.items():
        t = ctx.type(i)
        if not isinstance(t, TensorType) or len(t.shape) != 1:
            raise ctx.error(f"input {i} ('{what}') must be bound as one flat 1-D tensor (the runtime concatenates "
                            f"the tensor sequence), got {t}")
        if first is None:
            first = (i, what, t)
        elif t != first[2]:
            raise ctx.error(f"input {i} ('{what}') is {t} but input {first[0]} ('{first[1]}') is {first[2]}: "
                            "parameters, gradients and moments must have one element type and one length")
    return first[2]


def _update_signal(ctx: NodeContext, i: int) -> None:
    if ctx.has_input(i):
        _scalar(ctx, i, "update_signal", (np.bool_,))


def _outputs(ctx: NodeContext, types: list[TensorType]) -> list[TensorType]:
    """The done flag, then the optional updated-state outputs the node names (copies of the updated inputs)."""
    n = len(ctx.node.outputs)
    if n > len(types):
        raise ctx.error(f"has {n} outputs; {ctx.node.op_type} has at most {len(types)}")
    return types[:max(1, n)]


def _adamw(ctx: NodeContext):
    _scalar(ctx, 0, "lr", (np.float32, np.float64))
    _scalar(ctx, 1, "step", (np.int64,))
    t = _flat_state(ctx, {2: "params", 3: "gradients", 4: "first_order_moments", 5: "second_order_moments"})
    _update_signal(ctx, 6)
    mode, correct_bias = ctx.attr("adam_mode"), ctx.attr("correct_bias")
    if mode == 0 and correct_bias == 0:
        raise ctx.error("correct_bias must be 1 with adam_mode 0 (PyTorch AdamW), as onnxruntime requires")
    return _outputs(ctx, [_FLAG, t, t, t])


def _sgd_v2(ctx: NodeContext):
    _scalar(ctx, 0, "lr", (np.float32, np.float64))
    t = _flat_state(ctx, {1: "params", 2: "gradients"})
    _update_signal(ctx, 3)
    return _outputs(ctx, [_FLAG, t])


def _sgd_momentum(ctx: NodeContext):
    _scalar(ctx, 0, "lr", (np.float32, np.float64))
    t = _flat_state(ctx, {1: "params", 2: "gradients", 3: "first_order_moments"})
    momentum = ctx.attr("momentum")
    if momentum < 0:
        raise ctx.error(f"momentum must be >= 0, got {momentum}")
    if ctx.attr("nesterov") and momentum <= 0:
        raise ctx.error("Nesterov momentum needs momentum > 0")
    return _outputs(ctx, [_FLAG, t, t])


def _clip_grad_norm(ctx: NodeContext):
    t = _flat_state(ctx, {0: "gradients"})
    if not ctx.attr("max_norm") > 0:
        raise ctx.error(f"max_norm must be > 0, got {ctx.attr('max_norm')}")
    return _outputs(ctx, [t])


OPS = (
    OpDef("InPlaceAccumulatorV2", _accumulator, domain="com.microsoft", since=1, kernel="training.accumulate",
          deterministic=False, writes_inputs=(0,),
          doc="buffer = value if overwrite else buffer + value, in place in input 0; outputs (done flag, "
              "optional updated buffer)"),
    OpDef("AdamWOptimizer", _adamw, domain="com.microsoft", since=1, kernel="training.adamw",
          deterministic=False, writes_inputs=(2, 4, 5), type_input=2,
          attrs={"adam_mode": Int(0, choices=(0, 1)), "alpha": Float(0.9), "beta": Float(0.999),
                 "correct_bias": Flag(1), "epsilon": Float(1e-8), "weight_decay": Float(0.0)},
          doc="AdamW over flat (lr, step, params, gradients, m1, m2[, update_signal]); updates params and moments "
              "in place. step is the 1-based count of this update (onnxruntime feeds steps taken + 1). "
              "adam_mode 0 (PyTorch): p -= lr*wd*p; m, v; p -= lr*m / ((1-b1^t) (sqrt(v/(1-b2^t)) + eps)). "
              "adam_mode 1 (Hugging Face): m, v; p -= lr*sqrt(1-b2^t)/(1-b1^t) * m/(sqrt(v) + eps); "
              "p -= lr*wd*p. Outputs (updated flag, optional copies of params, m1, m2)"),
    OpDef("InplaceClipGradNorm", _clip_grad_norm, domain="com.microsoft", since=1, kernel="training.clip_grad_norm",
          deterministic=False, writes_inputs=(0,),
          attrs={"max_norm": Float(1.0), "norm_type": String("fro", ("fro",))},
          doc="g *= min(max_norm / (||g||_2 + 1e-6), 1) over the flat gradients, in place; output 0 is the "
              "clipped gradients (written too when it is not input 0's array)"),
    OpDef("SGDOptimizer", _sgd_momentum, domain="ai.edgetrain", since=1, kernel="training.sgd_momentum",
          deterministic=False, writes_inputs=(1, 3), type_input=1,
          attrs={"momentum": Float(0.0), "nesterov": Flag(0), "weight_decay": Float(0.0)},
          doc="torch.optim.SGD (dampening 0) over flat (lr, params, gradients, velocity): g' = g + wd*p; "
              "v = momentum*v + g'; p -= lr*(g' + momentum*v if nesterov else v). Velocity starts at zero, "
              "so the first step gives v = g' as torch does. Outputs (done flag, optional params, velocity)"),
    OpDef("SGDOptimizerV2", _sgd_v2, domain="com.microsoft", since=1, kernel="training.sgd",
          deterministic=False, writes_inputs=(1,), type_input=1,
          doc="p -= lr*g over flat (lr, params, gradients[, update_signal]), in place; outputs (done flag, "
              "optional copy of params)"),
)
