"""Optimizer blocks with onnxruntime.training.onnxblock.optim's names, signatures and defaults.

Each builds the optimizer model: inputs ``learning_rate`` float[1], ``step`` int64[1], and tensor sequences
``params``, ``gradients``, ``first_order_moments`` (declared for every optimizer, as ORT does) and, for AdamW,
``second_order_moments``; one update node; a bool[1] "done" output.
"""
from __future__ import annotations

import copy

import numpy as np

from ..errors import EdgetrainError
from ..ir import SequenceType, TensorType
from ..onnx_io import value_info
from ._builder import add_input, add_node, current
from .onnxblock import ForwardBlock, typecheck

MS = "com.microsoft"
EDGETRAIN = "ai.edgetrain"


def _dtype(parameters) -> np.dtype:
    from ..onnx_io import tensor_value
    trainable = parameters[0] if isinstance(parameters, tuple) else parameters
    if not trainable:
        raise EdgetrainError("the optimizer needs at least one trainable parameter")
    return tensor_value(trainable[0]).dtype


class ClipGradNorm(ForwardBlock):
    """com.microsoft InplaceClipGradNorm: scale the gradients so their global L2 norm is at most max_norm."""

    def __init__(self, max_norm: float):
        super().__init__()
        self._max_norm = float(max_norm)

    def build(self, gradients_name: str) -> str:
        out = add_node(self.base, "InplaceClipGradNorm", [gradients_name], "clip_grad_norm",
                       {"max_norm": self._max_norm, "norm_type": "fro"}, MS)
        # the clipped gradients are a sequence like the input (ORT records that as value_info too)
        self.base.graph.value_info.append(value_info(out, SequenceType(np.float32)))
        return out


class _Optimizer(ForwardBlock):
    moments = 1

    def __init__(self, clip_grad: ClipGradNorm | None = None):
        super().__init__()
        self._clip_grad = clip_grad

    def _inputs(self, parameters) -> list[str]:
        b, dtype = self.base, _dtype(parameters)
        names = [add_input(b, "learning_rate", TensorType(np.float32, (1,))),
                 add_input(b, "step", TensorType(np.int64, (1,))),
                 add_input(b, "params", SequenceType(dtype)), add_input(b, "gradients", SequenceType(dtype)),
                 add_input(b, "first_order_moments", SequenceType(dtype))]
        if self.moments == 2:
            names.append(add_input(b, "second_order_moments", SequenceType(dtype)))
        if self._clip_grad is not None:
            names[3] = self._clip_grad(names[3])
        return names

    def __call__(self, parameters):
        # the optimizer graph holds sequences, which the shape rules do not type: its one output is the flag
        self.base = current().model
        out = self.build(parameters)
        typecheck(self.base, [out])
        del self.base.graph.output[:]
        self.base.graph.output.append(value_info(out, TensorType(np.bool_, (1,))))
        self._model = copy.deepcopy(self.base)
        return out


class AdamW(_Optimizer):
    """com.microsoft AdamWOptimizer in the Hugging Face form (adam_mode=1), with ORT's defaults."""
    moments = 2

    def __init__(self, bias_correction: bool = True, betas=(0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, clip_grad: ClipGradNorm | None = None):
        super().__init__(clip_grad)
        self._attrs = {"alpha": float(betas[0]), "beta": float(betas[1]), "epsilon": float(eps),
                       "weight_decay": float(weight_decay), "correct_bias": int(bool(bias_correction)),
                       "adam_mode": 1}

    def build(self, parameters) -> str:
        return add_node(self.base, "AdamWOptimizer", self._inputs(parameters), "adamw.updated_flag", self._attrs,
                                  MS, outputs=[_name("adamw.updated_flag")])


class SGD(_Optimizer):
    """Plain SGD (p -= lr * g) is ORT's com.microsoft SGDOptimizerV2. With momentum, Nesterov or weight
    decay (an edgetrain extension, as torch.optim.SGD: v = momentum v + g + wd p; p -= lr (g + momentum v)
    for Nesterov, else lr v) it is ai.edgetrain SGDOptimizer, which onnxruntime cannot run."""

    def __init__(self, clip_grad: ClipGradNorm | None = None, momentum: float = 0.0, nesterov: bool = False,
                 weight_decay: float = 0.0):
        super().__init__(clip_grad)
        if nesterov and momentum <= 0:
            raise EdgetrainError("Nesterov momentum needs momentum > 0")
        self._momentum, self._nesterov, self._weight_decay = float(momentum), bool(nesterov), float(weight_decay)

    def build(self, parameters) -> str:
        names = self._inputs(parameters)
        if self._momentum == 0.0 and self._weight_decay == 0.0:
            return add_node(self.base, "SGDOptimizerV2", [names[0], names[2], names[3]], "update_completed",
                                      domain=MS, outputs=[_name("update_completed")])
        attrs = {"momentum": self._momentum, "nesterov": int(self._nesterov), "weight_decay": self._weight_decay}
        return add_node(self.base, "SGDOptimizer", [names[0], names[2], names[3], names[4]], "update_completed",
                                  attrs, EDGETRAIN, outputs=[_name("update_completed")])


def _name(token: str) -> str:
    from ._builder import generate_name
    return generate_name(token)
