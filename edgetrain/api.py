"""``edgetrain.api``: onnxruntime.training.api's on-device training surface (CheckpointState, Module, ...).

Semantics follow ORT 1.19 (ORT_FORMATS.md §2) where ORT is right, and raise clear errors where ORT crashes.
"""
from __future__ import annotations

import os
import sys

import numpy as np

from . import budget
from . import checkpoint as ckpt_io
from .errors import EdgetrainError, InputError, NominalStateError
from .ir import Graph, TensorType
from .ortvalue import OrtValue, as_array
from .runtime import Program
from .runtime.export import export as export_inference_model
from .runtime.state import StateStore
from .runtime.training import ModelIO, TrainingProgram

NOMINAL_ASSIGN = "Cannot copy parameter to a nominal state. Please load all the parameter states first."


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


def _release_file_arrays(ckpt: ckpt_io.Checkpoint, store: StateStore, moments: bool = False) -> None:
    """Point the checkpoint's arrays at the store's copies (or copies of their own) once the store holds them.

    The loaded arrays are views into the file's bytes: one kept alive keeps the whole file in memory next to
    the store (for resnet18, 45 MB until the process ends). Only names and the store's values are read after
    binding (``CheckpointState._array``), so nothing observable changes. Saved optimizer moments are let go
    (``moments``) once an Optimizer has restored them into the store."""
    if ckpt.is_nominal:           # its arrays are empty placeholders, not views of the file
        return

    def own(a: np.ndarray) -> np.ndarray:
        return a if a.base is None else np.array(a)
    for name, a in ckpt.trainable.items():
        ckpt.trainable[name] = store.param(name) if name in store.offsets else own(a)
    for name, a in ckpt.frozen.items():
        ckpt.frozen[name] = store.frozen[name] if name in store.frozen else own(a)
    for group in ckpt.optimizer_groups if moments else ():
        for name, saved in group.states.items():
            for k, kind in enumerate(ckpt_io.MOMENTUM_NAMES):
                if kind in saved:
                    restored = k < len(store.moments) and name in store.offsets
                    saved[kind] = store.moment(k, name) if restored else own(saved[kind])


def _load(uri) -> Graph:
    """An ONNX or compact (.etm) model, told apart by content; onnx is imported only for ONNX files."""
    from .compact import load_graph
    return load_graph(uri)


def _plain_arrays(io: ModelIO, user_inputs) -> tuple[np.ndarray, ...]:
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


_TRAINED_FROM: dict[str, list] = {}   # artifact folder this process trained from -> its modules' FedShapes


def _note_for_warm_set(train_model_uri, optimizer_uri, fed) -> None:
    """Training and optimizer models read from one folder: if this process runs kernels under the JIT, the
    warm kernel set of that folder is built when it exits (``kernels/_autowarm.py``), with the input shapes
    ``fed`` (the module's ``FedShapes``) holds by then."""
    if not all(isinstance(u, (str, os.PathLike)) for u in (train_model_uri, optimizer_uri)):
        return
    folder = os.path.dirname(os.path.realpath(train_model_uri))
    if folder != os.path.dirname(os.path.realpath(optimizer_uri)):
        return
    if not _TRAINED_FROM:
        import atexit

        atexit.register(_build_warm_set)
    records = _TRAINED_FROM.setdefault(folder, [])
    if not any(r is fed for r in records):
        records.append(fed)


def _fed_shapes(records) -> dict[str, list[dict]]:
    """The shape sets of one folder's modules, merged per model (first seen first, each once, at most
    ``FedShapes.LIMIT``)."""
    merged: dict[str, list[dict]] = {}
    for r in records:
        for model, sets in r.by_model.items():
            kept = merged.setdefault(model, [])
            kept += [s for s in sets if s not in kept][: max(0, r.LIMIT - len(kept))]
    return merged


def _build_warm_set() -> None:
    if "numba" not in sys.modules:   # the warm set served this process
        return
    try:
        from .kernels import _autowarm
    except ImportError:             # the trimmed package: no JIT to warm
        return
    _autowarm.at_exit(list(_TRAINED_FROM), {f: _fed_shapes(r) for f, r in _TRAINED_FROM.items()})


