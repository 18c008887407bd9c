"""``edgetrain.api``: onnxruntime.training.api's on-device training surface (CheckpointState, Module, ...).

Semantics follow ORT 1.19 (ORT_FORMATS.md §2) where ORT is right, and raise clear errors where ORT crashes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from . import budget
from . import checkpoint as ckpt_io
from .errors import EdgetrainError, InputError, NominalStateError
from .ir import Graph, TensorType
from .ops import node_attr
from .ortvalue import OrtValue, as_array
from .plan import make_plan
from .runtime import Program
from .runtime.export import export as export_inference_model
from .runtime.program import aligned_empty
from .runtime.state import StateStore, planned_nbytes
from .runtime.step import TrainingStep, check_loss, check_writes
from .session import bind_feeds

BUFFER = "_grad.accumulation.buffer"
NOMINAL_ASSIGN = "Cannot copy parameter to a nominal state. Please load all the parameter states first."
RESET = "lazy_reset_grad"


class Parameter:
    """One parameter: ``name``, ``data`` (a copy; assigning copies in), ``grad`` (a copy of its gradient
    buffer: zeros from the moment a Module is bound, None for frozen parameters and before any Module, as in
    ORT), ``requires_grad``."""

    def __init__(self, state: CheckpointState, name: str, requires_grad: bool):
        self._state, self.name, self.requires_grad = state, name, requires_grad

    def _array(self) -> np.ndarray:
        return self._state._array(self.name)

    @property
    def data(self) -> np.ndarray:
        self._state._check_loaded(f"parameter '{self.name}'")
        return np.array(self._array())

    @data.setter
    def data(self, value) -> None:
        self._state._check_loaded(f"assigning parameter '{self.name}'", NOMINAL_ASSIGN)
        target = self._array()
        value = np.asarray(value)
        if value.shape != target.shape or value.dtype != target.dtype:
            raise InputError(f"parameter '{self.name}' is {TensorType(target.dtype, target.shape)}, got "
                             f"{TensorType(value.dtype, value.shape)}")
        np.copyto(target, value)

    @property
    def grad(self) -> np.ndarray | None:
        self._state._check_loaded(f"the gradient of parameter '{self.name}'")
        store = self._state._store
        if store is None or not self.requires_grad:
            return None
        # before the first step the buffers hold zeros (a Module starts from zeroed gradients, as ORT's does)
        return np.array(store.grad(self.name)) if store.has_gradients else np.zeros_like(store.grad(self.name))

    def __repr__(self) -> str:
        return f"Parameter(name={self.name!r}, requires_grad={self.requires_grad})"


class Parameters:
    """Dict-like view of a state's parameters: ``[name]`` -> Parameter, ``[name] = array`` copies in."""

    def __init__(self, state: CheckpointState):
        self._state = state

    def _names(self) -> list[str]:
        return list(self._state._checkpoint.trainable) + list(self._state._checkpoint.frozen)

    def __getitem__(self, name: str) -> Parameter:
        if name not in self:
            raise KeyError(f"no parameter named '{name}'; parameters: {self._names()}")
        self._state._check_loaded(f"parameter '{name}'")
        return Parameter(self._state, name, name in self._state._checkpoint.trainable)

    def __setitem__(self, name: str, value) -> None:
        self._state._check_loaded(f"assigning parameter '{name}'", NOMINAL_ASSIGN)
        self[name].data = value

    def __contains__(self, name) -> bool:
        return name in self._state._checkpoint.trainable or name in self._state._checkpoint.frozen

    def __iter__(self):
        return iter([(n, self[n]) for n in self._names()])

    def __len__(self) -> int:
        return len(self._names())


class Properties:
    """Dict-like user properties: int, float or str values."""

    def __init__(self, state: CheckpointState):
        self._props = state._checkpoint.properties

    def __getitem__(self, name: str):
        return self._props[name]

    def __setitem__(self, name: str, value) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise InputError(f"property '{name}' must be an int, float or str, got {type(value).__name__}")
        self._props[name] = value

    def __contains__(self, name) -> bool:
        return name in self._props

    def __iter__(self):
        return iter(self._props.items())

    def __len__(self) -> int:
        return len(self._props)


