"""What an op definition is, and the context its shape rule and kernel launcher receive.

An ``OpDef`` is pure data: a shape/dtype rule, how the runtime executes the op (``kind``), and which
kernel launcher in ``edgetrain.kernels`` does it. Nothing here imports Numba, so the op table can be
read by the planner and by the minimal build without compiling anything.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import InputError, ShapeError
from ..ir import Node, TensorType
from ..ir.dtypes import ARITHMETIC, FLOATS, MOVED_ONLY
from .attrs import REQUIRED, Attr, check_attrs

ALL_NUMERIC = tuple(np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64))
SMALL_SIGNED = tuple(np.dtype(t) for t in (np.int8, np.int16))
UNSIGNED = tuple(np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))
NUMERIC = ALL_NUMERIC + SMALL_SIGNED + UNSIGNED     # every integer width ONNX's arithmetic ops declare
SIGNED = ALL_NUMERIC + SMALL_SIGNED
INTEGERS = tuple(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64)) + UNSIGNED
ANY = NUMERIC + tuple(np.dtype(t) for t in (np.bool_, np.float16)) + MOVED_ONLY


@dataclass(frozen=True)
class OpDef:
    """One op: its shape rule and how it runs.

    kind
        ``"elementwise"``: runs inside generated fused loops from the scalar template
        ``edgetrain.kernels.elementwise.SCALAR[op_type]``; ``fold`` is its numpy form.
        ``"alias"``: output 0 is a view of input 0 with another shape (no kernel, no copy).
        ``"kernel"``: ``edgetrain.kernels.<family>.<name>`` (``kernel = "family.name"``) builds a step.
        ``"lowered"``: rewritten by ``plan.lower`` into other ops before fusion.
        ``"fold"``: always computed when planning (Constant, Shape, Size, ...); never runs as a step.
    since
        the since-version of the ONNX definition edgetrain implements (reduced-build configs name it).
    dtypes
        element types accepted for input ``type_input`` (the op's type constraint ``T``).
    eval_form
        rewrites a node for the eval model (Dropout without training mode, BatchNormalization with
        training_mode=0 and without running-statistics outputs).
    train_form
        rewrites a forward node before differentiation when training needs another op, as onnxruntime
        trains BatchNormalization as com.microsoft BatchNormInternal (which also outputs saved statistics).
    vjp
        the gradient rule (``edgetrain.autodiff``): emits backward nodes, never computes numbers; None means
        the op is not differentiable (gradient ops themselves, integer ops, shape arithmetic).
    fold
        numpy evaluation ``fold(ctx, *arrays) -> array | list`` used to fold constant subgraphs; kernel ops
        without one fold by running their launcher on fresh arrays.
    """
    op_type: str
    infer: Callable[["NodeContext"], list[TensorType]]
    domain: str = ""
    since: int = 13
    kind: str = "kernel"
    kernel: str = ""
    fold: Callable | None = None
    workspace: Callable | None = None  # (ctx) -> [TensorType]: scratch the kernel needs, planned in the arena
    deterministic: bool = True   # False: never folded, even with constant inputs (training-mode Dropout)
    vjp: Callable | None = None  # gradient rule: (GradContext, [dY or None per output]) -> [dX or None per input]
    grad_outputs: int = 0        # outputs the gradient rule reads; autodiff adds the optional ones missing
    train_form: Callable | None = None  # (Node, opset) -> Node: the node's form in a training graph, or None
    eval_form: Callable | None = None   # (Node, opset) -> Node: the node's form in an eval model, or None
    dtypes: tuple = FLOATS
    type_input: int | None = 0   # the input whose element type ``dtypes`` constrains (None: no input)
    attrs: dict[str, Attr] = field(default_factory=dict)   # the attributes it accepts, with their defaults
    writes_inputs: tuple[int, ...] = ()   # inputs its kernel updates in place (accumulators, optimizers)
    type_inputs: tuple[int, ...] = ()     # inputs read for their type only: folding does not wait for their values
    doc: str = ""
    known_outputs: Callable | None = None  # (ctx) -> {output index: array}: outputs known when planning though
    #                                        the op runs (ConcatTraining's input lengths, read as SplitTraining's sizes)

    @property
    def key(self) -> tuple[str, str]:
        return (self.domain, self.op_type)

    @property
    def element_types(self) -> tuple[np.dtype, ...]:
        """The element types input ``type_input`` takes: ``dtypes``, and float16 where float32 is one of them
        (plans compute it in float32: plan/widen.py)."""
        return tuple(self.dtypes) + tuple(d for d, c in ARITHMETIC.items()
                                          if c in self.dtypes and d not in self.dtypes)

    def checked_attrs(self, node: Node) -> dict:
        """``node``'s attributes validated against ``attrs`` and made canonical (``edgetrain.ops.attrs``)."""
        return check_attrs(node, self.attrs)

    def attr(self, node: Node, name: str):
        """The value of attribute ``name`` of ``node`` (an instance of this op), or its declared default."""
        spec = self.attrs.get(name)
        if spec is None:
            raise KeyError(f"{self.op_type} declares no attribute '{name}'")
        value = node.attrs.get(name)
        if value is None:
            if spec.default is REQUIRED:
                raise ShapeError(f"{node}: required attribute '{name}' is missing")
            return spec.default
        return value


@dataclass
class NodeContext:
    """A node of op ``op`` with the static types (and, where known, constant values) of its inputs and
    outputs."""
    node: Node
    op: OpDef
    opset: int
    in_types: list[TensorType | None]
    consts: list[np.ndarray | None]
    out_types: list[TensorType | None] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.node)

    def error(self, msg: str) -> ShapeError:
        shapes = ", ".join(str(t) if t is not None else "-" for t in self.in_types)
        return ShapeError(f"{self.node} (opset {self.opset}): {msg}; input types: {shapes}")

    def attr(self, name: str):
        """Attribute ``name`` of the node, or the default its op declares."""
        return self.op.attr(self.node, name)

    def has_input(self, i: int) -> bool:
        return i < len(self.node.inputs) and self.node.inputs[i] != ""

    def type(self, i: int) -> TensorType:
        if not self.has_input(i):
            raise self.error(f"input {i} is required")
        return self.in_types[i]

    def shape(self, i: int) -> tuple[int, ...]:
        return self.type(i).shape

    def const(self, i: int, what: str, default=REQUIRED) -> np.ndarray | None:
        """The constant value of input ``i``; shape-defining inputs must be known when planning."""
        if not self.has_input(i):
            if default is REQUIRED:
                raise self.error(f"input {i} ('{what}') is required")
            return default
        value = self.consts[i]
        if value is None:
            err = self.error(f"input {i} ('{what}', tensor '{self.node.inputs[i]}') must be a constant "
                             "or computable from shapes when planning")
            err.needs_value = self.node.inputs[i]    # InferenceSession plans per value of small graph inputs
            raise err
        return value

    def axes(self, i: int, attr: str = "axes") -> tuple[int, ...] | None:
        """Axes given by attribute (older opsets) or by input ``i`` (newer opsets); None if absent."""
        if attr in self.node.attrs:
            return tuple(int(a) for a in self.node.attrs[attr])
        if self.has_input(i):
            return tuple(int(a) for a in self.const(i, attr).reshape(-1))
        return None

    def out(self, i: int) -> TensorType:
        return self.out_types[i]

    def bad_value(self, i: int, data: np.ndarray, position: int, allowed: str) -> InputError:
        """The error a kernel launcher raises when the entry at flat ``position`` of input ``i`` (``data``) is
        not ``allowed`` (an index out of range): it names the node, the input's tensor, the value and where."""
        data = np.asarray(data)
        value = data.reshape(-1)[position].item()
        where = [int(k) for k in np.unravel_index(position, data.shape)]
        return InputError(f"{self.node}: input {i} ('{self.node.inputs[i]}') holds {value} at {where}, which is "
                          f"not {allowed}")


def axis_view(ctx: NodeContext, axis: int) -> tuple[int, int, int]:
    """Input 0 as [outer, n, inner] around ``axis`` (normalized): what one-axis kernels (softmax, cumsum,
    arg/top-k, Lp normalization) loop over."""
    shape = ctx.shape(0)
    return (int(np.prod(shape[:axis], dtype=np.int64)), int(shape[axis]),
            int(np.prod(shape[axis + 1:], dtype=np.int64)))


def normalize_axis(ctx: NodeContext, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def broadcast_shapes(ctx: NodeContext, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """numpy/ONNX multidirectional broadcasting, with an error naming the node."""
    rank = max(len(s) for s in shapes)
    out = []
    for d in range(rank):
        sizes = {s[d - rank + len(s)] for s in shapes if d - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            raise ctx.error("input shapes " + " and ".join(str(tuple(s)) for s in shapes) + " do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)

