"""The backward walk and the context a gradient rule emits nodes through."""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import Graph, Node, TensorType, Value
from ..ops import OpDef, lookup
from .fusions import fuse_patterns
from .symbolic import solve

MS = "com.microsoft"


class GradContext:
    """What a gradient rule sees: its forward node with types, and a way to emit backward nodes.

    Types come from planning the forward graph with its symbolic dimensions unified (``symbolic``) and each
    free one bound to a distinct prime (never 1), so a dimension of size 1 is really 1: that is all
    broadcasting reductions need. Rules that
    need a runtime shape use ``shape_of`` (a ``Shape`` node, folded when planning), never the probe sizes.
    """

    def __init__(self, walk: "_Walk", node: Node, op: OpDef, in_types, out_types, needs: list[bool], opset: int):
        self._walk = walk
        self._op = op
        self.node = node
        self.in_types: list[TensorType | None] = in_types
        self.out_types: list[TensorType | None] = out_types
        self.needs = needs
        self.opset = opset
        self._count = 0

    # -- the forward node ---------------------------------------------------------------------------------
    def x(self, i: int) -> str:
        return self.node.inputs[i]

    def y(self, i: int = 0) -> str:
        return self.node.outputs[i]

    def attr(self, name: str):
        """Attribute ``name`` of the forward node, or the default its op declares."""
        return self._op.attr(self.node, name)

    def error(self, msg: str):
        return UnsupportedOpError(f"{self.node} (opset {self.opset}): {msg}")

    def const_input(self, i: int) -> np.ndarray | None:
        """The value of input ``i`` if it is known when planning for any batch size (else None)."""
        if i >= len(self.node.inputs) or not self.node.inputs[i]:
            return None
        return self._walk.consts.get(self.node.inputs[i])

    # -- emitting backward nodes --------------------------------------------------------------------------
    def emit(self, op_type: str, inputs: list[str], attrs: dict | None = None, domain: str = "",
             outputs: list[str] | None = None, n_out: int = 1):
        """Append a backward node; return its output name (or names when ``n_out > 1``)."""
        k = self._count
        self._count += 1
        base = f"{self.node.name}_Grad/{op_type}_{k}"
        outputs = outputs or ([f"{base}_out"] if n_out == 1 else [f"{base}_out{j}" for j in range(n_out)])
        self._walk.emit(Node(op_type, list(inputs), list(outputs), dict(attrs or {}), base, domain))
        return outputs[0] if n_out == 1 else outputs

    def const(self, value, dtype, label: str) -> str:
        name = f"{self.node.name}_Grad/{label}_{self._count}"
        self._count += 1
        self._walk.initializers[name] = np.asarray(value, dtype=dtype)
        return name

    def shape_of(self, value: str) -> str:
        return self.emit("Shape", [value])

    def unbroadcast(self, dy: str, i: int, dy_shape: tuple | None = None) -> str:
        """Sum ``dy`` (shaped like output 0, or ``dy_shape``) over the axes input ``i`` was broadcast along."""
        out, shape = dy_shape or self.out_types[0].shape, self.in_types[i].shape
        rank = len(out)
        lead = rank - len(shape)
        padded = (1,) * lead + tuple(shape)
        axes = [d for d in range(rank) if d < lead or (padded[d] == 1 and out[d] != 1)]
        if not axes:
            return dy
        axes_name = self.const(np.array(axes), np.int64, "axes")
        if all(d < lead for d in axes):       # only the leading axes: they simply go away
            return self.emit("ReduceSum", [dy, axes_name], {"keepdims": 0})
        summed = self.emit("ReduceSum", [dy, axes_name], {"keepdims": 1})
        return summed if not lead else self.emit("Reshape", [summed, self.shape_of(self.x(i))])


class _Walk:
    def __init__(self, graph: Graph, consts: dict[str, np.ndarray]):
        self.nodes: list[Node] = []
        self.initializers: dict[str, np.ndarray] = {}
        self.consts = consts

    def emit(self, node: Node):
        self.nodes.append(node)


