"""The second training API: an ONNX graph as one layer of a model trained by something else.

``ForwardBackward(model)`` runs the graph forward and, in a separate call, backward: given the gradients of
its outputs (from a loss, from the layers after it), it returns the gradients of its weights and of the inputs
asked for. The loss, the update and the regularization live outside (``edgetrain.estimators``,
``edgetrain.torch``), as in onnxcustom's ``OrtGradientForwardBackward``.

Two graphs come from the model once: the forward graph in its training form with the weights as inputs, and
its backward graph (``autodiff.output_gradient_graph``: the op table's gradient rules, seeded with the output
gradients), which reads the forward values it needs (``saved``). Per input shape, each is planned and bound
to an arena like any program. A training forward copies the saved values into a context block (one 64-byte
aligned buffer, its layout fixed by the plan); backward runs the backward program bound to that block, so
several contexts can be alive at once (micro-batches, two forwards before one backward). Blocks return to a
pool when their context is consumed, and each pooled block keeps its backward program (all of them share one
arena, as they never run at the same time).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import budget
from .autodiff.builder import output_gradient_graph, params_with_gradient, prepare_for_training
from .compact import load_graph
from .errors import EdgetrainError, InputError
from .ir import Graph, TensorType, Value
from .ops import lookup
from .plan import Plan, make_plan
from .runtime import Program
from .runtime.program import aligned_empty
from .session import bind_feeds

ALIGN = 64
# inputs that hold statistics, not weights (BatchNorm's running mean and variance): never trained by default,
# even where an inference-mode BatchNormalization would pass them a gradient; a training-mode one updates them
STATISTICS_INPUTS = {"BatchNormalization": (3, 4), "BatchNormInternal": (3, 4)}


def get_train_initializer(model) -> dict[str, np.ndarray]:
    """Every floating-point initializer of ``model`` (a path, bytes, a ModelProto or an edgetrain Graph):
    what onnxcustom's ``get_train_initializer`` guesses to be the weights."""
    graph = model if isinstance(model, Graph) else load_graph(model)
    return {k: v for k, v in graph.initializers.items() if np.asarray(v).dtype.kind == "f"}


@dataclass
class _Block:
    """One context's saved values: a buffer, a view per saved value, the backward program bound to them."""
    buffer: np.ndarray
    views: dict[str, np.ndarray]
    program: Program


class Context:
    """What one training forward keeps for its backward: the saved values (in a pooled block) and the shapes.
    Consumed by ``backward`` (unless ``retain=True``); ``release()`` gives the block back without one."""

    def __init__(self, owner: ForwardBackward, key: tuple, block: _Block, output_types: list[TensorType]):
        self._owner, self._key, self._block = owner, key, block
        self.output_types = output_types

    @property
    def alive(self) -> bool:
        return self._block is not None

    @property
    def saved_bytes(self) -> int:
        return 0 if self._block is None else self._block.buffer.nbytes

    @property
    def program(self) -> Program:
        """The backward program bound to this context's saved values (the profiler times its kernels)."""
        if self._block is None:
            raise InputError("this context was already used by backward or released")
        return self._block.program

    def release(self) -> None:
        if self._block is not None:
            self._owner._pool.setdefault(self._key, []).append(self._block)
            self._block = None


@dataclass
class Planned:
    """What one input shape costs: the forward program, the backward plan and one context's bytes."""
    forward: Program
    backward: Plan
    context_bytes: int


@dataclass
class _Plans:
    forward: Program
    backward: Plan
    arena: np.ndarray               # the backward programs' shared arena
    layout: dict[str, tuple[int, TensorType]]
    block_bytes: int
    output_types: list[TensorType]


