"""Training and eval graphs with onnxruntime's conventions, from a forward graph that ends in a loss.

Training model I/O, exactly as ORT 1.19 writes it:
    inputs   user inputs (and labels/targets), parameters in initializer order (trainable and frozen),
             ``<p>_grad.accumulation.buffer`` per trainable parameter, ``lazy_reset_grad`` (bool[1])
    outputs  the loss, additional outputs, ``<p>_grad.accumulation.out`` (bool[1]) per trainable parameter
Each gradient is accumulated by an ``InPlaceAccumulatorV2`` node into its buffer, overwritten instead when
``lazy_reset_grad`` is set. The eval model takes the same user inputs and parameters and returns the loss and
additional outputs, with every node in its eval form (Dropout off, BatchNormalization on running statistics).
"""
from __future__ import annotations

import numpy as np

from ..errors import EdgetrainError
from ..ir import Graph, Node, TensorType, Value
from ..ir.dtypes import CARRIED, ORT_TYPE_NAME
from ..ops import lookup
from .builder import MS, backward_domains, gradient_graph, prepare_for_training, symbolic_types

RESET = "lazy_reset_grad"


def _params(graph: Graph, requires_grad: list[str], frozen: list[str]) -> list[str]:
    """Trainable and frozen parameters in the order of the graph's initializers (ORT's order). Graph inputs
    that require a gradient are not parameters. With nothing named at all, ORT 1.19 moves every initializer
    to the graph inputs (outside the checkpoint, so the caller must feed them); edgetrain keeps them constants,
    which ops that need a constant (a Dropout ratio, a Reshape's shape) require."""
    overlap = set(requires_grad) & set(frozen)
    if overlap:
        raise EdgetrainError(f"parameters {sorted(overlap)} are listed as both requiring grad and frozen")
    inputs = {v.name for v in graph.inputs}
    missing = [p for p in list(requires_grad) + list(frozen) if p not in graph.initializers and p not in inputs]
    if missing:
        raise EdgetrainError(f"{missing} are not initializers or inputs of graph '{graph.name}'; initializers: "
                             f"{sorted(graph.initializers)[:20]}")
    wanted = set(requires_grad) | set(frozen)
    return [name for name in graph.initializers if name in wanted]


def _value(graph: Graph, name: str) -> Value:
    a = graph.initializers[name]
    return Value(name, TensorType(a.dtype, a.shape))


def _outputs(graph: Graph, names: list[str]) -> list[Value]:
    declared = {v.name: v for v in graph.outputs}
    missing = [n for n in names if n not in declared]
    if missing:
        raise EdgetrainError(f"{missing} are not outputs of graph '{graph.name}'")
    return [declared[n] for n in names]


def training_graph(graph: Graph, loss: str, requires_grad: list[str], frozen: list[str] = (),
                   additional_outputs: list[str] = ()) -> Graph:
    params = _params(graph, requires_grad, frozen)
    wanted = set(requires_grad)
    # gradients in ORT's order: graph inputs that require one, then trainable parameters
    trainable = [v.name for v in graph.inputs if v.name in wanted] + [p for p in params if p in wanted]
    types = {v.name: v.type for v in graph.inputs} | {p: _value(graph, p).type for p in params}
    for p in trainable:
        if getattr(types[p], "dtype", None) in CARRIED:
            raise EdgetrainError(
                f"parameter '{p}' is {types[p]}: edgetrain trains float32/float64 parameters only "
                f"({ORT_TYPE_NAME[types[p].dtype]} runs for inference, computed in float32); "
                "convert the model's parameters to float32 to train it")
    flag = TensorType(np.bool_, (1,))
    if trainable:
        prepared = prepare_for_training(graph)
        backward, grad_inits, grads = gradient_graph(prepared, loss, trainable)
    else:     # nothing to differentiate: the forward graph as it is (ORT builds no gradient either)
        prepared, backward, grad_inits, grads = graph, [], {}, {}
    accumulate, buffers, flags = [], [], []
    for k, p in enumerate(trainable, start=1):
        buffer = f"{p}_grad.accumulation.buffer"
        out = f"{p}_grad.accumulation.out"
        accumulate.append(Node("InPlaceAccumulatorV2", [buffer, grads[p], RESET], [out], {},
                               f"GradientAccumulator{k}", MS))
        buffers.append(Value(buffer, types[p]))
        flags.append(Value(out, flag))
    inputs = list(graph.inputs) + [_value(graph, p) for p in params] + buffers + [Value(RESET, flag)]
    outputs = _outputs(graph, [loss] + list(additional_outputs)) + flags
    constants = {k: v for k, v in graph.initializers.items() if k not in set(params)} | grad_inits
    opsets = ({MS: 1} if trainable else {}) | backward_domains(backward, prepared.opsets) | prepared.opsets
    return _typed(Graph(prepared.nodes + backward + accumulate, inputs, outputs, constants, opsets, {},
                        graph.name).verify())


def eval_graph(graph: Graph, loss: str, requires_grad: list[str], frozen: list[str] = (),
               additional_outputs: list[str] = ()) -> Graph:
    params = _params(graph, requires_grad, frozen)
    nodes = []
    for node in graph.nodes:
        op = lookup(node, graph.opset(node.domain))
        nodes.append(op.eval_form(node, graph.opset(node.domain)) if op.eval_form else node)
    inputs = list(graph.inputs) + [_value(graph, p) for p in params]
    outputs = _outputs(graph, [loss] + list(additional_outputs))
    constants = {k: v for k, v in graph.initializers.items() if k not in set(params)}
    return _typed(Graph(nodes, inputs, outputs, constants, dict(graph.opsets), {}, graph.name).verify())


def _typed(graph: Graph) -> Graph:
    """Record the type of every intermediate value (ONNX value_info): readers such as ORT 1.19, whose
    MaxPoolGrad shape inference crashes on an unknown input shape, rely on it, as ORT's artifacts do."""
    graph.value_types = {k: t for k, t in symbolic_types(graph).items() if k not in graph.initializers}
    return graph
