"""Memory and time profile of a set of training artifacts: will it fit, and where does a step spend its time.

``profile_artifacts(folder, batch_size, steps)`` loads the artifacts as ``edgetrain.api`` does and reports, for
each kind of step (train, eval, optimizer):

- planned: the arena (and the naive sum of its buffers without reuse), the state it binds (parameters,
  gradient buffers, optimizer moments, frozen parameters), constants, and the tensors alive at the arena's peak;
- measured, in runs without instrumentation: the median step time, the process's RSS, USS and anonymous memory
  after each steady step (peak, and growth from the first to the last steady step; Linux's smaps_rollup, psutil
  elsewhere);
- measured with instrumentation, in separate runs: Python-heap bytes per step (tracemalloc: the net change,
  ~0 in a steady state, and the transient peak inside a step), and the time of each kernel call, made by
  iterating ``Program.calls`` directly, labelled with the step's ops and node names and summed by op;
- the kernels compiled at the step's first call, or loaded from the disk cache.

Synthetic inputs stand in for data: floats standard normal, integer inputs that index something (class labels
of a cross-entropy loss, Gather indices) uniform over the valid range, other integers zero. A ``.npz`` file
with arrays named like the model's inputs replaces them.
"""
from __future__ import annotations

import os
import resource
import sys
import time
import tracemalloc
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .errors import EdgetrainError, InputError, MemoryBudgetError
from .plan.bounds import index_bound
from .reading import open_regular

KINDS = ("train", "eval", "optimizer")
WARMUP = 3            # cycles before measuring: compiles, first touch of arena pages
# numpy keeps a few dozen small blocks in internal caches that fill during the first traced calls
# (e.g. ~35 x 52 B for ``np.isfinite(x).all()`` on a 0-d array); settle them before counting
TRACE_SETTLE = 50


@dataclass
class KernelTime:
    index: int           # position in the program's calls
    label: str           # the step's kind and ops, e.g. "fused:Add+Relu"
    nodes: list[str]     # names of the nodes the call runs
    ms: float            # median over the timed runs


@dataclass
class StepReport:
    kind: str                        # "train" | "eval" | "optimizer"
    model: str
    arena_bytes: int                 # planned arena (allocated once per program)
    naive_bytes: int                 # every buffer its own bytes: what the arena would be without reuse
    constants_bytes: int
    state: dict[str, int]            # bytes of the state this step binds, by kind
    kernels: int
    ops: int
    peak_step: int                   # step index where the most arena bytes are alive
    peak_live_bytes: int
    peak_tensors: list[dict]         # largest tensors alive there: name, type, bytes
    first_ms: float = 0.0            # the first call, compiles included
    compiled: int = 0                # kernel signatures compiled at the first call
    cached: int = 0                  # ... and loaded from the disk cache
    step_ms: float = 0.0             # median steady step, not instrumented
    rss_peak: int = 0
    rss_growth: int = 0              # last steady step minus first
    uss_peak: int | None = None      # None where the platform does not report USS
    uss_growth: int | None = None
    anon_peak: int | None = None     # anonymous memory (Linux): heap, arrays, arenas
    anon_growth: int | None = None
    py_bytes_per_step: float = 0.0   # net Python-heap growth of the median steady step (tracemalloc)
    py_net_bytes: int = 0            # ... of all the traced steady steps together
    py_transient_bytes: int = 0      # the most Python-heap bytes a step holds at once
    kernel_ms: float = 0.0           # sum of the per-call medians
    kernel_times: list[KernelTime] = field(default_factory=list)
    by_op: dict[str, float] = field(default_factory=dict)    # step label -> ms, largest first
    n_steps: int = 0                 # steps of the plan (kernel calls and views)
    buffers: list[dict] = field(default_factory=list)        # arena buffers: name, offset, bytes, start, end

    @property
    def state_bytes(self) -> int:
        return sum(self.state.values())


