"""Building blocks with onnxruntime.training.onnxblock.blocks' names and signatures (ORT 1.19's public set:
Block, Add, Sub, Mul, Div, Pow, ReduceMean, ReduceSum, Sigmoid, Log, Neg, Abs, Constant, SequenceConstruct,
ReduceAllL2, Clip, PassThrough, InputLike, LabelEncoder, Cast, Linear)."""
from __future__ import annotations

import numpy as np

from ..errors import EdgetrainError
from ..ir import TensorType
from ._builder import add_initializer, add_input, add_node, generate_name, type_of
from .onnxblock import Block

__all__ = ["Abs", "Add", "Block", "Cast", "Clip", "Constant", "Div", "InputLike", "LabelEncoder", "Linear", "Log",
           "Mul", "Neg", "PassThrough", "Pow", "ReduceAllL2", "ReduceMean", "ReduceSum", "SequenceConstruct",
           "Sigmoid", "Sub"]


class _Unary(Block):
    op: str = ""

    def build(self, input_name: str) -> str:
        return add_node(self.base, self.op, [input_name], self.op.lower())


class _Binary(Block):
    op: str = ""

    def build(self, input_name1: str, input_name2: str) -> str:
        return add_node(self.base, self.op, [input_name1, input_name2], self.op.lower())


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
        exponent = add_initializer(self.base, "pow_exponent", [self._exponent])
        return add_node(self.base, "Pow", [input_name, exponent], "pow")


class Constant(Block):
    """A float constant of shape [1]."""

    def __init__(self, value_float: float):
        super().__init__()
        self._value = value_float

    def build(self) -> str:
        return add_initializer(self.base, "constant", [self._value])


class _Reduce(Block):
    op: str = ""

    def __init__(self, keepdims: bool = True):
        super().__init__()
        self._keepdims = keepdims

    def build(self, input_name: str) -> str:
        return add_node(self.base, self.op, [input_name], self.op.lower(), {"keepdims": int(self._keepdims)})


class ReduceMean(_Reduce):
    op = "ReduceMean"


class ReduceSum(_Reduce):
    op = "ReduceSum"


class Clip(Block):
    def __init__(self, clip_min: float | None = None, clip_max: float | None = None):
        super().__init__()
        self._min, self._max = clip_min, clip_max

    def build(self, input_name: str) -> str:
        lo = add_initializer(self.base, "clip_min", self._min) if self._min is not None else ""
        hi = add_initializer(self.base, "clip_max", self._max) if self._max is not None else ""
        return add_node(self.base, "Clip", [input_name, lo, hi], "clip")


class Cast(Block):
    def __init__(self, to):
        super().__init__()
        self._to = int(to)

    def build(self, input_name: str) -> str:
        return add_node(self.base, "Cast", [input_name], "cast", {"to": self._to})


class SequenceConstruct(Block):
    def build(self, *input_names: str) -> str:
        return add_node(self.base, "SequenceConstruct", list(input_names), "sequenceconstruct")


class ReduceAllL2(Block):
    """com.microsoft ReduceAllL2: the L2 norm of all elements of all inputs."""

    def build(self, *input_names: str) -> str:
        return add_node(self.base, "ReduceAllL2", list(input_names), "reducealll2", domain="com.microsoft")


class PassThrough(Block):
    """The inputs unchanged, as a tuple of names (the default loss: the model's outputs, the first is the
    loss)."""

    def build(self, *input_names: str) -> tuple[str, ...]:
        return input_names


class InputLike(Block):
    """A new graph input declared like the graph input or output ``like`` (a target like the model's output);
    for any other value, with its inferred type."""

    def __init__(self, like: str):
        super().__init__()
        self._like = like

    def build(self, input_name: str | None = None) -> str:
        name = input_name or generate_name("input")
        g = self.base.graph
        declared = next((v for v in list(g.input) + list(g.output) if v.name == self._like
                         and v.type.WhichOneof("value")), None)
        if declared is None:
            t = type_of(self.base, self._like)
            return add_input(self.base, name, TensorType(t.dtype, t.shape))
        if any(v.name == name for v in g.input):
            raise EdgetrainError(f"graph input '{name}' exists already")
        clone = type(declared)()
        clone.CopyFrom(declared)
        clone.name = name
        g.input.append(clone)
        return name


class LabelEncoder(Block):
    """ai.onnx.ml LabelEncoder (maps keys to values, e.g. raw labels to class indices). edgetrain builds it for
    models that onnxruntime runs; it has no kernel or gradient of its own."""

    def __init__(self, default_float: float = 0.0, default_int64: int = -1, default_string: str = "_Unused",
                 keys_floats=None, keys_int64s=None, keys_strings=None, values_floats=None, values_int64s=None,
                 values_strings=None):
        super().__init__()
        optional = {"keys_floats": keys_floats, "keys_int64s": keys_int64s, "keys_strings": keys_strings,
                    "values_floats": values_floats, "values_int64s": values_int64s,
                    "values_strings": values_strings}
        self._attrs = {"default_float": float(default_float), "default_int64": int(default_int64),
                       "default_string": default_string}
        self._attrs |= {k: list(v) for k, v in optional.items() if v is not None}

    def build(self, label_encoder_input_name: str) -> str:
        return add_node(self.base, "LabelEncoder", [label_encoder_input_name], "label_encoder.output", self._attrs,
                        domain="ai.onnx.ml")


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
        w = add_initializer(self.base, "linear_weight", rng.uniform(-bound, bound, (self._out, self._in)))
        inputs = [input_name, w]
        if self._bias:
            inputs.append(add_initializer(self.base, "linear_bias", rng.uniform(-bound, bound, self._out)))
        return add_node(self.base, "Gemm", inputs, "linear", {"transB": 1, "alpha": self._alpha,
                                                               "beta": self._beta})
