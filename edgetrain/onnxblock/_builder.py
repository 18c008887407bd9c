"""The model under construction, as ORT 1.19's onnxblock has it: ``with onnxblock.base(model) as accessor``
registers a copy of ``model`` (an ``onnx.ModelProto``) that blocks edit and ``accessor.model`` hands back;
inside ``build()``, ``self.base`` is that ModelProto. The helpers below edit it; every check reads it through
edgetrain's IR (``onnx_io.to_graph``), so the ModelProto is the one source of truth."""
from __future__ import annotations

import copy
import itertools
import os
from contextlib import contextmanager

import numpy as np

from ..errors import EdgetrainError
from ..ir import SequenceType, TensorType
from ..onnx_io import empty_model, load_model, node_proto, opset_id, tensor_proto, to_graph, value_info

# onnxruntime names generated values onnx::<token>::<n> with one process-wide counter; so do we
_COUNTER = itertools.count()


def generate_name(token: str) -> str:
    return f"onnx::{token}::{next(_COUNTER)}"


# the version a domain is imported at when a block adds its first node (ai.onnx.ml 2: LabelEncoder's int64 maps)
DOMAIN_VERSIONS = {"ai.onnx.ml": 2}


class ModelAccessor:
    """What ``base()`` / ``empty_base()`` yield: ``model`` (the ModelProto the blocks edit), ``path`` (the base
    model's path, when given) and ``has_path``."""

    def __init__(self, model, path: str | os.PathLike | None = None):
        self._model, self._path = model, path

    @property
    def model(self):
        return self._model

    @property
    def path(self) -> str:
        if self._path is None:
            raise EdgetrainError("the base model was given without a path: pass model_path to onnxblock.base")
        return os.fspath(self._path)

    @property
    def has_path(self) -> bool:
        return self._path is not None


_ACCESSOR: list[ModelAccessor] = []      # at most one, as in ORT


def current() -> ModelAccessor:
    if not _ACCESSOR:
        raise EdgetrainError("onnxblock blocks must be called inside `with onnxblock.base(model):` or "
                             "`with onnxblock.empty_base():`")
    return _ACCESSOR[0]


@contextmanager
def _registered(accessor: ModelAccessor):
    if _ACCESSOR:
        raise EdgetrainError("a base model is registered already: onnxblock.base / empty_base do not nest")
    _ACCESSOR.append(accessor)
    try:
        yield accessor
    finally:
        _ACCESSOR.clear()


@contextmanager
def base(model, model_path: str | os.PathLike | None = None):
    """Register a copy of ``model`` (a ModelProto, or a path) for the blocks to build on."""
    if model is None and model_path is None:
        raise EdgetrainError("onnxblock.base needs a model; use onnxblock.empty_base() to build from nothing")
    proto = copy.deepcopy(load_model(model if model is not None else model_path))
    with _registered(ModelAccessor(proto, model_path)) as accessor:
        yield accessor


@contextmanager
def empty_base(opset_version: int | None = None):
    """Register an empty model (optimizer graphs): opsets com.microsoft 1 and ai.onnx ``opset_version``."""
    with _registered(ModelAccessor(empty_model(opset_version))) as accessor:
        yield accessor


# -- editing the ModelProto ---------------------------------------------------------------------------------
def add_node(model, op_type: str, inputs: list[str], token: str, attrs: dict | None = None, domain: str = "",
             n_out: int = 1, outputs: list[str] | None = None):
    """Append a node; returns its output name (or names when ``n_out`` > 1)."""
    outputs = outputs or [generate_name(f"{token}_output" if n_out == 1 else f"{token}_output_{k}")
                          for k in range(n_out)]
    model.graph.node.append(node_proto(op_type, list(inputs), list(outputs), generate_name(op_type), domain,
                                       attrs))
    if domain and all(o.domain != domain for o in model.opset_import):
        model.opset_import.append(opset_id(domain, DOMAIN_VERSIONS.get(domain, 1)))
    return outputs[0] if n_out == 1 else outputs


def add_initializer(model, token: str, value, dtype=np.float32) -> str:
    name = generate_name(token)
    model.graph.initializer.append(tensor_proto(name, np.asarray(value, dtype=dtype)))
    return name


def add_input(model, name: str, t: TensorType | SequenceType) -> str:
    if any(v.name == name for v in model.graph.input):
        raise EdgetrainError(f"graph input '{name}' exists already")
    model.graph.input.append(value_info(name, t))
    return name


def has_value(model, name: str) -> bool:
    g = model.graph
    return (any(t.name == name for t in g.initializer) or any(v.name == name for v in g.input)
            or any(name in n.output for n in g.node))


def type_of(model, name: str) -> TensorType:
    """The declared or inferred type of a value (symbolic dims kept)."""
    from ..autodiff.builder import symbolic_types
    return symbolic_types(to_graph(model), outputs=[name])[name]