@dataclass
class Profile:
    artifacts: str
    batch_size: int
    steps: int
    inputs: dict[str, str]           # name -> type of the fed arrays
    state: dict[str, int]            # the whole state store, by kind
    planned_bytes: int               # arenas (train and eval share one) + state + constants
    rss_baseline: int                # the process before loading the artifacts
    uss_baseline: int | None
    anon_baseline: int | None
    rss_lifetime_peak: int           # the process's high-water mark at the end (compiles included)
    reports: list[StepReport]
    max_memory: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def table(self, top: int = 10) -> str:
        return format_table(self, top)


# -- inputs -----------------------------------------------------------------------------------------------------
def _load_data(data) -> dict[str, np.ndarray]:
    if data is None:
        return {}
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        try:
            with open_regular(path) as f, np.load(f, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        except FileNotFoundError:
            raise InputError(f"data file '{path}' does not exist (expected a .npz with arrays named like the "
                             "model's inputs)") from None
        except (OSError, ValueError) as e:
            raise InputError(f"cannot read data file '{path}' as an .npz file: {e}") from None
    return dict(data)


def _shape(v, batch_size: int | None, where: str) -> tuple[int, ...]:
    shape = []
    for d in v.type.shape:
        if isinstance(d, int):
            shape.append(d)
        elif batch_size is None:
            raise InputError(f"{where} input '{v.name}' is {v.type}: give a batch size (--batch-size) for its "
                             f"symbolic dimension '{d}'")
        else:
            shape.append(batch_size)
    return tuple(shape)


def _from_data(v, array: np.ndarray, batch_size: int | None, where: str) -> np.ndarray:
    array = np.asarray(array)
    want = v.type.dtype
    if array.dtype.kind != want.kind and not (array.dtype.kind in "iu" and want.kind in "iu"):
        raise InputError(f"data '{v.name}' is {array.dtype}, the {where} input is {v.type}")
    if batch_size is not None and array.ndim and array.shape[0] > batch_size:
        array = array[:batch_size]
    return np.ascontiguousarray(array.astype(want, copy=False))


def _feeds(module, training: bool, batch_size, rng, data, known: dict[str, np.ndarray], where: str):
    """Inputs for the training or eval model (arrays already made for the other are reused by name) and its
    program.

    Integer inputs start as zeros (valid for any index) so the model can be planned; the plan's static types
    then give each one's valid range."""
    module.train(training)
    names, graph = module.input_names(), module.graph()
    feeds, synthetic_ints = {}, []
    for name in names:
        v = next(x for x in graph.inputs if x.name == name)
        if name in known:
            feeds[name] = known[name]
        elif name in data:
            feeds[name] = _from_data(v, data[name], batch_size, where)
        elif v.type.dtype.kind in "iub":
            feeds[name] = np.zeros(_shape(v, batch_size, where), v.type.dtype)
            synthetic_ints.append(name)
        else:
            feeds[name] = rng.standard_normal(_shape(v, batch_size, where)).astype(v.type.dtype)
    prog = module.program(*(feeds[n] for n in names))
    module.train()
    for name in synthetic_ints:
        bound = index_bound(graph, prog.plan.spec.types, name)
        if bound and feeds[name].dtype.kind in "iu":
            feeds[name] = rng.integers(0, bound, feeds[name].shape).astype(feeds[name].dtype)
    known.update(feeds)
    return [feeds[n] for n in names], prog


def _batch_of(inputs: list[np.ndarray]) -> int:
    return int(inputs[0].shape[0]) if inputs and inputs[0].ndim else 1


# -- memory figures -------------------------------------------------------------------------------------------
class _Memory:
    """(RSS, USS, anonymous) bytes of this process. USS (private pages) moves when other processes map or
    unmap the same library pages; anonymous memory (heap, arrays, arenas) is what a leak grows."""
    ROLLUP = "/proc/self/smaps_rollup"     # Linux >= 4.14: the kernel sums smaps in ~0.2 ms

    def __init__(self):
        self.rollup = os.path.exists(self.ROLLUP)
        self.has_uss = True

    def sample(self) -> tuple[int, int | None, int | None]:
        if self.rollup:
            fields = {}
            with open(self.ROLLUP) as f:
                for line in f:
                    key, _, rest = line.partition(":")
                    if rest.strip().endswith("kB"):
                        fields[key] = int(rest.split()[0]) * 1024
            return (fields["Rss"], fields["Private_Clean"] + fields["Private_Dirty"], fields.get("Anonymous"))
        import psutil
        proc = psutil.Process()
        if self.has_uss:
            try:
                full = proc.memory_full_info()
                return int(full.rss), int(full.uss), None
            except (psutil.AccessDenied, NotImplementedError, OSError):     # not allowed here: RSS only
                self.has_uss = False
        return int(proc.memory_info().rss), None, None


def _lifetime_peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) * (1 if sys.platform == "darwin" else 1024)    # bytes on macOS, KiB on Linux