class CheckpointState:
    """Parameters, optimizer state and properties; loaded from and saved to ORT's checkpoint format."""

    def __init__(self, checkpoint: ckpt_io.Checkpoint):
        self._checkpoint = checkpoint
        self._store: StateStore | None = None
        self._optimizer = None
        # a nominal checkpoint holds no values until copy_buffer_to_parameters(..., trainable_only=False)
        self._nominal = checkpoint.is_nominal

    def _check_loaded(self, what: str, problem: str = "Cannot get parameter from a nominal state. Please load "
                                                      "the parameter states first.") -> None:
        """ORT's refusals on a nominal state, at the same points and with its wording first."""
        if self._nominal:
            raise NominalStateError(f"{problem} ({what}: the checkpoint is nominal; create the Module and call "
                                    "copy_buffer_to_parameters(buffer, trainable_only=False))")

    @classmethod
    def load_checkpoint(cls, checkpoint_uri: str | os.PathLike) -> CheckpointState:
        return cls(ckpt_io.load(checkpoint_uri))

    @classmethod
    def save_checkpoint(cls, state: CheckpointState, checkpoint_uri: str | os.PathLike,
                        include_optimizer_state: bool = False) -> None:
        """Write parameters sorted by name (as ORT does), optimizer state if asked; atomically."""
        trainable = {n: np.array(state._array(n)) for n in sorted(state._checkpoint.trainable)}
        frozen = {n: np.array(state._array(n)) for n in sorted(state._checkpoint.frozen)}
        groups = []
        store = state._store
        if include_optimizer_state and store is not None and store.moments:
            states = {n: {ckpt_io.MOMENTUM_NAMES[k]: np.array(store.moment(k, n)) for k in range(len(store.moments))}
                      for n in sorted(store.names)}
            lr = state._optimizer.initial_learning_rate if state._optimizer is not None else 0.0
            groups.append(ckpt_io.OptimizerGroup("group0", store.step, lr, states))
        ckpt_io.save(ckpt_io.Checkpoint(trainable, frozen, groups, dict(state._checkpoint.properties)),
                     checkpoint_uri)

    @property
    def parameters(self) -> Parameters:
        return Parameters(self)

    @property
    def properties(self) -> Properties:
        return Properties(self)

    def _array(self, name: str) -> np.ndarray:
        store = self._store
        if store is not None:
            return store.param(name) if name in store.offsets else store.frozen[name]
        c = self._checkpoint
        return c.trainable[name] if name in c.trainable else c.frozen[name]


@dataclass
class _ModelIO:
    graph: Graph
    user_inputs: list[str]
    params: list[str]          # parameter inputs in the model's order
    outputs: list[str]         # user-facing outputs (loss first)


def _load(uri) -> Graph:
    """An ONNX or compact (.etm) model, told apart by content; onnx is imported only for ONNX files."""
    from .compact import load_graph
    return load_graph(uri)


def _classify(graph: Graph, params: set[str]) -> _ModelIO:
    names = [v.name for v in graph.inputs]
    user = [n for n in names if n not in params and not n.endswith(BUFFER) and n != RESET]
    outputs = [v.name for v in graph.outputs if not v.name.endswith("_grad.accumulation.out")]
    return _ModelIO(graph, user, [n for n in names if n in params], outputs)


def _plain_arrays(io: _ModelIO, user_inputs) -> tuple[np.ndarray, ...]:
    """``user_inputs`` as exact ``np.ndarray`` views (no copy) of array subclasses, and ORT ``OrtValue``s
    (anything with ``.numpy()``) through their arrays; anything else (lists, scalars) is refused."""
    arrays = []
    for name, x in zip(io.user_inputs, user_inputs):
        if not isinstance(x, np.ndarray) and not callable(getattr(x, "numpy", None)):
            raise InputError(f"input '{name}' must be a numpy array or an OrtValue, got {type(x).__name__}")
        arrays.append(as_array(x))
    return tuple(arrays)


def _as_ort_value(a: np.ndarray) -> OrtValue:
    return np.array(a).view(OrtValue)


