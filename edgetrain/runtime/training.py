"""The training program: one model's state, its training and eval steps, and its optimizer step.

It owns everything a training step does: binding parameters, gradient buffers and optimizer moments (the state
store's flat arrays) into the programs, one bound step per set of input shapes (planned on first use, then a
flat loop of kernel calls), gradient accumulation (a step after ``lazy_reset_grad`` overwrites the gradients,
later ones add to them: ORT's semantics, where the reset takes effect at the next training step), the updated
running statistics of training-mode batch norms, and the optimizer step with its learning rate and step count.
A step is committed only once it has succeeded (``runtime/step.py``), so a refused or failed step changes no
state. ``edgetrain.api`` is an ORT-shaped adapter over this (names, argument checks, ORT's error sentences,
OrtValues).
"""
from __future__ import annotations


import numpy as np

from .. import budget
from ..codegen import parallel_compile
from ..errors import EdgetrainError
from ..ir import Graph, TensorType
from ..ops import node_attr
from ..plan import make_plan
from ..record import Record
from .feeds import bind_feeds
from .program import Program, aligned_empty
from .state import StateStore, planned_nbytes
from .step import TrainingStep, check_loss, check_writes

BUFFER = "_grad.accumulation.buffer"        # a training model's gradient accumulation inputs: <param><BUFFER>
ACCUMULATED = "_grad.accumulation.out"      # and their outputs, which no caller sees
RESET = "lazy_reset_grad"
MOMENT_INPUTS = ("first_order_moments", "second_order_moments")


class ModelIO(Record):
    """A model's graph and how its inputs and outputs divide between the caller and the state."""
    graph: Graph
    user_inputs: list[str]     # fed by the caller, in the model's order
    params: list[str]          # parameter inputs in the model's order
    outputs: list[str]         # user-facing outputs (loss first)
    _fields = ("graph", "user_inputs", "params", "outputs")

    def __init__(self, graph: Graph, user_inputs: list[str], params: list[str], outputs: list[str]):
        self.graph, self.user_inputs, self.params, self.outputs = graph, user_inputs, params, outputs

    @classmethod
    def of(cls, graph: Graph, params: set[str]) -> ModelIO:
        names = [v.name for v in graph.inputs]
        user = [n for n in names if n not in params and not n.endswith(BUFFER) and n != RESET]
        outputs = [v.name for v in graph.outputs if not v.name.endswith(ACCUMULATED)]
        return cls(graph, user, [n for n in names if n in params], outputs)


def running_stats(graph: Graph) -> list[tuple[str, str]]:
    """(updated running statistic output, frozen parameter it replaces) for training-mode batch norms."""
    pairs = []
    for n in graph.nodes:
        if n.op_type in ("BatchNormalization", "BatchNormInternal") and node_attr(n, "training_mode"):
            for out, src in zip(n.outputs[1:3], n.inputs[3:5]):
                if out:
                    pairs.append((out, src))
    return pairs


class BoundStep(Record):
    """A model bound for one set of input shapes and dtypes: what a call runs and what it hands back."""
    program: Program                   # training: the first of its step's programs
    step: TrainingStep | None          # training: runs, checks and commits
    feed_order: list[int]              # user-input position of each of plan.fed_inputs
    results: list[int]                 # program outputs the caller gets, loss first
    _fields = ("program", "step", "feed_order", "results")

    def __init__(self, program, step, feed_order, results):
        self.program, self.step, self.feed_order, self.results = program, step, feed_order, results
        # the program takes the user inputs as they come (none reordered; its run ignores trailing ones it does not
        # read): passed on without a new list
        self.feeds_in_order = self.feed_order == list(range(len(self.feed_order)))


class FedShapes:
    """The input shapes and dtypes each model of a training program was bound for, as JSON-ready data:
    ``{"train": [{input name: [shape, dtype name]}, ...], "eval": [...]}``, in binding order.

    What the warm kernel set's automatic build runs a folder with (``kernels/_autowarm.py``): a batch size
    cannot give every symbolic dim (labels shaped [N*T]). A record outlives its program (a process may drop its
    Module before exiting) and holds at most ``LIMIT`` shape sets per model: kernels are shape-generic, so a few
    cover the broadcast patterns, and a run over many sequence lengths does not grow it."""
    LIMIT = 4

    def __init__(self):
        self.by_model: dict[str, list[dict]] = {"train": [], "eval": []}

    def note(self, training: bool, names, arrays) -> None:
        seen = self.by_model["train" if training else "eval"]
        if len(seen) < self.LIMIT:
            seen.append({n: [[int(d) for d in a.shape], a.dtype.name] for n, a in zip(names, arrays)})