# -- the profile ----------------------------------------------------------------------------------------------
def _state_bound(kind: str, plan, store, moments: list[str]) -> dict[str, int]:
    """Bytes of the state store that a step's program binds, by kind."""
    from .runtime.training import BUFFER
    out = {"parameters": 0, "gradients": 0, "moments": 0, "frozen": 0}
    if kind == "optimizer":
        names = plan.external
        out["parameters"] = store.params.nbytes if "params" in names else 0
        out["gradients"] = store.grads.nbytes if "gradients" in names else 0
        out["moments"] = sum(store.moments[k].nbytes for k, n in enumerate(moments) if n in names)
        return out
    for name in plan.external:
        if name.endswith(BUFFER):
            out["gradients"] += store.grad(name[: -len(BUFFER)]).nbytes
        elif name in store.offsets:
            out["parameters"] += store.param(name).nbytes
        elif name in store.frozen:
            out["frozen"] += store.frozen[name].nbytes
    return out


def _step_report(kind: str, model: str, prog, store, moments, plan=None, state=None) -> StepReport:
    """``plan`` and ``state``: a plan without a program, or bytes bound from outside a state store."""
    from .plan import peak_tensors
    plan = plan or prog.plan
    step, live, rows = peak_tensors(plan)
    consts = sum(np.asarray(c).nbytes for c in plan.spec.consts.values())
    buffers = [{"name": b.name, "offset": b.offset, "bytes": b.nbytes, "start": b.start, "end": b.end}
               for b in plan.memory.buffers if b.offset >= 0]
    state = state if state is not None else _state_bound(kind, plan, store, moments)
    return StepReport(kind, model, plan.arena_bytes, plan.naive_bytes, consts, state, plan.n_kernels, plan.n_ops,
                      step, live,
                      [{"name": n, "type": t, "bytes": b} for n, t, b in rows], n_steps=len(plan.steps),
                      buffers=buffers)


def _store_state(store) -> dict[str, int]:
    # gradients: both slots (a training step writes the spare one and commits by swapping: runtime/step.py)
    return {"parameters": store.params.nbytes, "gradients": sum(g.nbytes for g in store.grad_slots),
            "moments": sum(m.nbytes for m in store.moments),
            "frozen": sum(a.nbytes for a in store.frozen.values())}


def _time_kernels(prog, inputs: list[np.ndarray], runs: int, before_run=None) -> tuple[list[KernelTime], dict]:
    """Time each call of ``prog`` alone (the feeds copied in once); medians over ``runs``."""
    steps = [s for s in prog.plan.steps if s.kind != "alias"]
    if len(steps) != len(prog.calls):
        raise EdgetrainError(f"program has {len(prog.calls)} calls for {len(steps)} planned steps")
    for slot, x in zip(prog.input_slots, inputs):
        np.copyto(slot, x)
    clock = time.perf_counter_ns
    times = np.zeros((runs, len(prog.calls)))
    for r in range(runs):
        if before_run is not None:
            before_run()
        for j, (fn, args) in enumerate(prog.calls):
            t0 = clock()
            fn(*args)
            times[r, j] = clock() - t0
    ms = np.median(times, axis=0) / 1e6
    kernels = [KernelTime(j, s.label, [b.node.name or b.node.op_type for b in s.nodes], float(ms[j]))
               for j, s in enumerate(steps)]
    by_op: dict[str, float] = {}
    for k in kernels:
        by_op[k.label] = by_op.get(k.label, 0.0) + k.ms
    return kernels, dict(sorted(by_op.items(), key=lambda kv: -kv[1]))