def _running_stats(graph: Graph) -> list[tuple[str, str]]:
    """(updated running statistic output, frozen parameter it replaces) for training-mode batch norms."""
    pairs = []
    for n in graph.nodes:
        if n.op_type in ("BatchNormalization", "BatchNormInternal") and node_attr(n, "training_mode"):
            for out, src in zip(n.outputs[1:3], n.inputs[3:5]):
                if out:
                    pairs.append((out, src))
    return pairs


@dataclass
class _Bound:
    """A program bound to a module for one set of input shapes."""
    program: Program                                 # training: the first of its step's programs
    step: TrainingStep | None                        # training: runs, checks and commits (runtime/step.py)
    feed_order: list[int]                            # user-input position of each of plan.fed_inputs
    results: list[int]                               # program outputs the caller gets, loss first


class Module:
    """A training model (and optionally its eval model) bound to a CheckpointState.

    ``module(*inputs)`` runs a training step (accumulating gradients into the state, or overwriting them after
    ``lazy_reset_grad()``) or, after ``eval()``, an eval step. Returns the loss and any additional outputs.
    A step whose loss is not finite, or that a kernel refuses, raises and leaves the state as it was.
    ``max_memory`` (bytes; default ``edgetrain.budget``'s) bounds the state store and each step's arena.
    """

    def __init__(self, train_model_uri, state: CheckpointState, eval_model_uri=None, device: str = "cpu",
                 session_options=None, max_memory: int | None = None):
        if device != "cpu":
            raise EdgetrainError(f"device '{device}' is not supported: edgetrain trains on the CPU")
        if state._store is not None:
            raise EdgetrainError("this CheckpointState is already bound to a Module")
        ckpt = state._checkpoint
        known = set(ckpt.trainable) | set(ckpt.frozen)
        self._train = _classify(_load(train_model_uri), known)
        graph_inputs = {v.name: v for v in self._train.graph.inputs}
        trainable = [n[: -len(BUFFER)] for n in graph_inputs if n.endswith(BUFFER)]
        for p in self._train.params + trainable:
            if p not in known:
                raise EdgetrainError(f"the checkpoint has no parameter '{p}' that the training model needs")
        self._check_shapes(graph_inputs, ckpt)
        frozen = [p for p in self._train.params if p not in set(trainable)]
        self.max_memory = budget.resolve(max_memory)    # bytes the state, and each step's arena, may take
        budget.check(planned_nbytes({p: graph_inputs[p].type for p in trainable},
                                    {p: graph_inputs[p].type for p in frozen}), self.max_memory,
                     "the training model's state (parameters, two gradient arrays, frozen parameters)")
        store = StateStore({p: self._value(ckpt, graph_inputs[p]) for p in trainable},
                           {p: self._value(ckpt, graph_inputs[p]) for p in frozen})
        state._store = store
        self._state, self._store = state, store
        self._eval = None
        if eval_model_uri is not None:
            self._eval = _classify(_load(eval_model_uri), known)
        self._reset = np.ones(1, np.bool_)     # the first step overwrites whatever the buffers held
        # statistics the model keeps as constants (neither trainable nor frozen) are not updated, as in ORT
        self._stats = [(out, p) for out, p in _running_stats(self._train.graph) if p in store.frozen]
        self._programs: dict = {}            # (id(model io), input shapes) -> Program
        self._steps: dict = {}               # the same keys, training model -> TrainingStep
        self._arena = None                   # shared by every program of the module: they never run at once
        self._bound: dict = {}               # (id(model io), (shape, dtype) per input) -> _Bound
        self.training = True

    @staticmethod
    def _check_shapes(inputs, ckpt) -> None:
        for name, v in inputs.items():
            array = ckpt.trainable.get(name, ckpt.frozen.get(name))
            if array is None or ckpt.is_nominal:
                continue
            want = TensorType(v.type.dtype, v.type.shape)
            if tuple(array.shape) != want.shape or array.dtype != want.dtype:
                raise EdgetrainError(f"parameter '{name}' in the checkpoint is "
                                     f"{TensorType(array.dtype, array.shape)}, the training model expects {want}")

    @staticmethod
    def _value(ckpt, v) -> np.ndarray:
        array = ckpt.trainable.get(v.name, ckpt.frozen.get(v.name))
        if ckpt.is_nominal:
            return np.zeros(v.type.shape, v.type.dtype)
        return array

    # -- modes ----------------------------------------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        self.training = mode
        return self

    def eval(self) -> Module:
        return self.train(False)

    def lazy_reset_grad(self) -> None:
        self._reset[0] = True

    def input_names(self) -> list[str]:
        return list(self._io().user_inputs)

    def output_names(self) -> list[str]:
        return list(self._io().outputs)

    def _io(self) -> _ModelIO:
        if self.training:
            return self._train
        if self._eval is None:
            raise EdgetrainError("eval() needs an eval model: Module(train_model_uri, state, eval_model_uri) "
                                 "was created without one")
        return self._eval

    # -- running --------------------------------------------------------------------------------------------
    def _external(self, io: _ModelIO) -> dict[str, np.ndarray]:
        store = self._store
        arrays = {p: (store.param(p) if p in store.offsets else store.frozen[p]) for p in io.params}
        if io is self._train:
            arrays |= {f"{p}{BUFFER}": store.grad(p) for p in store.names}
            arrays[RESET] = self._reset
        return arrays

    def _program(self, io: _ModelIO, feeds: dict[str, np.ndarray]) -> Program:
        return self._planned(io, feeds)[0]

    def _planned(self, io: _ModelIO, feeds: dict[str, np.ndarray]) -> tuple[Program, TrainingStep | None]:
        """The program (and for training, the step) for these feeds' shapes, planned once per shape."""
        external = self._external(io)
        types = bind_feeds(io.graph.inputs, feeds | external, "training model" if io is self._train else
                           "eval model")
        key = (id(io), tuple(types[n].shape for n in io.user_inputs))
        prog = self._programs.get(key)
        if prog is None:
            outputs = [v.name for v in io.graph.outputs]
            if io is self._train:
                outputs += [out for out, _ in self._stats]
            plan = make_plan(io.graph, types, outputs, external=external, max_memory=self.max_memory,
                             direct_gradients=io is self._train)
            if self._arena is None or self._arena.nbytes < plan.arena_bytes:
                # programs made before keep the smaller arena they were bound to; first plans are usually
                # the largest batch, so later shapes (a last partial batch, eval) fit in it
                self._arena = aligned_empty(plan.arena_bytes)
            if io is self._train:
                step = self._steps[key] = self._training_step(plan, external)
                prog = step.programs[0]
            else:
                check_writes(plan, set(), "eval step")
                prog = Program(plan, external, self._arena)
            self._programs[key] = prog
        return prog, self._steps.get(key)

    def _training_step(self, plan, external: dict[str, np.ndarray]) -> TrainingStep:
        buffers = {b: b[: -len(BUFFER)] for b in external if b.endswith(BUFFER)}
        # every run computes its own gradients into the spare slot; the step adds the sums when accumulating
        fixed = {n: a for n, a in external.items() if n not in buffers} | {RESET: np.ones(1, np.bool_)}
        stats = [(out, self._store.frozen[param]) for out, param in self._stats]
        loss = self._train.outputs[0]
        return TrainingStep(plan, fixed, buffers, self._store, self._arena, stats,
                            (plan.spec.output_names.index(loss), loss))

    def _bind(self, io: _ModelIO, user_inputs) -> _Bound:
        """Validate the inputs, plan (once per input shape) and precompute what each call moves."""
        prog, step = self._planned(io, dict(zip(io.user_inputs, user_inputs)))
        names = prog.plan.spec.output_names
        return _Bound(prog, step, [io.user_inputs.index(n) for n in prog.plan.fed_inputs],
                      [k for k, name in enumerate(names) if name in io.outputs])

    def __call__(self, *user_inputs):
        """Outputs as numpy arrays; as ``OrtValue``s (edgetrain's: arrays that answer ORT's methods) when no
        input is a numpy array, as ORT returns them then."""
        io = self._io()
        if self._state._nominal:
            step = "TrainStep" if self.training else "EvalStep"
            raise NominalStateError(f"Cannot perform {step} with a nominal state. Please load the model parameters "
                                    "first. (copy_buffer_to_parameters(buffer, trainable_only=False))")
        if len(user_inputs) != len(io.user_inputs):
            raise InputError(f"the {'training' if self.training else 'eval'} model takes {len(io.user_inputs)} "
                             f"input(s) {io.user_inputs}, got {len(user_inputs)}")
        # inputs of a shape and type seen before were validated then: skip straight to the program
        key = (id(io), *((x.shape, x.dtype) if type(x) is np.ndarray else None for x in user_inputs))
        ort_values = False   # plain arrays in (the steady path): plain arrays out
        if None in key:      # a subclass (np.memmap, ...) or no array: key its plain-ndarray view, never its id
            ort_values = not any(isinstance(x, np.ndarray) and not isinstance(x, OrtValue) for x in user_inputs)
            user_inputs = _plain_arrays(io, user_inputs)
            key = (id(io), *((x.shape, x.dtype) for x in user_inputs))
        bound = self._bound.get(key)
        if bound is None:
            bound = self._bound[key] = self._bind(io, user_inputs)
        inputs = [user_inputs[k] for k in bound.feed_order]
        if bound.step is not None:       # commits only if the loss is finite and no kernel raised
            outs = bound.step.run(inputs, accumulate=not self._reset[0])
            self._reset[0] = False
        else:
            outs = bound.program.run(inputs)
            check_loss(outs, bound.results[0], io.outputs[0])
        wrap = _as_ort_value if ort_values else np.array
        if len(bound.results) == 1:
            return wrap(outs[bound.results[0]])
        return [wrap(outs[k]) for k in bound.results]

    def planned_kernels(self) -> int:
        """Kernel calls in every program this module has planned so far (one per input shape and model). An
        edgetrain extension: the command line shows compile progress against it."""
        return sum(prog.plan.n_kernels for prog in self._programs.values())

    # -- introspection: edgetrain extensions, what the profiler, command line and minimal build read ----------
    def graph(self) -> Graph:
        """The IR graph of the model the current mode runs (training or eval model); its inputs carry types."""
        return self._io().graph

    def program(self, *user_inputs) -> Program:
        """The program the current mode runs for inputs of these shapes and types (planned now if new); a
        training step runs it through the module (``module(...)``), which commits what it computes."""
        io = self._io()
        return self._planned(io, dict(zip(io.user_inputs, _plain_arrays(io, user_inputs))))[0]

    def programs(self) -> list[tuple[str, Program]]:
        """Every program planned so far, tagged "train" or "eval"; a training step has two, one per gradient
        slot of the state (``runtime/step.py``), and runs the other one each step."""
        found = [("train", p) for step in self._steps.values() for p in step.programs]
        return found + [("eval", p) for key, p in self._programs.items() if key not in self._steps]

    @property
    def state_store(self) -> StateStore:
        """Parameters, gradients (two slots), optimizer moments and frozen arrays, each one flat array."""
        return self._store

    def fixed_batch_size(self) -> int | None:
        """The batch size the current model's inputs fix (an integer first dimension), or None when the batch
        dimension is symbolic. An edgetrain extension: a model exported with a fixed batch cannot run a last,
        smaller batch."""
        io = self._io()
        dims = {v.type.shape[0] for v in io.graph.inputs if v.name in io.user_inputs and v.type.shape}
        fixed = [d for d in dims if isinstance(d, int)]
        return fixed[0] if fixed else None

    def index_bounds(self) -> dict[str, tuple[int, int | None]]:
        """For each integer input of the current model that indexes something (labels of a loss, token ids of an
        embedding): (exclusive upper bound of its values, the loss's ignore_index or None). An edgetrain
        extension, for checking a data set before training."""
        from .plan.bounds import ignored_label, index_bound
        from .plan.specialize import specialize

        io = self._io()
        types = {v.name: TensorType(v.type.dtype, tuple(d if isinstance(d, int) else 1 for d in v.type.shape))
                 for v in io.graph.inputs}
        spec = specialize(io.graph, types, [v.name for v in io.graph.outputs])
        bounds = {}
        for name in io.user_inputs:
            bound = index_bound(io.graph, spec.types, name) if types[name].dtype.kind in "iu" else None
            if bound is not None:
                bounds[name] = (bound, ignored_label(io.graph, name))
        return bounds

    # -- parameters -----------------------------------------------------------------------------------------
    def get_parameters_size(self, trainable_only: bool = True) -> int:
        n = self._store.size
        return n if trainable_only else n + sum(a.size for a in self._store.frozen.values())

    def get_contiguous_parameters(self, trainable_only: bool = False, *, copy: bool = True) -> OrtValue:
        """Parameters in the training model's order, as one 1-D array that also answers ORT's ``OrtValue``
        methods (``.numpy()``, ``.shape()``, ...).

        A copy by default, so a snapshot stays what it was after ``optimizer.step()`` (federated averaging,
        rollbacks). ``copy=False`` opts into a live, zero-copy view of the trainable parameters: writes to it
        change the model, and later steps change it. Frozen parameters are stored apart, so a view cannot hold
        them."""
        if self._state._nominal:
            raise NominalStateError("Cannot copy parameters from a nominal checkpoint state. Please load the model "
                                    "parameters first. (copy_buffer_to_parameters(buffer, trainable_only=False))")
        if not copy:
            if self._store.frozen and not trainable_only:
                raise InputError("a zero-copy view holds only the trainable parameters (the frozen ones, "
                                 f"{', '.join(sorted(self._store.frozen))}, are stored apart): pass "
                                 "trainable_only=True, or copy=True")
            return self._store.params.view(OrtValue)
        if trainable_only or not self._store.frozen:
            return OrtValue.ortvalue_from_numpy(self._store.params)
        parts = [self._store.param(p).reshape(-1) if p in self._store.offsets else
                 self._store.frozen[p].reshape(-1) for p in self._train.params]
        return np.concatenate(parts).view(OrtValue)

    def copy_buffer_to_parameters(self, buffer, trainable_only: bool = True) -> None:
        """Fill the parameters from a flat buffer laid out as ``get_contiguous_parameters`` lays it: a numpy
        array, one of edgetrain's ``OrtValue``s or ORT's (anything with ``.numpy()``)."""
        buffer = as_array(buffer).reshape(-1)
        want = self.get_parameters_size(trainable_only)
        if buffer.size != want:
            raise InputError(f"buffer has {buffer.size} elements, the parameters need {want}")
        if trainable_only and self._state._nominal:
            raise NominalStateError("For nominal checkpoint state, all parameters need to be loaded into the model "
                                    "(trainable_only = false).")
        self._state._nominal = False
        if trainable_only:
            np.copyto(self._store.params, buffer.astype(self._store.dtype, copy=False))
            return
        offset = 0
        for p in self._train.params:
            target = self._store.param(p) if p in self._store.offsets else self._store.frozen[p]
            np.copyto(target, buffer[offset: offset + target.size].reshape(target.shape))
            offset += target.size

    def export_model_for_inferencing(self, inference_model_uri, graph_output_names: list[str]) -> None:
        """The eval model with the current parameters as initializers, pruned to ``graph_output_names``."""
        if self._eval is None:
            raise EdgetrainError("export_model_for_inferencing needs the eval model: pass eval_model_uri to Module")
        params = {p: np.array(self._state._array(p)) for p in self._eval.params}
        export_inference_model(self._eval.graph, list(graph_output_names), params, inference_model_uri)


