"""The IR: plain data for graphs, with no dependency on onnx.

A ``Graph`` holds nodes in topological order; every value name is assigned once (by a graph input, an
initializer or one node output). Shapes may hold symbolic dimensions (str) until planning binds them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import GraphError
from ..record import Frozen
from .dtypes import ORT_TYPE_NAME

Dim = int | str | None


class TensorType(Frozen):
    dtype: np.dtype
    shape: tuple[Dim, ...]

    def __init__(self, dtype, shape):
        d = self.__dict__           # one of the most made objects of planning: no call per field
        d["dtype"] = np.dtype(dtype)
        d["shape"] = tuple(shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def size(self) -> int:
        shape = self.shape
        # math.prod: ~20x faster than np.prod on a tuple, and planning asks every size several times (resnet18's
        # first step: ~900 calls); a symbolic shape takes np.prod's path and its error (math.prod would repeat a
        # str dim)
        if all(type(d) is int for d in shape):
            return math.prod(shape)
        return int(np.prod(shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __str__(self) -> str:
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{ORT_TYPE_NAME.get(self.dtype, str(self.dtype))}[{dims}]"


class SequenceType(Frozen):
    """A sequence of tensors of one element type (optimizer models take parameters as sequences)."""
    dtype: np.dtype

    def __init__(self, dtype):
        self._set(dtype=np.dtype(dtype))

    def __str__(self) -> str:
        return f"seq({ORT_TYPE_NAME.get(self.dtype, str(self.dtype))})"


class Value(Frozen):
    """A named graph input or output with its (possibly symbolic) type; None until planning if undeclared."""
    name: str
    type: TensorType | SequenceType | None

    def __init__(self, name: str, type: TensorType | SequenceType | None):   # noqa: A002 - the field's name
        self._set(name=name, type=type)


@dataclass
class Node:
    op_type: str
    inputs: list[str]          # "" marks an omitted optional input
    outputs: list[str]         # "" marks an omitted optional output
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    domain: str = ""           # "" is ai.onnx

    def __str__(self) -> str:
        label = self.name or (self.outputs[0] if self.outputs else "?")
        return f"node '{label}' ({self.op_type})"


@dataclass
class Graph:
    nodes: list[Node]
    inputs: list[Value]
    outputs: list[Value]
    initializers: dict[str, np.ndarray] = field(default_factory=dict)
    opsets: dict[str, int] = field(default_factory=lambda: {"": 17})
    value_types: dict[str, TensorType] = field(default_factory=dict)   # known intermediate types
    name: str = "graph"

    def opset(self, domain: str) -> int:
        return self.opsets.get("" if domain == "ai.onnx" else domain, 1)

    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs if o}

    def consumers(self) -> dict[str, list[Node]]:
        users: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    users.setdefault(i, []).append(n)
        return users

    def verify(self) -> Graph:
        """Check single assignment, defined inputs and topological order; return self."""
        defined: set[str] = set()

        def define(name: str, what: str):
            if name in defined:
                raise GraphError(f"graph '{self.name}': value '{name}' is assigned twice ({what})")
            defined.add(name)

        for v in self.inputs:
            define(v.name, "graph input")
        for name in self.initializers:
            if name not in defined:     # an initializer may double as a graph input's default
                define(name, "initializer")
        for node in self.nodes:
            for i in node.inputs:
                if i and i not in defined:
                    raise GraphError(f"{node}: input '{i}' is not defined before the node "
                                     "(not a graph input, initializer or earlier node output)")
            for o in node.outputs:
                if o:
                    define(o, str(node))
        for v in self.outputs:
            if v.name not in defined:
                raise GraphError(f"graph '{self.name}': output '{v.name}' is never assigned")
        return self