def _measure_memory(order, run, after, reports, memory, steps: int) -> None:
    """RSS and USS after each of ``steps`` steps of each kind (reading smaps evicts the step's data from the
    caches, so not in the timed runs), then Python-heap bytes per step. Results go to arrays made beforehand, so
    the bookkeeping allocates nothing that would show up as growth."""
    samples = np.full((len(order), steps, 3), -1, np.int64)     # RSS, USS, anonymous; -1: not reported
    for i in range(steps):
        for k, kind in enumerate(order):
            run[kind]()
            if after.get(kind):
                after[kind]()
            samples[k, i] = [-1 if v is None else v for v in memory.sample()]
    for k, kind in enumerate(order):
        r = reports[kind]
        rss, uss, anon = (samples[k, :, c] for c in range(3))
        r.rss_peak, r.rss_growth = int(rss.max()), int(rss[-1] - rss[0])
        if (uss >= 0).all():
            r.uss_peak, r.uss_growth = int(uss.max()), int(uss[-1] - uss[0])
        if (anon >= 0).all():
            r.anon_peak, r.anon_growth = int(anon.max()), int(anon[-1] - anon[0])

    # tracemalloc slows everything: its own runs
    nets = np.zeros((len(order), steps), np.int64)
    peaks = np.zeros((len(order), steps), np.int64)
    tracemalloc.start()
    try:
        for _ in range(TRACE_SETTLE):
            for kind in order:
                run[kind]()
                if after.get(kind):
                    after[kind]()
        for i in range(steps):
            for k, kind in enumerate(order):
                held = tracemalloc.get_traced_memory()[0]
                tracemalloc.reset_peak()
                run[kind]()
                current, peak = tracemalloc.get_traced_memory()
                nets[k, i], peaks[k, i] = current - held, peak - held
                if after.get(kind):
                    after[kind]()
    finally:
        tracemalloc.stop()
    for k, kind in enumerate(order):
        r = reports[kind]
        r.py_bytes_per_step, r.py_net_bytes = float(np.median(nets[k])), int(nets[k].sum())
        r.py_transient_bytes = int(peaks[k].max())


