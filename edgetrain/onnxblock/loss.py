"""Loss blocks with onnxruntime.training.onnxblock.loss' names and signatures."""
from __future__ import annotations

import numpy as np

from ..errors import EdgetrainError
from ..ir import TensorType
from . import blocks
from .onnxblock import Block

REDUCTIONS = ("mean", "sum", "none")


def _reduction_block(reduction: str) -> Block:
    if reduction not in REDUCTIONS:
        raise EdgetrainError(f"reduction '{reduction}' is not one of {', '.join(REDUCTIONS)}")
    return {"mean": lambda: blocks.ReduceMean(keepdims=False), "sum": lambda: blocks.ReduceSum(keepdims=False),
            "none": blocks.PassThrough}[reduction]()


def _target(block: Block, like: str, target_name: str) -> str:
    """The target graph input, created with the loss input's type when the model does not have it."""
    if block.base.has_value(target_name):
        return target_name
    return blocks.InputLike(like)(target_name)


class MSELoss(Block):
    """reduce((x - target)^2)."""

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self._reduce = _reduction_block(reduction)

    def build(self, loss_input_name: str, target_name: str = "target") -> str:
        target = _target(self, loss_input_name, target_name)
        return self._reduce(blocks.Pow(2.0)(blocks.Sub()(loss_input_name, target)))


class L1Loss(Block):
    """reduce(|x - target|)."""

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self._reduce = _reduction_block(reduction)

    def build(self, loss_input_name: str, target_name: str = "target") -> str:
        target = _target(self, loss_input_name, target_name)
        return self._reduce(blocks.Abs()(blocks.Sub()(loss_input_name, target)))


class CrossEntropyLoss(Block):
    """SoftmaxCrossEntropyLoss over class scores [N, C, ...] and int64 labels [N, ...]."""

    def __init__(self, weight=None, reduction: str = "mean", ignore_index: int | None = None):
        super().__init__()
        if reduction not in REDUCTIONS:
            raise EdgetrainError(f"reduction '{reduction}' is not one of {', '.join(REDUCTIONS)}")
        self._weight = None if weight is None else np.asarray(weight, np.float32)
        self._reduction, self._ignore_index = reduction, ignore_index

    def build(self, scores_input_name: str, labels_name: str = "labels") -> str:
        if not self.base.has_value(labels_name):
            scores = self.base.type_of(scores_input_name).shape
            self.base.add_input(labels_name, TensorType(np.int64, (scores[0],) + tuple(scores[2:])))
        inputs = [scores_input_name, labels_name]
        if self._weight is not None:
            inputs.append(self.base.add_initializer("celoss_weight", self._weight))
        attrs = {"reduction": self._reduction}
        if self._ignore_index is not None:
            attrs["ignore_index"] = int(self._ignore_index)
        loss, _ = self.base.add_node("SoftmaxCrossEntropyLoss", inputs, "", attrs, n_out=2,
                                     outputs=[_name("loss"), _name("log_prob")])
        return loss


def _name(token: str) -> str:
    from ._builder import generate_name
    return generate_name(token)


class BCEWithLogitsLoss(Block):
    """Binary cross entropy on logits, in the stable form:
    loss = w * ((1 - t) x + (1 + (pos_weight - 1) t) softplus(-x)), then reduced.

    onnxruntime builds -[t log sigmoid(x) + (1 - t) log(1 - sigmoid(x))], which overflows to inf for
    |x| > ~17 in float32; softplus(-x) = -log sigmoid(x) never does.
    """

    def __init__(self, weight=None, reduction: str = "mean", pos_weight=None):
        super().__init__()
        self._reduce = _reduction_block(reduction)
        self._weight = None if weight is None else np.asarray(weight, np.float32)
        self._pos_weight = None if pos_weight is None else np.asarray(pos_weight, np.float32)

    def build(self, loss_input_name: str, target_name: str = "target") -> str:
        b, x = self.base, loss_input_name
        t = _target(self, x, target_name)
        one = b.add_initializer("bce_one", 1.0)
        softplus = b.add_node("Softplus", [b.add_node("Neg", [x], "neg")], "softplus")
        loss = b.add_node("Mul", [b.add_node("Sub", [one, t], "sub"), x], "mul")
        if self._pos_weight is not None:
            scale = b.add_node("Add", [one, b.add_node("Mul", [b.add_initializer("bce_pos_weight_m1",
                                                                                   self._pos_weight - 1), t],
                                                         "mul")], "add")
            softplus = b.add_node("Mul", [scale, softplus], "mul")
        loss = b.add_node("Add", [loss, softplus], "add")
        if self._weight is not None:
            loss = b.add_node("Mul", [loss, b.add_initializer("bce_weight", self._weight)], "mul")
        return self._reduce(loss)