def _probe_types(graph: Graph, wrt=()) -> dict[str, TensorType]:
    """Concrete types of ``graph`` with its symbolic dims unified and bound to probe sizes (``symbolic``)."""
    return solve(graph, wrt).concrete.types


def symbolic_types(graph: Graph, outputs=None) -> dict[str, TensorType]:
    """Types of every value with symbolic dims kept: a size where the graph fixes it, a formula over the
    input symbols ('N', 'N*T') where it follows them, None where it is unknown (``symbolic``)."""
    return solve(graph, outputs=outputs).types()


def prepare_for_training(graph: Graph) -> Graph:
    """A copy, after the pattern rewrites of ``fusions``, whose nodes take their training form
    (``OpDef.train_form``) and have every optional output their gradient rule reads (``OpDef.grad_outputs``):
    SoftmaxCrossEntropyLoss's log_prob, MaxPool's indices, LayerNormalization's mean and inv_std_dev, ..."""
    graph = fuse_patterns(graph)
    nodes = []
    for node in graph.nodes:
        op = lookup(node, graph.opset(node.domain))
        if op.train_form is not None:
            node = op.train_form(node, graph.opset(node.domain))
            op = lookup(node, graph.opset(node.domain))
        want = op.grad_outputs
        outputs = list(node.outputs) + [""] * (want - len(node.outputs))
        outputs = [o or f"{node.name}_saved_{k}" for k, o in enumerate(outputs[:want])] + outputs[want:]
        nodes.append(Node(node.op_type, list(node.inputs), outputs, dict(node.attrs), node.name, node.domain))
    opsets = graph.opsets if all(n.domain != MS for n in nodes) else {MS: 1} | graph.opsets
    return Graph(nodes, graph.inputs, graph.outputs, graph.initializers, opsets, graph.value_types, graph.name)


def gradient_graph(graph: Graph, loss: str, wrt: list[str]) -> tuple[list[Node], dict[str, np.ndarray], dict]:
    """Backward nodes computing ``<p>_grad`` for each ``p`` in ``wrt`` from the scalar ``loss``.

    ``graph`` must already be in its training form (``prepare_for_training``).
    Returns (backward nodes, new initializers, {p: gradient name}).
    """
    walk, grads = _backward(graph, loss, wrt)
    result = {}
    for p in wrt:
        parts = grads.get(p)
        if not parts:
            raise UnsupportedOpError(f"parameter '{p}' does not reach the loss '{loss}': it gets no gradient")
        result[p] = _total(walk, parts, p)
        if result[p] != f"{p}_grad":
            walk.emit(Node("Identity", [result[p]], [f"{p}_grad"], {}, f"{p}_grad/Identity"))
            result[p] = f"{p}_grad"
    return walk.nodes, walk.initializers, result


def params_with_gradient(graph: Graph, candidates: list[str]) -> list[str]:
    """The ``candidates`` (initializers of a forward graph) that the graph's outputs depend on
    differentiably: BatchNorm running statistics, Dropout ratios, constants behind shape arithmetic and
    values no output reads get no gradient, whatever the loss."""
    graph = prepare_for_training(graph)
    types = _probe_types(graph)
    outputs = [v.name for v in graph.outputs if types[v.name].dtype.kind == "f"]
    probe = [Node("ReduceSum", [o], [f"{o}/probe_sum"], {"keepdims": 0}, f"{o}/probe_sum") for o in outputs]
    loss = "edgetrain_probe_loss"
    probe.append(Node("Sum", [n.outputs[0] for n in probe], [loss], {}, loss))
    g = Graph(graph.nodes + probe, graph.inputs, graph.outputs + [Value(loss, None)], graph.initializers,
              graph.opsets, graph.value_types, graph.name)
    # planned with every candidate as a constant: a Dropout ratio or a shape among them must be one
    grads = _backward(g, loss, candidates, strict=False, probe_wrt=())[1]
    return [p for p in candidates if grads.get(p)]