MOMENT_INPUTS = ("first_order_moments", "second_order_moments")
DEFAULT_LEARNING_RATE = 1e-3     # ORT's default for a fresh Optimizer


class Optimizer:
    """Runs the optimizer model over the module's state store: parameters, gradients and moments are each one
    flat array there, which is what the model's tensor-sequence inputs are bound to (once per gradient slot
    of the store: ``runtime/step.py``).

    ``step()`` does not look at the gradients' values: the module refuses a step with a non-finite loss, but a
    finite loss with non-finite gradients updates into NaN, as onnxruntime and PyTorch do (checking would
    cost a pass over every gradient per step). It is refused before it writes anything when there is no
    gradient yet, and the step count advances only once the update has run.
    """

    def __init__(self, optimizer_uri, module: Module):
        self._module, store = module, module._store
        self._store = store
        graph = _load(optimizer_uri)
        names = [v.name for v in graph.inputs]
        moments = [n for n in MOMENT_INPUTS if n in names]
        budget.check(store.nbytes() + max(0, len(moments) - len(store.moments)) * store.params.nbytes,
                     module.max_memory, "the state with the optimizer's moments")
        store.ensure_moments(len(moments))
        self.initial_learning_rate = DEFAULT_LEARNING_RATE
        self._restore(module._state._checkpoint, len(moments))
        self._lr = np.array([self.initial_learning_rate], np.float32)
        self._step = np.zeros(1, np.int64)
        flat = TensorType(store.dtype, (store.size,))
        arrays = {"learning_rate": self._lr, "step": self._step, "params": store.params,
                  "gradients": store.grad_slots[0]}
        arrays |= {n: store.moments[k] for k, n in enumerate(moments)}
        unknown = [n for n in names if n not in arrays]
        if unknown:
            raise EdgetrainError(f"optimizer model inputs {unknown} are not ones edgetrain binds "
                                 "(learning_rate, step, params, gradients, first/second_order_moments)")
        types = {n: (flat if n in ("params", "gradients") + MOMENT_INPUTS else TensorType(a.dtype, a.shape))
                 for n, a in arrays.items() if n in names}
        external = {n: arrays[n] for n in names}
        plan = make_plan(graph, types, [v.name for v in graph.outputs], external=external,
                         max_memory=module.max_memory)
        first = Program(plan, external)
        self._programs = (first, Program(plan, external | ({"gradients": store.grad_slots[1]} if "gradients" in
                                                           external else {}), first.arena))
        module._state._optimizer = self

    @property
    def program(self) -> Program:
        """The program the next ``step()`` runs: the one reading the committed gradients."""
        return self._programs[self._store.slot]

    def programs(self) -> tuple[Program, Program]:
        """Both programs, one per gradient slot of the state (an edgetrain extension, for profiling)."""
        return self._programs

    def _restore(self, ckpt: ckpt_io.Checkpoint, moments: int) -> None:
        if not ckpt.optimizer_groups:
            return
        group = ckpt.optimizer_groups[0]
        self._store.step = int(group.step)
        if group.initial_learning_rate:
            self.initial_learning_rate = float(group.initial_learning_rate)
        for name in self._store.names:
            saved = group.states.get(name, {})
            for k in range(moments):
                m = saved.get(ckpt_io.MOMENTUM_NAMES[k])
                if m is not None:
                    np.copyto(self._store.moment(k, name), m.reshape(self._store.shapes[name]))

    def step(self) -> None:
        """One update from the accumulated gradients."""
        if self._module._state._nominal:
            raise NominalStateError("The optimizer state cannot be constructed. Please load the model parameters "
                                    "first. (copy_buffer_to_parameters(buffer, trainable_only=False))")
        if not self._store.has_gradients:
            raise EdgetrainError("Optimizer.step() before any gradient: run a training step (module(inputs...)) "
                                 "first")
        self._step[0] = self._store.step + 1
        self.program.run([])
        self._store.step += 1

    def set_learning_rate(self, learning_rate: float) -> None:
        self._lr[0] = learning_rate

    def get_learning_rate(self) -> float:
        return float(self._lr[0])


class LinearLRScheduler:
    """Linear warmup then linear decay, onnxruntime's documented formula on the optimizer's step count:
    lr = initial_lr * (step / max(1, warmup) if step < warmup else max(0, (total - step) / max(1, total - warmup)))
    (ORT 1.19.2's Python gives another sequence; this follows its C++ formula and documentation)."""

    def __init__(self, optimizer: Optimizer, warmup_step_count: int, total_step_count: int, initial_lr: float):
        if warmup_step_count < 0 or total_step_count < warmup_step_count:
            raise InputError(f"need 0 <= warmup_step_count <= total_step_count, got {warmup_step_count}, "
                             f"{total_step_count}")
        self._optimizer, self._warmup, self._total = optimizer, int(warmup_step_count), int(total_step_count)
        self.initial_lr = float(initial_lr)
        optimizer.initial_learning_rate = self.initial_lr
        self._apply()

    def _apply(self) -> None:
        step = self._optimizer._store.step
        if step < self._warmup:
            factor = step / max(1, self._warmup)
        else:
            factor = max(0.0, (self._total - step) / max(1, self._total - self._warmup))
        self._optimizer.set_learning_rate(self.initial_lr * factor)

    def step(self) -> None:
        self._apply()
