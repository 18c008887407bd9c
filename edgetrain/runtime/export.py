"""``Module.export_model_for_inferencing``: the eval graph with the current parameters embedded, pruned to the
requested outputs, written as ONNX by ``onnx_wire`` (no onnx package), so the trimmed runtime exports too."""
from __future__ import annotations

import numpy as np

from .. import atomic
from ..errors import EdgetrainError
from ..ir import Graph, Value
from ..onnx_wire import model_bytes


def inference_graph(graph: Graph, output_names: list[str], params: dict[str, np.ndarray]) -> Graph:
    """``graph`` (an eval graph) with ``params`` embedded as initializers, keeping only what computes
    ``output_names``: the inputs it still reads (labels usually go) and the nodes on the way."""
    known = {o for n in graph.nodes for o in n.outputs} | {v.name for v in graph.inputs}
    missing = [n for n in output_names if n not in known]
    if missing:
        raise EdgetrainError(f"outputs {missing} are not values of the eval model")
    needed, nodes = set(output_names), []
    for node in reversed(graph.nodes):
        if any(o in needed for o in node.outputs if o):
            nodes.append(node)
            needed.update(i for i in node.inputs if i)
    nodes.reverse()
    inputs = [v for v in graph.inputs if v.name in needed and v.name not in params]
    initializers = {k: v for k, v in graph.initializers.items() if k in needed}
    initializers |= {k: np.asarray(v) for k, v in params.items() if k in needed}
    pruned = Graph(nodes, inputs, [Value(n, None) for n in output_names], initializers, dict(graph.opsets), {},
                   graph.name)
    types = _output_types(graph, pruned, output_names)
    pruned.outputs = [Value(n, types.get(n)) for n in output_names]
    return pruned.verify()


def _output_types(graph: Graph, pruned: Graph, names: list[str]) -> dict:
    """Declared types of the outputs (the eval model's outputs and value_info); where one is missing, the
    host package types them symbolically. The trimmed runtime has no autodiff, so there an undeclared
    output is written untyped and the reader infers it (ONNX allows that; onnxruntime does)."""
    types = {v.name: v.type for v in graph.outputs if v.type is not None} | dict(graph.value_types)
    if all(types.get(n) is not None for n in names):
        return types
    try:
        from ..autodiff.builder import symbolic_types
    except ImportError:
        return types
    return types | {k: t for k, t in symbolic_types(pruned, outputs=list(names)).items() if t is not None}


def export(graph: Graph, output_names: list[str], params: dict[str, np.ndarray], uri) -> None:
    """Write the inference model for ``output_names`` of eval graph ``graph`` to ``uri`` atomically."""
    atomic.write_atomic(uri, model_bytes(inference_graph(graph, list(output_names), params), ir_version=8))