class TrainingProgram:
    """A training model (and optionally an eval model) bound to one state store.

    ``values``: the parameters' initial values by name (None: zeros of the declared type, for a nominal
    checkpoint). ``max_memory`` (bytes) bounds the state store and each step's arena.
    """

    def __init__(self, train: Graph, values: dict[str, np.ndarray | None], eval_graph: Graph | None = None,
                 max_memory: int | None = None):
        parallel_compile.start_early()      # a first process ever: the compile helper starts while this plans
        known = set(values)
        self.train_io = ModelIO.of(train, known)
        declared = {v.name: v for v in train.inputs}
        trainable = [n[: -len(BUFFER)] for n in declared if n.endswith(BUFFER)]
        for p in self.train_io.params + trainable:
            if p in self.train_io.user_inputs:
                raise EdgetrainError(
                    f"the training model accumulates a gradient for '{p}', which is one of its inputs, not a "
                    f"checkpoint parameter: only initializers can be trained (onnxruntime 1.19 cannot run such "
                    f"a model either); drop '{p}' from requires_grad or make it an initializer "
                    f"(edgetrain.forward_backward gives gradients of inputs)")
            if p not in known:
                raise EdgetrainError(f"the checkpoint has no parameter '{p}' that the training model needs")
        for name, v in declared.items():
            array = values.get(name)
            if array is None:
                continue
            want = TensorType(v.type.dtype, v.type.shape)
            if tuple(array.shape) != want.shape or array.dtype != want.dtype:
                raise EdgetrainError(f"parameter '{name}' in the checkpoint is "
                                     f"{TensorType(array.dtype, array.shape)}, the training model expects {want}")
        frozen = [p for p in self.train_io.params if p not in set(trainable)]
        self.max_memory = budget.resolve(max_memory)
        budget.check(planned_nbytes({p: declared[p].type for p in trainable},
                                    {p: declared[p].type for p in frozen}), self.max_memory,
                     "the training model's state (parameters, two gradient arrays, frozen parameters)")

        def initial(p):
            a = values[p]
            return np.zeros(declared[p].type.shape, declared[p].type.dtype) if a is None else a
        self.store = StateStore({p: initial(p) for p in trainable}, {p: initial(p) for p in frozen})
        self.eval_io = None if eval_graph is None else ModelIO.of(eval_graph, known)
        # statistics the model keeps as constants (neither trainable nor frozen) are not updated, as in ORT
        self.stats = [(out, p) for out, p in running_stats(train) if p in self.store.frozen]
        self.reset_pending = True       # the first training step overwrites whatever the buffers held
        self.optimizer: OptimizerStep | None = None
        self._programs: dict = {}       # (training, input shapes) -> Program (training: the step's first bound)
        self._steps: dict = {}          # the same keys, training -> TrainingStep
        self._bound: dict = {}          # (training, (shape, dtype) per input) -> BoundStep
        # training -> (BoundStep, shapes, dtypes) of the last call: a step on inputs like the last one's compares
        # them (hashing shapes and dtypes for the dict costs more than the comparison)
        self._recent: dict = {}
        self._fed = FedShapes()
        self.arena: np.ndarray | None = None    # shared by every program here: they never run at once

    # -- binding ----------------------------------------------------------------------------------------------
    def io(self, training: bool) -> ModelIO:
        if training:
            return self.train_io
        if self.eval_io is None:
            raise EdgetrainError("eval() needs an eval model: Module(train_model_uri, state, eval_model_uri) "
                                 "was created without one")
        return self.eval_io

    def param_array(self, name: str) -> np.ndarray:
        """The live array of parameter ``name`` (trainable or frozen)."""
        store = self.store
        return store.param(name) if name in store.offsets else store.frozen[name]

    def external(self, training: bool) -> dict[str, np.ndarray]:
        """The arrays a model's program binds outside its arena (the training model's reset flag: true, since
        every training run writes its own gradients and the commit accumulates)."""
        io = self.io(training)
        arrays = {p: self.param_array(p) for p in io.params}
        if training:
            arrays |= {f"{p}{BUFFER}": self.store.grad(p) for p in self.store.names}
            arrays[RESET] = np.ones(1, np.bool_)
        return arrays

    def planned(self, training: bool, feeds: dict[str, np.ndarray]) -> tuple[Program, TrainingStep | None]:
        """The program (and for training, the step) for these feeds' shapes, planned once per shape."""
        io = self.io(training)
        external = self.external(training)
        types = bind_feeds(io.graph.inputs, feeds | external, "training model" if training else "eval model")
        key = (training, tuple(types[n].shape for n in io.user_inputs))
        prog = self._programs.get(key)
        if prog is None:
            outputs = [v.name for v in io.graph.outputs]
            if training:
                outputs += [out for out, _ in self.stats]
            plan = make_plan(io.graph, types, outputs, external=external, max_memory=self.max_memory,
                             direct_gradients=training)
            if self.arena is None or self.arena.nbytes < plan.arena_bytes:
                # programs made before keep the smaller arena they were bound to; first plans are usually
                # the largest batch, so later shapes (a last partial batch, eval) fit in it
                self.arena = aligned_empty(plan.arena_bytes)
            if training:
                step = self._steps[key] = self._training_step(plan, external)
                prog = step.program(1 - self.store.slot)     # the one bound already
            else:
                check_writes(plan, set(), "eval step")
                prog = Program(plan, external, self.arena)
            self._programs[key] = prog
        return prog, self._steps.get(key)

    def _training_step(self, plan, external: dict[str, np.ndarray]) -> TrainingStep:
        buffers = {b: b[: -len(BUFFER)] for b in external if b.endswith(BUFFER)}
        fixed = {n: a for n, a in external.items() if n not in buffers}
        stats = [(out, self.store.frozen[param]) for out, param in self.stats]
        loss = self.train_io.outputs[0]
        return TrainingStep(plan, fixed, buffers, self.store, self.arena, stats,
                            (plan.spec.output_names.index(loss), loss))

    def bind(self, training: bool, user_inputs) -> BoundStep:
        """The bound step for inputs of these shapes and dtypes (validated, planned and bound on first use)."""
        recent = self._recent.get(training)
        if recent is not None and len(user_inputs) == len(recent[1]):
            for x, shape, dtype in zip(user_inputs, recent[1], recent[2]):
                if x.shape != shape or x.dtype is not dtype:    # a dtype not the same object: the dict decides
                    break
            else:
                return recent[0]
        key = (training, *((x.shape, x.dtype) for x in user_inputs))
        bound = self._bound.get(key)
        if bound is None:
            io = self.io(training)
            prog, step = self.planned(training, dict(zip(io.user_inputs, user_inputs)))
            names = prog.plan.spec.output_names
            feed_order = [io.user_inputs.index(n) for n in prog.plan.fed_inputs]
            results = [k for k, name in enumerate(names) if name in io.outputs]
            bound = self._bound[key] = BoundStep(prog, step, feed_order, results)
            self._fed.note(training, io.user_inputs, user_inputs)
        self._recent[training] = (bound, tuple(x.shape for x in user_inputs), tuple(x.dtype for x in user_inputs))
        return bound

    # -- steps --------------------------------------------------------------------------------------------------
    def run(self, training: bool, user_inputs) -> tuple[list[np.ndarray], list[int]]:
        """One training or eval step on ``user_inputs`` (plain arrays, in the model's input order): the
        program's outputs (views valid until the next step) and which of them the caller gets, loss first.
        A training step commits its gradients (overwriting them after ``lazy_reset_grad``, else adding) and
        running statistics only if its loss is finite and no kernel raised."""
        bound = self.bind(training, user_inputs)
        inputs = user_inputs if bound.feeds_in_order else [user_inputs[k] for k in bound.feed_order]
        if bound.step is not None:
            outs = bound.step.run(inputs, not self.reset_pending)
            self.reset_pending = False
        else:
            outs = bound.program.run(inputs)
            check_loss(outs, bound.results[0], self.eval_io.outputs[0])
        return outs, bound.results

    def lazy_reset_grad(self) -> None:
        """The next training step overwrites the gradients instead of adding to them."""
        self.reset_pending = True

    # -- introspection ----------------------------------------------------------------------------------------
    def bound_steps(self) -> list[BoundStep]:
        """Every bound step so far, in binding order."""
        return list(self._bound.values())

    def programs(self) -> list[tuple[str, Program]]:
        """Every program planned so far, tagged "train" or "eval"; a training step has two, one per gradient
        slot of the state (``runtime/step.py``), and runs the other one each step."""
        found = [("train", p) for step in self._steps.values() for p in step.programs]
        return found + [("eval", p) for key, p in self._programs.items() if key not in self._steps]

    def fed_shapes(self) -> FedShapes:
        """The input shapes and dtypes bound so far, per model (a live record: later bindings add to it)."""
        return self._fed

    def planned_kernels(self) -> int:
        """Kernel calls in every program planned so far (one per input shape and model)."""
        return sum(prog.plan.n_kernels for prog in self._programs.values())

    def attach_optimizer(self, graph: Graph) -> OptimizerStep:
        self.optimizer = OptimizerStep(graph, self.store, self.max_memory)
        return self.optimizer