def profile_artifacts(folder, batch_size: int | None = None, steps: int = 20, data=None,
                      max_memory: int | None = None, seed: int = 0, *, measure_memory: bool = True) -> Profile:
    """Profile the training artifacts in ``folder`` (training_model.onnx and checkpoint; eval_model.onnx and
    optimizer_model.onnx when present) at ``batch_size`` over ``steps`` steady steps of each kind.

    ``data``: a ``.npz`` path (or a dict) of arrays named like the model's inputs, used instead of synthetic
    inputs. ``max_memory`` (bytes; default: ``edgetrain.budget``'s) bounds each step's planned arena and the
    planned total (arenas, state and constants); planning fails before anything runs, with a
    ``MemoryBudgetError`` that says what is needed. ``measure_memory=False`` skips the RSS and Python-heap runs
    (their fields stay zero): step times and the per-kernel breakdown only, for models whose steps take seconds.
    """
    from . import budget
    from .api import CheckpointState, Module, Optimizer
    from .kernels import _jit
    from .runtime.training import MOMENT_INPUTS

    folder = Path(folder)
    max_memory = budget.resolve(max_memory)
    for required in ("training_model.onnx", "checkpoint"):
        if not (folder / required).is_file():
            raise InputError(f"'{folder}' holds no {required}: expected the artifacts of generate_artifacts "
                             "(training_model.onnx, eval_model.onnx, optimizer_model.onnx, checkpoint)")
    if steps < 2:
        raise InputError(f"steps must be at least 2 to see growth across steady steps, got {steps}")
    eval_path, opt_path = folder / "eval_model.onnx", folder / "optimizer_model.onnx"
    memory = _Memory()
    rss_baseline, uss_baseline, anon_baseline = memory.sample()
    rng = np.random.default_rng(seed)
    data = _load_data(data)

    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state, eval_path if eval_path.is_file() else None,
                    max_memory=max_memory)
    with _naming(opt_path):
        optimizer = Optimizer(opt_path, module) if opt_path.is_file() else None
    store = module.state_store
    has_eval = eval_path.is_file()
    inputs_known = set(module.input_names()) | set(module.eval().input_names() if has_eval else ())
    module.train()
    unexpected = sorted(set(data) - inputs_known)
    if unexpected:
        raise InputError(f"data arrays {unexpected} are not inputs of the models (inputs: {sorted(inputs_known)})")
    known: dict[str, np.ndarray] = {}
    with _naming(folder / "training_model.onnx"):
        train_inputs, train_prog = _feeds(module, True, batch_size, rng, data, known, "training model")
    batch = _batch_of(train_inputs)
    if batch_size is not None and batch != batch_size:
        raise InputError(f"the training model fixes the batch at {batch} (inputs: "
                         + ", ".join(f"'{v.name}' {v.type}" for v in module.graph().inputs
                                     if v.name in module.input_names())
                         + f"), not {batch_size}: profile at --batch-size {batch}, or make the artifacts from a "
                         "model with a symbolic batch dimension")
    programs = {"train": (train_prog, train_inputs)}
    if has_eval:
        with _naming(eval_path):
            eval_inputs, eval_prog = _feeds(module, False, batch, rng, data, known, "eval model")
        programs["eval"] = (eval_prog, eval_inputs)
    moments = []
    if optimizer is not None:
        programs["optimizer"] = (optimizer.program, [])
        moments = [n for n in MOMENT_INPUTS if n in optimizer.program.plan.external]
    model_names = {"train": "training_model.onnx", "eval": "eval_model.onnx", "optimizer": "optimizer_model.onnx"}
    reports = {k: _step_report(k, model_names[k], p, store, moments) for k, (p, _) in programs.items()}
    whole_state = _store_state(store)
    # the train and eval programs share the module's arena (the larger of the two); the optimizer has its own
    shared = max((r.arena_bytes for k, r in reports.items() if k != "optimizer"), default=0)
    planned = (shared + sum(r.arena_bytes for k, r in reports.items() if k == "optimizer")
               + sum(r.constants_bytes for r in reports.values()) + sum(whole_state.values()))
    if max_memory is not None and planned > max_memory:
        raise MemoryBudgetError(_over_total(folder, planned, max_memory, reports, whole_state))

    def train_step():
        module(*train_inputs)

    def eval_step():
        module.eval()
        try:
            module(*programs["eval"][1])
        finally:
            module.train()

    run = {"train": train_step, "eval": eval_step, "optimizer": optimizer.step if optimizer else None}
    after = {"train": module.lazy_reset_grad if optimizer is None else None,
             "optimizer": module.lazy_reset_grad}
    order = [k for k in KINDS if k in programs]

    # 1. warm-up: the first call of each kind compiles (or loads) its kernels
    for cycle in range(WARMUP):
        for kind in order:
            before = _jit.compile_stats()
            t0 = time.perf_counter()
            run[kind]()
            if cycle == 0:
                r, stats = reports[kind], _jit.compile_stats()
                r.first_ms = (time.perf_counter() - t0) * 1e3
                r.compiled, r.cached = stats["misses"] - before["misses"], stats["hits"] - before["hits"]
            if after.get(kind):
                after[kind]()

    # 2. un-instrumented steady steps: the time of each step; then (``measure_memory``) RSS, USS and Python-heap runs
    times = np.zeros((len(order), steps))
    clock = time.perf_counter
    for i in range(steps):
        for k, kind in enumerate(order):
            t0 = clock()
            run[kind]()
            times[k, i] = clock() - t0
            if after.get(kind):
                after[kind]()
    for k, kind in enumerate(order):
        reports[kind].step_ms = float(np.median(times[k])) * 1e3
    if measure_memory:
        _measure_memory(order, run, after, reports, memory, steps)

    # 4. each kernel call timed alone, iterating the program's calls
    for kind in order:
        prog, inputs = programs[kind]
        r = reports[kind]
        r.kernel_times, r.by_op = _time_kernels(prog, inputs, steps,
                                                module.lazy_reset_grad if kind == "train" else None)
        r.kernel_ms = float(sum(k.ms for k in r.kernel_times))

    inputs = {}
    for kind in ("train", "eval"):
        if kind in programs:
            names = module.train(kind == "train").input_names()
            inputs |= {n: f"{_type_name(a)}" for n, a in zip(names, programs[kind][1])}
    module.train()
    return Profile(str(folder), batch, steps, inputs, whole_state, planned, rss_baseline, uss_baseline,
                   anon_baseline, _lifetime_peak_rss(), [reports[k] for k in order], max_memory)