class Module:
    """A training model (and optionally its eval model) bound to a CheckpointState.

    ``module(*inputs)`` runs a training step (accumulating gradients into the state, or overwriting them after
    ``lazy_reset_grad()``) or, after ``eval()``, an eval step. Returns the loss and any additional outputs.
    A step whose loss is not finite, or that a kernel refuses, raises and leaves the state as it was.
    ``max_memory`` (bytes; default ``edgetrain.budget``'s) bounds the state store and each step's arena.
    The step itself is the runtime's (``edgetrain.runtime.training.TrainingProgram``); this is its ORT-shaped
    surface.
    """

    def __init__(self, train_model_uri, state: CheckpointState, eval_model_uri=None, device: str = "cpu",
                 session_options=None, max_memory: int | None = None):
        if device != "cpu":
            raise EdgetrainError(f"device '{device}' is not supported: edgetrain trains on the CPU")
        if state._store is not None:
            raise EdgetrainError("this CheckpointState is already bound to a Module")
        ckpt = state._checkpoint
        values = {n: None if ckpt.is_nominal else a for n, a in (ckpt.trainable | ckpt.frozen).items()}
        train = _load(train_model_uri)
        eval_graph = None if eval_model_uri is None else _load(eval_model_uri)
        self._runtime = TrainingProgram(train, values, eval_graph, max_memory)
        state._store = self._runtime.store
        _release_file_arrays(ckpt, self._runtime.store)
        self._state = state
        self._train_model_uri = train_model_uri
        self.training = True

    @property
    def max_memory(self) -> int:
        """Bytes the state, and each step's arena, may take."""
        return self._runtime.max_memory

    @max_memory.setter
    def max_memory(self, value: int | None) -> None:
        self._runtime.max_memory = budget.resolve(value)

    @property
    def training_program(self) -> TrainingProgram:
        """The runtime's training program this module adapts (an edgetrain extension: binding, steps, state)."""
        return self._runtime

    # -- modes ----------------------------------------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        self.training = mode
        return self

    def eval(self) -> Module:
        return self.train(False)

    def lazy_reset_grad(self) -> None:
        self._runtime.lazy_reset_grad()

    def input_names(self) -> list[str]:
        return list(self._runtime.io(self.training).user_inputs)

    def output_names(self) -> list[str]:
        return list(self._runtime.io(self.training).outputs)

    # -- running --------------------------------------------------------------------------------------------
    def __call__(self, *user_inputs):
        """Outputs as numpy arrays; as ``OrtValue``s (edgetrain's: arrays that answer ORT's methods) when no
        input is a numpy array, as ORT returns them then."""
        io = self._runtime.io(self.training)
        if self._state._nominal:
            step = "TrainStep" if self.training else "EvalStep"
            raise NominalStateError(f"Cannot perform {step} with a nominal state. Please load the model parameters "
                                    "first. (copy_buffer_to_parameters(buffer, trainable_only=False))")
        if len(user_inputs) != len(io.user_inputs):
            raise InputError(f"the {'training' if self.training else 'eval'} model takes {len(io.user_inputs)} "
                             f"input(s) {io.user_inputs}, got {len(user_inputs)}")
        ort_values = False   # plain arrays in (the steady path): plain arrays out
        for x in user_inputs:
            if type(x) is not np.ndarray:   # a subclass (np.memmap, OrtValue, ...) or no array: its plain view
                ort_values = not any(isinstance(a, np.ndarray) and not isinstance(a, OrtValue)
                                     for a in user_inputs)
                user_inputs = _plain_arrays(io, user_inputs)
                break
        outs, results = self._runtime.run(self.training, user_inputs)
        wrap = _as_ort_value if ort_values else np.array
        if len(results) == 1:
            return wrap(outs[results[0]])
        return [wrap(outs[k]) for k in results]

    def planned_kernels(self) -> int:
        """Kernel calls in every program this module has planned so far (one per input shape and model). An
        edgetrain extension: the command line shows compile progress against it."""
        return self._runtime.planned_kernels()

    # -- introspection: edgetrain extensions, what the profiler, command line and minimal build read ----------
    def graph(self) -> Graph:
        """The IR graph of the model the current mode runs (training or eval model); its inputs carry types."""
        return self._runtime.io(self.training).graph

    def program(self, *user_inputs) -> Program:
        """The program the current mode runs for inputs of these shapes and types (planned now if new); a
        training step runs it through the module (``module(...)``), which commits what it computes."""
        io = self._runtime.io(self.training)
        return self._runtime.planned(self.training, dict(zip(io.user_inputs, _plain_arrays(io, user_inputs))))[0]

    def programs(self) -> list[tuple[str, Program]]:
        """Every program planned so far, tagged "train" or "eval"; a training step has two, one per gradient
        slot of the state (``runtime/step.py``), and runs the other one each step."""
        return self._runtime.programs()

    @property
    def state_store(self) -> StateStore:
        """Parameters, gradients (two slots), optimizer moments and frozen arrays, each one flat array."""
        return self._runtime.store

    def fixed_batch_size(self) -> int | None:
        """The batch size the current model's inputs fix (an integer first dimension), or None when the batch
        dimension is symbolic. An edgetrain extension: a model exported with a fixed batch cannot run a last,
        smaller batch."""
        io = self._runtime.io(self.training)
        dims = {v.type.shape[0] for v in io.graph.inputs if v.name in io.user_inputs and v.type.shape}
        fixed = [d for d in dims if isinstance(d, int)]
        return fixed[0] if fixed else None

    def index_bounds(self) -> dict[str, tuple[int, int | None]]:
        """For each integer input of the current model that indexes something (labels of a loss, token ids of an
        embedding): (exclusive upper bound of its values, the loss's ignore_index or None). An edgetrain
        extension, for checking a data set before training."""
        from .plan.bounds import ignored_label, index_bound
        from .plan.specialize import specialize

        io = self._runtime.io(self.training)
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
        store = self._runtime.store
        return store.size if trainable_only else store.size + sum(a.size for a in store.frozen.values())

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
        store = self._runtime.store
        if not copy:
            if store.frozen and not trainable_only:
                raise InputError("a zero-copy view holds only the trainable parameters (the frozen ones, "
                                 f"{', '.join(sorted(store.frozen))}, are stored apart): pass "
                                 "trainable_only=True, or copy=True")
            return store.params.view(OrtValue)
        if trainable_only or not store.frozen:
            return OrtValue.ortvalue_from_numpy(store.params)
        parts = [self._runtime.param_array(p).reshape(-1) for p in self._runtime.train_io.params]
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
        store = self._runtime.store
        if trainable_only:
            np.copyto(store.params, buffer.astype(store.dtype, copy=False))
            return
        offset = 0
        for p in self._runtime.train_io.params:
            target = self._runtime.param_array(p)
            np.copyto(target, buffer[offset: offset + target.size].reshape(target.shape))
            offset += target.size

    def export_model_for_inferencing(self, inference_model_uri, graph_output_names: list[str]) -> None:
        """The eval model with the current parameters as initializers, pruned to ``graph_output_names``."""
        eval_io = self._runtime.eval_io
        if eval_io is None:
            raise EdgetrainError("export_model_for_inferencing needs the eval model: pass eval_model_uri to Module")
        params = {p: np.array(self._state._array(p)) for p in eval_io.params}
        export_inference_model(eval_io.graph, list(graph_output_names), params, inference_model_uri)