def output_gradient_graph(graph: Graph, outputs: list[str], wrt: list[str]) -> tuple[Graph, list[str]]:
    """The backward half of ``graph`` (in its training form, ``prepare_for_training``) as a graph of its own:
    it takes ``<o>_grad_output`` for each of ``outputs`` that depends on ``wrt`` (the cotangents a caller
    supplies) and the forward values its gradient rules read, and returns ``<w>_grad`` for each of ``wrt``
    (initializers or graph inputs): the vector-Jacobian product sum_o <dL/do, do/dw>.

    Returns (backward graph, saved): ``saved`` lists the forward values the backward graph takes as inputs
    after the seeds (activations, graph inputs, ``wrt`` initializers), in forward order; forward constants it
    reads become its own initializers. Each gradient rule comes from the op table, as in ``gradient_graph``.
    """
    depends = _depends(graph, wrt)
    seeds = {o: f"{o}_grad_output" for o in outputs if o in depends}
    if not seeds:
        raise UnsupportedOpError(f"no output of {list(outputs)} depends on {sorted(wrt)}: nothing to "
                                 "differentiate")
    walk, grads = _backward(graph, None, wrt, seeds=seeds)
    result = {}
    for w in wrt:
        parts = grads.get(w)
        if not parts:
            raise UnsupportedOpError(f"'{w}' does not reach any of the outputs {list(outputs)}: it gets no "
                                     "gradient")
        result[w] = _total(walk, parts, w)
        if result[w] != f"{w}_grad":
            walk.emit(Node("Identity", [result[w]], [f"{w}_grad"], {}, f"{w}_grad/Identity"))
    made = set(seeds.values()) | set(walk.initializers) | {o for n in walk.nodes for o in n.outputs if o}
    read = {i for n in walk.nodes for i in n.inputs if i and i not in made}
    constants = {k: v for k, v in graph.initializers.items() if k in read and k not in set(wrt)}
    order = [v.name for v in graph.inputs] + [w for w in wrt if w in graph.initializers]
    order += [o for n in graph.nodes for o in n.outputs if o]
    saved = [v for v in dict.fromkeys(order) if v in read and v not in constants]
    types = _probe_types(graph, [w for w in wrt if w in graph.initializers])
    inputs = [Value(s, None) for s in seeds.values()] + [Value(v, None) for v in saved]
    backward = Graph(walk.nodes, inputs, [Value(f"{w}_grad", types.get(w)) for w in wrt],
                     constants | walk.initializers, {MS: graph.opsets.get(MS, 1)} | graph.opsets, {},
                     f"{graph.name}_backward")
    return backward.verify(), saved


def _differentiable(t) -> bool:
    return not isinstance(t, TensorType) or t.dtype.kind in "fc"


def _depends(graph: Graph, wrt) -> set[str]:
    """Values that depend on one of ``wrt`` (forward reachability)."""
    depends = set(wrt)
    for n in graph.nodes:
        if any(i in depends for i in n.inputs if i):
            depends.update(o for o in n.outputs if o)
    return depends