@contextmanager
def _naming(path: Path):
    """Say which model file a memory budget error comes from (the planner knows only the graph's name)."""
    try:
        yield
    except MemoryBudgetError as e:
        raise MemoryBudgetError(f"{path.name}: {e}") from None


def _type_name(a: np.ndarray) -> str:
    from .ir import TensorType
    return str(TensorType(a.dtype, a.shape))


def _over_total(folder, planned, max_memory, reports, state) -> str:
    parts = ", ".join(f"{k} arena {_size(r.arena_bytes)}" for k, r in reports.items())
    biggest = max(reports.values(), key=lambda r: r.arena_bytes)
    tensors = ", ".join(f"'{t['name']}' {t['type']} {_size(t['bytes'])}" for t in biggest.peak_tensors)
    state_parts = ", ".join(f"{k} {_size(v)}" for k, v in state.items() if v)
    return (f"the artifacts in '{folder}' need {planned} bytes ({_size(planned)}) planned, over the budget of "
            f"{max_memory} bytes ({_size(max_memory)}): {parts}; state {state_parts}; constants "
            f"{_size(sum(r.constants_bytes for r in reports.values()))}. Largest tensors at the {biggest.kind} "
            f"step's peak: {tensors}")


# -- text -------------------------------------------------------------------------------------------------------
def _size(n: float | None, signed: bool = False) -> str:
    if n is None:
        return "-"
    sign = ("+" if n > 0 else "-" if n < 0 else "") if signed else ("-" if n < 0 else "")
    a = abs(n)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if a >= scale:
            return f"{sign}{a / scale:.2f} {unit}"
    return f"{sign}{a:.0f} B"


def format_table(p: Profile, top: int = 10) -> str:
    lines = [f"edgetrain profile: {p.artifacts} (batch {p.batch_size}, {p.steps} steady steps of each kind)",
             "inputs: " + ", ".join(f"{n} {t}" for n, t in p.inputs.items()),
             "state store: " + ", ".join(f"{k} {_size(v)}" for k, v in p.state.items())
             + f" (total {_size(sum(p.state.values()))})",
             f"planned: {_size(p.planned_bytes)} = arenas (train and eval share the larger) + state "
             f"{_size(sum(p.state.values()))} + constants {_size(sum(r.constants_bytes for r in p.reports))}"
             + (f" (budget {_size(p.max_memory)})" if p.max_memory is not None else ""),
             (f"process before loading: RSS {_size(p.rss_baseline)}, USS {_size(p.uss_baseline)}, anonymous "
              f"{_size(p.anon_baseline)}; lifetime peak RSS {_size(p.rss_lifetime_peak)}"),
             ("(RSS, USS, anon: after each steady step; grow: last minus first; py: tracemalloc, net per step "
              "and the most held within a step)"), ""]
    head = ("step", "arena", "naive", "state", "kernels", "first ms", "step ms", "kern ms", "RSS peak",
            "RSS grow", "USS peak", "USS grow", "anon grow", "py B/step", "py peak", "compiled/cached")
    rows = [head]
    for r in p.reports:
        rows.append((r.kind, _size(r.arena_bytes), _size(r.naive_bytes), _size(r.state_bytes), str(r.kernels),
                     f"{r.first_ms:.1f}", f"{r.step_ms:.3f}", f"{r.kernel_ms:.3f}", _size(r.rss_peak),
                     _size(r.rss_growth, True), _size(r.uss_peak), _size(r.uss_growth, True),
                     _size(r.anon_growth, True),
                     f"{r.py_bytes_per_step:.0f}", _size(r.py_transient_bytes), f"{r.compiled}/{r.cached}"))
    widths = [max(len(row[c]) for row in rows) for c in range(len(head))]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) if c == 0 else cell.rjust(w) for c, (cell, w) in
                               enumerate(zip(row, widths))).rstrip())
    for r in p.reports:
        lines.append("")
        tensors = ", ".join(f"'{t['name']}' {t['type']} {_size(t['bytes'])}" for t in r.peak_tensors)
        lines.append(f"{r.kind}: arena peak at step {r.peak_step}, {_size(r.peak_live_bytes)} alive: {tensors}")
        other = r.step_ms - r.kernel_ms
        lines.append(f"{r.kind}: {r.kernel_ms:.3f} ms in {r.kernels} kernel calls timed alone, {other:.3f} ms else "
                     f"(dispatch, feeds, copies, caches cooled by the other steps) of {r.step_ms:.3f} ms per step; "
                     f"top {min(top, len(r.kernel_times))}:")
        total = r.kernel_ms or 1.0
        for k in sorted(r.kernel_times, key=lambda k: -k.ms)[:top]:
            nodes = ", ".join(k.nodes[:2]) + (f" +{len(k.nodes) - 2}" if len(k.nodes) > 2 else "")
            lines.append(f"  {k.ms:8.3f} ms {100 * k.ms / total:5.1f}%  #{k.index:<4d} {k.label:34s} {nodes}")
        lines.append("  by op: " + ", ".join(f"{label} {ms:.3f} ms ({100 * ms / total:.0f}%)"
                                             for label, ms in list(r.by_op.items())[:top]))
    return "\n".join(lines)


