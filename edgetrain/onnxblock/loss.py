"""Loss blocks with onnxruntime.training.onnxblock.loss' names and signatures."""
from __future__ import annotations

import numpy as np

from ..errors import EdgetrainError
from ..ir import TensorType
from . import blocks
from ._builder import add_initializer, add_input, add_node, has_value, type_of
from .onnxblock import Block

REDUCTIONS = ("mean", "sum", "none")


def _reduction_block(reduction: str) -> Block:
    if reduction not in REDUCTIONS:
        raise EdgetrainError(f"reduction '{reduction}' is not one of {', '.join(REDUCTIONS)}")
    return {"mean": lambda: blocks.ReduceMean(keepdims=False), "sum": lambda: blocks.ReduceSum(keepdims=False),
            "none": _Identity}[reduction]()


class _Identity(Block):
    """reduction='none': the loss values themselves (one name, where ORT's PassThrough gives a 1-tuple)."""

    def build(self, input_name: str) -> str:
        return input_name


def _target(block: Block, like: str, target_name: str) -> str:
    """The target graph input, created with the loss input's type when the model does not have it."""
    if has_value(block.base, target_name):
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
        if not has_value(self.base, labels_name):
            scores = type_of(self.base, scores_input_name).shape
            add_input(self.base, labels_name, TensorType(np.int64, (scores[0],) + tuple(scores[2:])))
        inputs = [scores_input_name, labels_name]
        if self._weight is not None:
            inputs.append(add_initializer(self.base, "celoss_weight", self._weight))
        attrs = {"reduction": self._reduction}
        if self._ignore_index is not None:
            attrs["ignore_index"] = int(self._ignore_index)
        loss, _ = add_node(self.base, "SoftmaxCrossEntropyLoss", inputs, "", attrs, n_out=2,
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
        one = add_initializer(b, "bce_one", 1.0)
        softplus = add_node(b, "Softplus", [add_node(b, "Neg", [x], "neg")], "softplus")
        loss = add_node(b, "Mul", [add_node(b, "Sub", [one, t], "sub"), x], "mul")
        if self._pos_weight is not None:
            scale = add_node(b, "Add", [one, add_node(b, "Mul", [add_initializer(b, "bce_pos_weight_m1",
                                                                                   self._pos_weight - 1), t],
                                                         "mul")], "add")
            softplus = add_node(b, "Mul", [scale, softplus], "mul")
        loss = add_node(b, "Add", [loss, softplus], "add")
        if self._weight is not None:
            loss = add_node(b, "Mul", [loss, add_initializer(b, "bce_weight", self._weight)], "mul")
        return self._reduce(loss)