def _backward(graph: Graph, loss: str | None, wrt: list[str], strict: bool = True,
              probe_wrt=None, seeds: dict[str, str] | None = None) -> tuple[_Walk, dict[str, list[str]]]:
    """Walk ``graph`` backwards from ``loss``: (the walk with its emitted nodes, gradient parts per value).
    ``strict``: a node on the way without a gradient rule is an error (else its inputs get no gradient);
    ``probe_wrt``: the initializers planned as inputs when typing the graph (default ``wrt``);
    ``seeds``: instead of a loss, {output: name of the given gradient of that output}."""
    probe_wrt = [w for w in (wrt if probe_wrt is None else probe_wrt) if w in graph.initializers]
    typing = solve(graph, probe_wrt)
    types = typing.concrete.types
    # values that depend on a parameter (forward reachability) and lead to the loss (backward reachability)
    depends = _depends(graph, wrt)
    walk = _Walk(graph, typing.shape_free_constants())
    if seeds is not None:
        grads: dict[str, list[str]] = {o: [s] for o, s in seeds.items()}
    else:
        if loss not in depends:
            raise UnsupportedOpError(f"loss '{loss}' does not depend on any of the parameters {sorted(wrt)}")
        seed = f"{loss}_grad"
        loss_type = types[loss]
        if loss_type.size == 1:     # a scalar (or [1]) loss: a constant seed, as onnxruntime writes it
            walk.initializers[seed] = np.ones(loss_type.shape, loss_type.dtype)
        else:                       # ones shaped like the loss at run time (its dims may be symbolic)
            walk.emit(Node("Shape", [loss], [f"{loss}_shape"], {}, f"{loss}_grad/Shape"))
            walk.emit(Node("ConstantOfShape", [f"{loss}_shape"], [seed], {"value": np.ones(1, loss_type.dtype)},
                           f"{loss}_grad/ConstantOfShape"))
        grads = {loss: [seed]}
    for node in reversed(graph.nodes):
        dys = [_total(walk, grads.pop(o, None), o) if o else None for o in node.outputs]
        if all(d is None for d in dys):
            continue
        # integer and bool values (shapes, indices, masks) carry no gradient, whatever they were computed from
        needs = [bool(i) and i in depends and _differentiable(types.get(i)) for i in node.inputs]
        if not any(needs):
            continue
        opset = graph.opset(node.domain)
        op = lookup(node, opset)
        if op.vjp is None and not strict:
            continue
        if op.vjp is None:
            raise UnsupportedOpError(f"{node} (opset {opset}) has no gradient rule, and its input(s) "
                                     f"{[i for i, n in zip(node.inputs, needs) if n]} need one")
        ctx = GradContext(walk, node, op, [types.get(i) if i else None for i in node.inputs],
                          [types.get(o) if o else None for o in node.outputs], needs, opset)
        dxs = list(op.vjp(ctx, dys))
        for i, (name, dx) in enumerate(zip(node.inputs, dxs + [None] * (len(node.inputs) - len(dxs)))):
            if dx is not None and needs[i]:
                grads.setdefault(name, []).append(dx)
    return walk, grads


def _total(walk: _Walk, parts: list[str] | None, value: str) -> str | None:
    """The gradient of ``value``: its one contribution, or the Sum of several (named ``value_grad``)."""
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    name = f"{value}_grad"
    walk.emit(Node("Sum", list(parts), [name], {}, f"{value}_grad/Sum"))
    return name


def backward_domains(nodes: list[Node], opsets: dict[str, int]) -> dict[str, int]:
    """Opset imports for the domains backward nodes use that the graph does not import yet (ai.edgetrain's
    gradient ops, such as RNNGrad)."""
    return {n.domain: 1 for n in nodes if n.domain not in opsets and n.domain not in ("", "ai.onnx")}


def with_gradients(graph: Graph, loss: str, wrt: list[str]) -> Graph:
    """A copy of ``graph`` whose parameters are inputs and whose outputs are the loss and ``<p>_grad``."""
    graph = prepare_for_training(graph)
    nodes, inits, grads = gradient_graph(graph, loss, wrt)
    params = [Value(p, TensorType(graph.initializers[p].dtype, graph.initializers[p].shape)) for p in wrt]
    initializers = {k: v for k, v in graph.initializers.items() if k not in wrt} | inits
    loss_value = next(v for v in graph.outputs if v.name == loss)
    outputs = [loss_value] + [Value(grads[p], params[k].type) for k, p in enumerate(wrt)]
    ms = {MS: graph.opsets.get(MS, 1)} | backward_domains(nodes, graph.opsets)
    return Graph(graph.nodes + nodes, graph.inputs + params, outputs, initializers, graph.opsets | ms,
                 dict(graph.value_types), graph.name).verify()