def profile_forward_backward(fb, inputs, steps: int = 20, contexts: int = 1) -> dict:
    """Profile a ``ForwardBackward`` at the shapes of ``inputs``: ``contexts`` training forwards, then a backward
    of each (a micro-batch pipeline), ``steps`` times after one warm-up round.

    Returns {"forward": StepReport, "backward": StepReport, "contexts": contexts, "context_bytes": one context's
    saved values, "planned_bytes": both arenas + the weights + ``contexts`` context blocks + constants,
    "rss_growth": RSS after the last round minus after the first}. Each report's ``state`` names what its
    program binds besides the arena: the weights it reads, and (backward) the context blocks alive at once.
    """
    planned = fb.planned(inputs)
    weights = sum(w.nbytes for w in fb.weights.values())
    reports = {"forward": _step_report("forward", fb.graph.name, planned.forward, None, (),
                                       state={"weights": weights}),
               "backward": _step_report("backward", fb.graph.name, None, None, (), plan=planned.backward,
                                        state={"contexts": contexts * planned.context_bytes})}
    memory, times, rss = _Memory(), {"forward": [], "backward": []}, []
    outs = None
    for r in range(steps + 1):
        pending = []
        for _ in range(contexts):
            t0 = time.perf_counter()
            outs, ctx = fb.forward(inputs)
            times["forward"].append(time.perf_counter() - t0)
            pending.append(ctx)
        for ctx in pending:
            t0 = time.perf_counter()
            fb.backward(ctx, [np.ones_like(o) if o.dtype.kind == "f" else None for o in outs])
            times["backward"].append(time.perf_counter() - t0)
        if r:
            rss.append(memory.sample()[0])
    feeds = fb.planned_feeds(inputs)
    ctx_outs, ctx = fb.forward(inputs)
    grads = [np.ones_like(o) for o, n in zip(ctx_outs, fb.output_names) if n in fb.seeded_outputs]
    for kind, prog, fed in (("forward", planned.forward, feeds), ("backward", ctx.program, grads)):
        report = reports[kind]
        report.kernel_times, report.by_op = _time_kernels(prog, fed, max(1, min(steps, 20)))
        report.kernel_ms = sum(k.ms for k in report.kernel_times)
        report.step_ms = float(np.median(times[kind][contexts:])) * 1e3
        report.rss_peak = max(rss)
    ctx.release()
    consts = sum(r.constants_bytes for r in reports.values())
    return {**reports, "contexts": contexts, "context_bytes": planned.context_bytes,
            "planned_bytes": planned.forward.plan.arena_bytes + planned.backward.arena_bytes + weights
            + contexts * planned.context_bytes + consts, "rss_growth": rss[-1] - rss[0]}


__all__ = ["KernelTime", "Profile", "StepReport", "format_table", "profile_artifacts", "profile_forward_backward"]
