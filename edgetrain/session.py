"""``edgetrain.InferenceSession``: onnxruntime's inference surface over planned programs."""
from __future__ import annotations


import numpy as np

from . import budget
from .errors import InputError, ShapeError
from .ir import Graph, TensorType, Value
from .ir.dtypes import ORT_TYPE_NAME
from .plan import make_plan
from .record import Frozen
from .runtime import Program
from .runtime.feeds import bind_feeds


VALUE_INPUT_SIZE = 64    # elements: inputs up to this size may be planned per value (shape, axes, pads, limits)


class NodeArg(Frozen):
    """What ``get_inputs()`` / ``get_outputs()`` return, as in onnxruntime."""
    name: str
    shape: list
    type: str

    def __init__(self, name: str, shape: list, type: str):      # noqa: A002 - onnxruntime's field name
        self._set(name=name, shape=shape, type=type)


def node_arg(v: Value, t: TensorType | None = None) -> NodeArg:
    """``t``: the planned type, for an output the model declares without one."""
    t = v.type or t
    if t is None:
        return NodeArg(v.name, None, "tensor(undefined)")
    return NodeArg(v.name, list(t.shape), f"tensor({ORT_TYPE_NAME[t.dtype]})")


class InferenceSession:
    """Run an ONNX model: ``InferenceSession(path_or_bytes).run(output_names, feeds)``.

    One plan and arena per distinct set of input shapes, built on first use. ``sess_options`` and
    ``providers`` are accepted for onnxruntime compatibility and ignored (CPU only).
    """

    def __init__(self, model, sess_options=None, providers=None, max_memory: int | None = None, **kwargs):
        from .compact import load_graph

        self.graph: Graph = load_graph(model)      # ONNX, or a compact .etm model (no onnx needed)
        self.max_memory = budget.resolve(max_memory)     # None: the default budget (edgetrain.budget)
        self._programs: dict[tuple, Program] = {}
        self._value_inputs: set[str] = set()     # inputs planned per value (``_plan``)
        self._where = f"model '{model}'" if isinstance(model, str) else f"graph '{self.graph.name}'"

    def get_inputs(self) -> list[NodeArg]:
        return [node_arg(v) for v in self.graph.inputs]

    def get_outputs(self) -> list[NodeArg]:
        """Declared outputs; an output declared without a type gets the one its last plan inferred."""
        spec = next(reversed(self._programs.values())).plan.spec if self._programs else None
        planned = {} if spec is None else {n: TensorType(spec.declared[n], t.shape) if n in spec.declared else t
                                           for n, t in spec.types.items()}    # float16 as declared, not as computed
        return [node_arg(v, planned.get(v.name)) for v in self.graph.outputs]

    def get_providers(self) -> list[str]:
        return ["CPUExecutionProvider"]

    def program(self, feeds: dict[str, np.ndarray], output_names: list[str] | None = None) -> Program:
        """The Program for these feeds' shapes (planned and compiled on first use)."""
        output_names = list(output_names or [v.name for v in self.graph.outputs])
        types = bind_feeds(self.graph.inputs, feeds, self._where)
        prog = self._programs.get(self._key(types, output_names, feeds))
        if prog is None:
            prog = Program(self._plan(types, output_names, feeds))
            self._programs[self._key(types, output_names, feeds)] = prog    # the value inputs it needed, too
        return prog

    def _key(self, types, output_names, feeds) -> tuple:
        values = tuple((n, feeds[n].dtype.str, feeds[n].tobytes()) for n in sorted(self._value_inputs))
        return tuple((n, t.shape) for n, t in types.items()), tuple(output_names), values

    def _plan(self, types, output_names, feeds):
        """Plan for these feeds. A small input whose value a shape rule needs (a Reshape's shape, Pad's pads,
        a Range's limit fed at run time) becomes a constant of the plan, as input shapes are: one plan per value."""
        while True:
            consts = dict(self.graph.initializers, **{n: feeds[n] for n in self._value_inputs})
            fed = {n: t for n, t in types.items() if n not in self._value_inputs}
            try:
                return make_plan(self.graph, fed, output_names, consts=consts, max_memory=self.max_memory)
            except ShapeError as e:
                new = self._inputs_behind(getattr(e, "needs_value", None), feeds)
                if not new:
                    raise
                self._value_inputs |= new

    def _inputs_behind(self, name: str | None, feeds) -> set[str]:
        """The small graph inputs (at most VALUE_INPUT_SIZE elements) ``name`` is computed from, not yet planned
        per value."""
        producers = self.graph.producers()
        found, todo, seen = set(), [name] if name else [], set()
        while todo:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            if n in feeds and n not in self._value_inputs and np.asarray(feeds[n]).size <= VALUE_INPUT_SIZE:
                found.add(n)
            elif n in producers:
                todo.extend(i for i in producers[n].inputs if i)
        return found

    def run(self, output_names, input_feed: dict[str, np.ndarray], run_options=None) -> list[np.ndarray]:
        known = {v.name for v in self.graph.outputs}
        for name in output_names or []:
            if name not in known:
                raise InputError(f"{self._where}: '{name}' is not an output; outputs: {sorted(known)}")
        input_feed = {k: np.asarray(x) if isinstance(x, np.generic) else x for k, x in input_feed.items()}
        prog = self.program(input_feed, output_names)
        outs = prog.run([input_feed[n] for n in prog.plan.fed_inputs])
        return [np.array(o) for o in outs]   # copies, as onnxruntime returns: the arena is reused next run