class OptimizerStep:
    """The optimizer model bound to a state store: parameters, gradients and moments are each one flat array
    there, which is what the model's tensor-sequence inputs are bound to (once per gradient slot of the
    store). Owns the learning rate and the step count (the store's ``step``).

    ``run()`` does not look at the gradients' values: a finite loss with non-finite gradients updates into NaN,
    as onnxruntime and PyTorch do (checking would cost a pass over every gradient per step). It is refused
    before it writes anything when there is no gradient yet, and the step count advances only once the update
    has run."""

    def __init__(self, graph: Graph, store: StateStore, max_memory: int):
        self.store = store
        names = [v.name for v in graph.inputs]
        self.moments = [n for n in MOMENT_INPUTS if n in names]
        budget.check(store.nbytes() + max(0, len(self.moments) - len(store.moments)) * store.params.nbytes,
                     max_memory, "the state with the optimizer's moments")
        store.ensure_moments(len(self.moments))
        self.lr = np.zeros(1, np.float32)
        self.step_input = np.zeros(1, np.int64)
        flat = TensorType(store.dtype, (store.size,))
        arrays = {"learning_rate": self.lr, "step": self.step_input, "params": store.params,
                  "gradients": store.grad_slots[0]}
        arrays |= {n: store.moments[k] for k, n in enumerate(self.moments)}
        unknown = [n for n in names if n not in arrays]
        if unknown:
            raise EdgetrainError(f"optimizer model inputs {unknown} are not ones edgetrain binds "
                                 "(learning_rate, step, params, gradients, first/second_order_moments)")
        types = {n: (flat if n in ("params", "gradients") + MOMENT_INPUTS else TensorType(a.dtype, a.shape))
                 for n, a in arrays.items() if n in names}
        external = {n: arrays[n] for n in names}
        plan = make_plan(graph, types, [v.name for v in graph.outputs], external=external, max_memory=max_memory)
        self._plan, self._arena = plan, aligned_empty(plan.arena_bytes)
        self._external = [external | ({"gradients": store.grad_slots[k]} if "gradients" in external else {})
                          for k in (0, 1)]
        self._by_slot: list[Program | None] = [None, None]
        # bound now: the program reading the gradients the next training step commits (that step flips the
        # slot); the other one when a step first reads that slot (a process's first step needs only one)
        self._bound(1 - store.slot)

    def _bound(self, slot: int) -> Program:
        prog = self._by_slot[slot]
        if prog is None:
            prog = self._by_slot[slot] = Program(self._plan, self._external[slot], self._arena)
        return prog

    @property
    def by_slot(self) -> tuple[Program, Program]:
        """Both programs, one per gradient slot of the store (binding the one not bound yet)."""
        return self._bound(0), self._bound(1)

    @property
    def program(self) -> Program:
        """The program the next step runs: the one reading the committed gradients."""
        return self._by_slot[self.store.slot] or self._bound(self.store.slot)

    @property
    def learning_rate(self) -> float:
        return float(self.lr[0])

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        self.lr[0] = value

    @property
    def step_count(self) -> int:
        return self.store.step

    def restore(self, step: int, moments: dict[str, dict[int, np.ndarray]]) -> None:
        """Resume from a checkpoint: the step count and, per parameter, moment k's saved values."""
        self.store.step = int(step)
        for name, saved in moments.items():
            if name not in self.store.offsets:
                continue
            for k, m in saved.items():
                if k < len(self.moments):
                    np.copyto(self.store.moment(k, name), m.reshape(self.store.shapes[name]))

    def run(self) -> None:
        """One update from the committed gradients."""
        if not self.store.has_gradients:
            raise EdgetrainError("Optimizer.step() before any gradient: run a training step (module(inputs...)) "
                                 "first")
        self.step_input[0] = self.store.step + 1
        self.program.run([])
        self.store.step += 1