class ForwardBackward:
    """Forward and backward of an ONNX graph as separate calls.

    Parameters
    ----------
    model : path, bytes or ModelProto
        A forward-only model.
    weights : list of str, optional
        The initializers to differentiate (the weights). Default: every floating-point initializer that the
        outputs depend on differentiably (``get_train_initializer`` minus BatchNorm running statistics and the
        like). A training-mode BatchNormalization (``training_mode=1``, as torch exports in training mode)
        normalizes with batch statistics and updates its running statistics, held in ``self.buffers``, after
        each training forward; an inference-mode one (the usual export) keeps them fixed, as onnxruntime's
        training does.
    input_grads : list of str, optional
        Graph inputs whose gradients ``backward`` returns too.
    max_memory : int, optional
        Budget in bytes for each arena and context block (default: ``edgetrain.budget``).

    ``self.weights`` holds the weights (name -> array, updated in place by a trainer); ``forward`` and
    ``backward`` use them unless given ``weights=`` (the functional form).
    """

    def __init__(self, model, weights: list[str] | None = None, input_grads: list[str] | None = None,
                 max_memory: int | None = None):
        graph = model if isinstance(model, Graph) else load_graph(model)
        self.graph = graph
        self.max_memory = budget.resolve(max_memory)
        floats = list(get_train_initializer(graph))
        if weights is None:
            stats = {n.inputs[i] for n in graph.nodes for i in STATISTICS_INPUTS.get(n.op_type, ())
                     if i < len(n.inputs)}
            weights = params_with_gradient(graph, [f for f in floats if f not in stats])
        unknown = [w for w in weights if w not in graph.initializers]
        if unknown:
            raise InputError(f"weights {unknown} are not initializers of graph '{graph.name}'; floating-point "
                             f"initializers: {floats[:20]}")
        not_float = [w for w in weights if w not in floats]
        if not_float:
            raise InputError(f"weights {not_float} are not floating-point initializers: they get no gradient")
        input_names = [v.name for v in graph.inputs]
        input_grads = list(input_grads or [])
        bad = [n for n in input_grads if n not in input_names]
        if bad:
            raise InputError(f"input_grads {bad} are not inputs of graph '{graph.name}'; inputs: {input_names}")
        not_float = [v.name for v in graph.inputs if v.name in input_grads and v.type.dtype.kind != "f"]
        if not_float:
            raise InputError(f"input_grads {not_float} are not floating-point inputs: they have no gradient")
        self.weight_names = list(weights)
        self.input_grads = input_grads
        self.input_names = input_names
        self.output_names = [v.name for v in graph.outputs]
        self.weights = {w: np.array(graph.initializers[w], order="C") for w in self.weight_names}
        self._weight_values = [Value(w, TensorType(self.weights[w].dtype, self.weights[w].shape))
                               for w in self.weight_names]
        prepared = prepare_for_training(graph)
        # running statistics (BatchNorm's): held beside the weights, read by both forms, and replaced by the
        # updated values after each training forward, as torch's BatchNorm does
        self._stats = [(out, src) for n in prepared.nodes
                       if n.op_type in STATISTICS_INPUTS and n.attrs.get("training_mode")
                       for out, src in zip(n.outputs[1:3], n.inputs[3:5])
                       if out and src in graph.initializers and src not in set(self.weight_names)]
        self.buffers = {src: np.array(graph.initializers[src], order="C") for _, src in self._stats}
        held = [Value(b, TensorType(a.dtype, a.shape)) for b, a in self.buffers.items()]
        constants = {k: v for k, v in graph.initializers.items()
                     if k not in set(self.weight_names) and k not in self.buffers}
        wrt = input_grads + self.weight_names
        self.backward_graph, self.saved = output_gradient_graph(prepared, self.output_names, wrt)
        seeds = {v.name for v in self.backward_graph.inputs}
        self.seeded_outputs = [n for n in self.output_names if f"{n}_grad_output" in seeds]
        # saved values the forward program returns (inputs and weights are copied from what the caller gave)
        given = set(input_names) | set(self.weight_names) | set(self.buffers)
        self._computed = [s for s in self.saved if s not in given]
        inputs = list(graph.inputs) + self._weight_values + held
        self.train_graph = Graph(prepared.nodes, inputs, list(graph.outputs), constants, prepared.opsets, {},
                                 graph.name)
        self.eval_graph = Graph(self._eval_nodes(graph), inputs, list(graph.outputs), constants,
                                dict(graph.opsets), {}, graph.name)
        self._plans: dict[tuple, _Plans] = {}
        self._eval: dict[tuple, Program] = {}
        self._pool: dict[tuple, list[_Block]] = {}
        self.blocks_made = 0

    @staticmethod
    def _eval_nodes(graph: Graph):
        nodes = []
        for node in graph.nodes:
            op = lookup(node, graph.opset(node.domain))
            nodes.append(op.eval_form(node, graph.opset(node.domain)) if op.eval_form else node)
        return nodes

    # -- arguments -------------------------------------------------------------------------------------------
    def _feeds(self, inputs, weights) -> dict[str, np.ndarray]:
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
            if len(inputs) != len(self.input_names):
                raise InputError(f"graph '{self.graph.name}' takes {len(self.input_names)} input(s) "
                                 f"{self.input_names}, got {len(inputs)}")
            feeds = dict(zip(self.input_names, inputs))
        weights = self.weights if weights is None else weights
        missing = [w for w in self.weight_names if w not in weights]
        extra = [w for w in weights if w not in self.weight_names]
        if missing or extra:
            raise InputError(f"weights: missing {missing}, unexpected {extra}; expected {self.weight_names}")
        clash = [w for w in list(weights) + list(self.buffers) if w in feeds]
        if clash:
            raise InputError(f"{clash} given both as inputs and as weights")
        return feeds | {w: weights[w] for w in self.weight_names} | self.buffers

    def _types(self, feeds) -> tuple[dict[str, TensorType], tuple]:
        types = bind_feeds(self.train_graph.inputs, feeds, f"graph '{self.graph.name}'")
        return types, tuple((n, t.shape) for n, t in types.items())

    # -- planning --------------------------------------------------------------------------------------------
    def _plans_for(self, types: dict[str, TensorType], key: tuple) -> _Plans:
        plans = self._plans.get(key)
        if plans is not None:
            return plans
        fwd = make_plan(self.train_graph, types, self.output_names + self._computed + [o for o, _ in self._stats],
                        max_memory=self.max_memory)
        known = fwd.spec.types | types
        layout, offset = {}, 0
        for name in self.saved:
            t = TensorType(known[name].dtype, known[name].shape)
            layout[name] = (offset, t)
            offset += -(-t.nbytes // ALIGN) * ALIGN
        budget.check(offset, self.max_memory, f"graph '{self.graph.name}': one context's saved values")
        output_types = [TensorType(known[n].dtype, known[n].shape) for n in self.output_names]
        bwd_types = {f"{n}_grad_output": output_types[k] for k, n in enumerate(self.output_names)
                     if n in self.seeded_outputs} | {s: layout[s][1] for s in self.saved}
        grads = [f"{w}_grad" for w in self.input_grads + self.weight_names]
        bwd = make_plan(self.backward_graph, bwd_types, grads, external=self.saved, max_memory=self.max_memory)
        plans = self._plans[key] = _Plans(Program(fwd), bwd, aligned_empty(bwd.arena_bytes), layout, offset,
                                          output_types)
        return plans

    def _block(self, key: tuple, plans: _Plans) -> _Block:
        free = self._pool.get(key)
        if free:
            return free.pop()
        budget.check(plans.block_bytes, self.max_memory, f"graph '{self.graph.name}': a context block")
        buffer = aligned_empty(plans.block_bytes)
        views = {n: buffer[o:o + t.nbytes].view(t.dtype).reshape(t.shape) for n, (o, t) in plans.layout.items()}
        self.blocks_made += 1
        return _Block(buffer, views, Program(plans.backward, views, plans.arena))

    # -- the two calls ---------------------------------------------------------------------------------------
    def forward(self, inputs, training: bool = True, weights: dict[str, np.ndarray] | None = None):
        """Run the graph: ``(outputs, context)``, outputs in graph order (arrays owned by the caller).

        ``inputs``: a dict by input name, or arrays in the graph's input order. ``training=False`` runs the
        inference form (Dropout off, BatchNorm on running statistics), keeps nothing and returns no context.
        ``weights``: name -> array for this call instead of ``self.weights``.
        """
        feeds = self._feeds(inputs, weights)
        types, key = self._types(feeds)
        if not training:
            prog = self._eval.get(key)
            if prog is None:
                plan = make_plan(self.eval_graph, types, self.output_names, max_memory=self.max_memory)
                prog = self._eval[key] = Program(plan)
            outs = prog.run([feeds[n] for n in prog.plan.fed_inputs])
            return [np.array(o) for o in outs], None
        plans = self._plans_for(types, key)
        prog = plans.forward
        outs = prog.run([feeds[n] for n in prog.plan.fed_inputs])
        block = self._block(key, plans)
        computed = dict(zip(self.output_names + self._computed + [o for o, _ in self._stats], outs))
        for name, view in block.views.items():
            np.copyto(view, computed[name] if name in computed else feeds[name])
        for out, src in self._stats:
            np.copyto(self.buffers[src], computed[out])
        return [np.array(o) for o in outs[:len(self.output_names)]], Context(self, key, block, plans.output_types)

    def backward(self, context: Context, grad_outputs, retain: bool = False) -> dict[str, np.ndarray]:
        """Gradients ``{name: array}`` of the requested inputs, then of the weights, for the forward call that
        made ``context``, given the gradients of its outputs (a list in output order or a dict by name; None
        for an output means zero). The weights are those that forward used. ``retain``: keep the context for
        another backward (else it is consumed and its block reused)."""
        if not isinstance(context, Context) or context._owner is not self:
            raise InputError("backward needs a context returned by this object's forward(..., training=True)")
        if not context.alive:
            raise InputError("this context was already used by backward (pass retain=True to keep it) or released")
        if isinstance(grad_outputs, dict):
            unknown = [n for n in grad_outputs if n not in self.output_names]
            if unknown:
                raise InputError(f"grad_outputs {unknown} are not outputs; outputs: {self.output_names}")
            grad_outputs = [grad_outputs.get(n) for n in self.output_names]
        else:
            grad_outputs = list(grad_outputs) if isinstance(grad_outputs, (list, tuple)) else [grad_outputs]
            if len(grad_outputs) != len(self.output_names):
                raise InputError(f"graph '{self.graph.name}' has {len(self.output_names)} output(s) "
                                 f"{self.output_names}, got {len(grad_outputs)} gradient(s)")
        feeds = []
        for name, t, g in zip(self.output_names, context.output_types, grad_outputs):
            if name not in self.seeded_outputs:
                continue
            if g is None:
                g = np.zeros(t.shape, t.dtype)
            if not isinstance(g, np.ndarray) or g.shape != t.shape or g.dtype != t.dtype:
                got = f"{g.dtype}{list(g.shape)}" if isinstance(g, np.ndarray) else type(g).__name__
                raise InputError(f"gradient of output '{name}' must be a {t} array (as the output), got {got}")
            feeds.append(g)
        prog = context._block.program
        outs = prog.run(feeds)
        result = {n: np.array(g) for n, g in zip(self.input_grads + self.weight_names, outs)}
        if not retain:
            context.release()
        return result

    # -- what it costs ---------------------------------------------------------------------------------------
    def planned(self, inputs, weights: dict[str, np.ndarray] | None = None) -> Planned:
        """The programs for the shapes of ``inputs`` (planned on first use)."""
        types, key = self._types(self._feeds(inputs, weights))
        plans = self._plans_for(types, key)
        return Planned(plans.forward, plans.backward, plans.block_bytes)

    def planned_feeds(self, inputs, weights: dict[str, np.ndarray] | None = None) -> list[np.ndarray]:
        """``inputs`` and the weights in the order the forward program takes them (``Program.run``)."""
        feeds = self._feeds(inputs, weights)
        return [feeds[n] for n in self.planned(inputs, weights).forward.plan.fed_inputs]

    def memory(self, inputs=None) -> dict[str, int]:
        """Planned bytes for the shapes of ``inputs`` (default: the last planned): the forward and backward
        arenas, one context's saved values, and the blocks made so far (live contexts plus pooled ones)."""
        if inputs is not None:
            types, key = self._types(self._feeds(inputs, None))
            plans = self._plans_for(types, key)
        elif self._plans:
            plans = next(reversed(self._plans.values()))
        else:
            raise EdgetrainError("memory(): nothing planned yet; pass inputs or run forward first")
        return {"forward_arena": plans.forward.plan.arena_bytes, "backward_arena": plans.backward.arena_bytes,
                "context_bytes": plans.block_bytes, "blocks": self.blocks_made,
                "weights": sum(w.nbytes for w in self.weights.values())}