DEFAULT_LEARNING_RATE = 1e-3     # ORT's default for a fresh Optimizer


class Optimizer:
    """Runs the optimizer model over the module's state store (the runtime's ``OptimizerStep``, which owns the
    learning rate and step count).

    ``step()`` does not look at the gradients' values: the module refuses a step with a non-finite loss, but a
    finite loss with non-finite gradients updates into NaN, as onnxruntime and PyTorch do. It is refused before
    it writes anything when there is no gradient yet, and the step count advances only once the update has run.
    """

    def __init__(self, optimizer_uri, module: Module):
        self._module = module
        runtime = module.training_program
        self._runtime = runtime.attach_optimizer(_load(optimizer_uri))
        _note_for_warm_set(module._train_model_uri, optimizer_uri, runtime.fed_shapes())
        self.initial_learning_rate = DEFAULT_LEARNING_RATE
        ckpt = module._state._checkpoint
        if ckpt.optimizer_groups:
            group = ckpt.optimizer_groups[0]
            if group.initial_learning_rate:
                self.initial_learning_rate = float(group.initial_learning_rate)
            saved = {name: {k: m for k, kind in enumerate(ckpt_io.MOMENTUM_NAMES)
                            if (m := group.states.get(name, {}).get(kind)) is not None}
                     for name in runtime.store.names}
            self._runtime.restore(group.step, saved)
            _release_file_arrays(ckpt, runtime.store, moments=True)
        self._runtime.learning_rate = self.initial_learning_rate
        module._state._optimizer = self

    @property
    def program(self) -> Program:
        """The program the next ``step()`` runs: the one reading the committed gradients."""
        return self._runtime.program

    def programs(self) -> tuple[Program, Program]:
        """Both programs, one per gradient slot of the state (an edgetrain extension, for profiling)."""
        return self._runtime.by_slot

    @property
    def step_count(self) -> int:
        """Optimizer steps taken (restored from a checkpoint's optimizer state). An edgetrain extension."""
        return self._runtime.step_count

    def step(self) -> None:
        """One update from the accumulated gradients."""
        if self._module._state._nominal:
            raise NominalStateError("The optimizer state cannot be constructed. Please load the model parameters "
                                    "first. (copy_buffer_to_parameters(buffer, trainable_only=False))")
        self._runtime.run()

    def set_learning_rate(self, learning_rate: float) -> None:
        self._runtime.learning_rate = learning_rate

    def get_learning_rate(self) -> float:
        return self._runtime.learning_rate


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
        step = self._optimizer.step_count
        if step < self._warmup:
            factor = step / max(1, self._warmup)
        else:
            factor = max(0.0, (self._total - step) / max(1, self._total - self._warmup))
        self._optimizer.set_learning_rate(self.initial_lr * factor)

    def step(self) -> None:
        self._apply()
