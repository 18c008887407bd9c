"""The model under construction. Users keep onnxruntime's ``with onnxblock.base(model):`` surface; inside,
blocks get the builder from ``current()`` once and work on its IR graph explicitly."""
from __future__ import annotations

import copy
import itertools
from contextlib import contextmanager

import numpy as np

from ..errors import EdgetrainError
from ..ir import Graph, Node, TensorType, Value
from ..onnx_io import ir_version_of, load_model, to_graph

_STACK: list["ModelBuilder"] = []
# onnxruntime names generated values onnx::<token>::<n> with one process-wide counter; so do we
_COUNTER = itertools.count()


def generate_name(token: str) -> str:
    return f"onnx::{token}::{next(_COUNTER)}"


class ModelBuilder:
    def __init__(self, graph: Graph, ir_version: int = 8):
        self.graph = graph
        self.ir_version = ir_version

    def add_node(self, op_type: str, inputs: list[str], token: str, attrs: dict | None = None,
                 domain: str = "", n_out: int = 1, outputs: list[str] | None = None):
        outputs = outputs or [generate_name(f"{token}_output" if n_out == 1 else f"{token}_output_{k}")
                              for k in range(n_out)]
        self.graph.nodes.append(Node(op_type, list(inputs), list(outputs), dict(attrs or {}),
                                     generate_name(op_type), domain))
        if domain and domain not in self.graph.opsets:
            self.graph.opsets[domain] = 1
        return outputs[0] if n_out == 1 else outputs

    def add_initializer(self, token: str, value, dtype=np.float32) -> str:
        name = generate_name(token)
        self.graph.initializers[name] = np.asarray(value, dtype=dtype)
        return name

    def add_input(self, name: str, t: TensorType) -> str:
        if any(v.name == name for v in self.graph.inputs):
            raise EdgetrainError(f"graph input '{name}' exists already")
        self.graph.inputs.append(Value(name, t))
        return name

    def has_value(self, name: str) -> bool:
        g = self.graph
        return (name in g.initializers or any(v.name == name for v in g.inputs)
                or any(name in n.outputs for n in g.nodes))

    def type_of(self, name: str) -> TensorType:
        """The declared or inferred type of a value (symbolic dims kept)."""
        from ..autodiff.builder import symbolic_types
        return symbolic_types(self.graph)[name]


def current() -> ModelBuilder:
    if not _STACK:
        raise EdgetrainError("onnxblock blocks must be called inside `with onnxblock.base(model):` or "
                             "`with onnxblock.empty_base():`")
    return _STACK[-1]


@contextmanager
def base(model, model_path=None):
    """Build on a copy of ``model`` (a ModelProto or a path)."""
    proto = load_model(model_path if model_path is not None and model is None else model)
    builder = ModelBuilder(to_graph(copy.deepcopy(proto)), ir_version_of(proto))
    _STACK.append(builder)
    try:
        yield builder
    finally:
        _STACK.pop()


@contextmanager
def empty_base(opset_version: int | None = None):
    """Build from an empty model (optimizer graphs): opsets com.microsoft 1 and ai.onnx ``opset_version``."""
    graph = Graph([], [], [], {}, {"": opset_version or 17, "com.microsoft": 1}, name="graph")
    builder = ModelBuilder(graph)
    _STACK.append(builder)
    try:
        yield builder
    finally:
        _STACK.pop()
