"""Building blocks with onnxruntime.training.onnxblock.blocks' names and signatures."""
from __future__ import annotations

import numpy as np

from ..errors import EdgetrainError
from ..ir import TensorType
from .onnxblock import Block


class _Unary(Block):
    op: str = ""

    def build(self, input_name: str) -> str:
        return self.base.add_node(self.op, [input_name], self.op.lower())


class _Binary(Block):
    op: str = ""

    def build(self, input_name1: str, input_name2: str) -> str:
        return self.base.add_node(self.op, [input_name1, input_name2], self.op.lower())


class Add(_Binary):
    op = "Add"


class Sub(_Binary):
    op = "Sub"


class Mul(_Binary):
    op = "Mul"


class Div(_Binary):
    op = "Div"


class Sigmoid(_Unary):
    op = "Sigmoid"


class Log(_Unary):
    op = "Log"


class Neg(_Unary):
    op = "Neg"


class Abs(_Unary):
    op = "Abs"


class Pow(Block):
    def __init__(self, exponent: float):
        super().__init__()
        self._exponent = exponent

    def build(self, input_name: str) -> str:
        exponent = self.base.add_initializer("pow_exponent", [self._exponent])
        return self.base.add_node("Pow", [input_name, exponent], "pow")


class Constant(Block):
    """A float constant of shape [1]."""

    def __init__(self, value_float: float):
        super().__init__()
        self._value = value_float

    def build(self) -> str:
        return self.base.add_initializer("constant", [self._value])


class _Reduce(Block):
    op: str = ""

    def __init__(self, keepdims: bool = True):
        super().__init__()
        self._keepdims = keepdims

    def build(self, input_name: str) -> str:
        return self.base.add_node(self.op, [input_name], self.op.lower(), {"keepdims": int(self._keepdims)})


class ReduceMean(_Reduce):
    op = "ReduceMean"


class ReduceSum(_Reduce):
    op = "ReduceSum"


class Clip(Block):
    def __init__(self, clip_min: float | None = None, clip_max: float | None = None):
        super().__init__()
        self._min, self._max = clip_min, clip_max

    def build(self, input_name: str) -> str:
        lo = self.base.add_initializer("clip_min", self._min) if self._min is not None else ""
        hi = self.base.add_initializer("clip_max", self._max) if self._max is not None else ""
        return self.base.add_node("Clip", [input_name, lo, hi], "clip")


class Cast(Block):
    def __init__(self, to):
        super().__init__()
        self._to = int(to)

    def build(self, input_name: str) -> str:
        return self.base.add_node("Cast", [input_name], "cast", {"to": self._to})


class SequenceConstruct(Block):
    def build(self, *input_names: str) -> str:
        return self.base.add_node("SequenceConstruct", list(input_names), "sequenceconstruct")


class ReduceAllL2(Block):
    """com.microsoft ReduceAllL2: the L2 norm of all elements of all inputs."""

    def build(self, *input_names: str) -> str:
        return self.base.add_node("ReduceAllL2", list(input_names), "reducealll2", domain="com.microsoft")


class PassThrough(Block):
    """The input unchanged (the default loss: the model's first output is the loss)."""

    def build(self, input_name: str) -> str:
        return input_name


class InputLike(Block):
    """A new graph input with the type of ``like`` (a target like the model's output)."""

    def __init__(self, like: str):
        super().__init__()
        self._like = like

    def build(self, input_name: str) -> str:
        t = self.base.type_of(self._like)
        return self.base.add_input(input_name, TensorType(t.dtype, t.shape))


class Linear(Block):
    """Gemm with a [out, in] weight and an optional [out] bias, initialized as torch.nn.Linear does."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, alpha: float = 1.0,
                 beta: float = 1.0):
        super().__init__()
        if in_features < 1 or out_features < 1:
            raise EdgetrainError(f"Linear needs positive sizes, got {in_features} -> {out_features}")
        self._in, self._out, self._bias, self._alpha, self._beta = in_features, out_features, bias, alpha, beta

    def build(self, input_name: str) -> str:
        bound = 1.0 / np.sqrt(self._in)
        rng = np.random.default_rng()
        w = self.base.add_initializer("linear_weight", rng.uniform(-bound, bound, (self._out, self._in)))
        inputs = [input_name, w]
        if self._bias:
            inputs.append(self.base.add_initializer("linear_bias", rng.uniform(-bound, bound, self._out)))
        return self.base.add_node("Gemm", inputs, "linear", {"transB": 1, "alpha": self._alpha,
                                                               "beta": self._beta})
