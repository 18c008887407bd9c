"""A Program: one plan bound to one arena, its kernels and a flat list of calls.

Binding happens once, when the program is made for its input shapes: every call becomes ``(fn, args)`` with
its arena views already made (a launcher that offers ``bind``, ``kernels.bindable``, also reshapes and decides
what the shapes fix there). ``run`` copies the feeds into their arena slots and then is one flat loop of calls;
it allocates nothing. Outputs are views into the arena (or constants), valid until the next run. Once a run
has compiled every kernel, each jitted call is replaced by the code its fixed arguments select
(``kernels.direct``), so later runs skip Numba's type dispatch.
"""
from __future__ import annotations

import importlib
import math
import weakref

import numpy as np

from .. import codegen
from ..codegen import parallel_compile
from ..errors import InputError
from .. import parallel
from ..plan import Plan
from ..blas import limit_blas_threads

_UNRUN: weakref.WeakSet = weakref.WeakSet()     # programs made that have not run yet (their kernels compile
                                                # ahead with the first program that runs: parallel_compile)
SPLIT_ELEMENTS = 1 << 20    # fused loops this large (~0.5 ms) run in blocks on the intra-op threads: a hand-off
                            # there passes the GIL and wakes a thread (0.1-0.2 ms on these VMs; gpt's 1<<18-element
                            # Add+Gelu ran 0.79 ms at 1 thread, 1.29 split)


def aligned_empty(nbytes: int, align: int = 64) -> np.ndarray:
    raw = np.empty(nbytes + align, np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start:start + nbytes]


def launcher(kernel: str):
    family, name = kernel.split(".")
    return getattr(importlib.import_module(f"edgetrain.kernels.{family}"), name)


def _bind_external(plan: Plan, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    missing = sorted(plan.external - set(arrays))
    extra = sorted(set(arrays) - plan.external)
    if missing or extra:
        raise InputError(f"external arrays: missing {missing}, unexpected {extra}")
    for name, a in arrays.items():
        t = plan.spec.types[name]
        if not isinstance(a, np.ndarray) or a.dtype != t.dtype or a.shape != t.shape or not a.flags.c_contiguous:
            got = f"{a.dtype}{list(a.shape)}" if isinstance(a, np.ndarray) else type(a).__name__
            raise InputError(f"external array '{name}' must be a C-contiguous {t}, got {got}")
    return dict(arrays)


def _kernel_ready(c: np.ndarray) -> np.ndarray:
    """C-contiguous and writeable (Numba types read-only arrays apart: one more compile per kernel); 0-d kept."""
    c = np.asarray(c)
    return c if c.flags.c_contiguous and c.flags.writeable else np.array(c, order="C")


class Program:
    """``external`` binds the plan's external inputs to persistent arrays (C-contiguous, of the planned type);
    kernels read them and in-place ops write them directly. Update them in place, never rebind.
    ``arena``: a 64-byte aligned uint8 buffer to run in, shared with programs that never run at the same time
    (a module's train and eval programs, one per input shape); default: its own."""

    def __init__(self, plan: Plan, external: dict[str, np.ndarray] | None = None, arena: np.ndarray | None = None):
        limit_blas_threads(1)     # threads split large GEMMs instead (kernels/_gemm_threads.py)
        self.plan = plan
        spec, mem = plan.spec, plan.memory
        if arena is not None and (arena.nbytes < plan.arena_bytes or arena.ctypes.data % 64):
            raise ValueError(f"shared arena of {arena.nbytes} bytes cannot hold a plan of {plan.arena_bytes}")
        self.arena = aligned_empty(plan.arena_bytes) if arena is None else arena
        self.values: dict[str, np.ndarray] = {name: _kernel_ready(c) for name, c in spec.consts.items()}
        self.values.update(_bind_external(plan, external or {}))
        for name, b in mem.value_buffer.items():
            self.values[name] = self._view(mem.buffers[b].offset, spec.types[name])
        for step in plan.steps:        # views of constants and external arrays
            if step.kind == "alias" and step.outputs[0] not in self.values:
                self.values[step.outputs[0]] = self.values[step.inputs[0]].reshape(spec.types[step.outputs[0]].shape)
        self.calls: list[tuple] = []
        for s, step in enumerate(plan.steps):
            if step.kind == "alias":
                continue
            if step.kind == "fused":
                k = codegen.generate(step, spec, self._aliases(step))
                fn = codegen.load(k.source)
                args = [self.values[i].reshape(v) for i, v in zip(k.inputs, k.input_shapes)]
                args += [self.values[o].reshape(k.output_shape) for o in step.outputs]
                fn, args = self._split_fused(fn, args, k)
            else:
                b = step.nodes[0]
                fn = launcher(step.kernel or b.op.kernel)(b.ctx)     # step.kernel: the op with an epilogue
                ws = [self._view(mem.buffers[w].offset, t) for w, t in zip(
                    mem.workspaces.get(s, []), b.op.workspace(b.ctx) if b.op.workspace else [])]
                args = [self.values[i] if i else None for i in step.inputs]
                args += [self.values[o] if o else None for o in step.outputs] + ws
                bind = getattr(fn, "bind", None)     # kernels.bindable: views and static choices made once
                if bind is not None:
                    fn, args = bind(*args)
            self.calls.append((fn, tuple(args)))
        self.input_slots = [self.values[name] for name in plan.fed_inputs]
        self._slot_dtypes = [slot.dtype for slot in self.input_slots]
        # outputs declared float16 are computed in float32 (plan/widen.py): rounded into their own array per run
        self.outputs = [np.empty(spec.types[name].shape, spec.declared[name]) if name in spec.declared
                        else self.values[name] for name in spec.output_names]
        self._narrowed = [(out, self.values[name]) for out, name in zip(self.outputs, spec.output_names)
                          if name in spec.declared]
        self._direct = False
        _UNRUN.add(self)

    def _aliases(self, step) -> dict[str, str]:
        """Inputs of a fused step stored where one of its outputs is (the planner's in-place reuse, or an
        external array updated in place): input -> output, each element at the same address in both."""
        size = math.prod(step.shape)
        at = {(a.ctypes.data, a.dtype): o for o in step.outputs if o for a in (self.values[o],)}
        found = {}
        for i in step.inputs:
            a = self.values.get(i) if i else None
            if a is not None and a.size == size and a.flags.c_contiguous and (a.ctypes.data, a.dtype) in at:
                found[i] = at[(a.ctypes.data, a.dtype)]
        return found

    def _split_fused(self, fn, args: list, k):
        """With intra-op threads, a large fused loop runs as one call per slice of its outermost dim (inputs
        broadcast along it are passed whole)."""
        n0, size = k.output_shape[0], math.prod(k.output_shape)
        if parallel.slots() < 2 or n0 < 2 or size < SPLIT_ELEMENTS:
            return fn, args
        sliced = [a.shape[0] == n0 for a in args]

        def work(_slot, lo, hi):
            fn(*[a[lo:hi] if cut else a for a, cut in zip(args, sliced)])
        rows = max(1, SPLIT_ELEMENTS // max(1, size // n0) // 2)

        def run():
            parallel.split(n0, work, rows)
        run.kernel_calls = ((fn, tuple(args)),)      # a slice's types are the whole array's
        return run, ()

    def _view(self, offset: int, t) -> np.ndarray:
        return self.arena[offset:offset + t.nbytes].view(t.dtype).reshape(t.shape)

    def _go_direct(self) -> None:
        from ..kernels import direct     # the kernels package configures Numba: imported where kernels run

        self.calls = [(direct(fn, args), args) for fn, args in self.calls]
        self._direct = True

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """``inputs``: one array per ``plan.fed_inputs``; returns views valid until the next run."""
        for slot, dtype, x in zip(self.input_slots, self._slot_dtypes, inputs):
            if x.dtype is dtype:
                slot[...] = x           # nothing to cast: half of np.copyto's cost on a small feed
            else:
                np.copyto(slot, x)
        if not self._direct:
            _UNRUN.discard(self)
            parallel_compile.compile_ahead(self.calls + [c for p in list(_UNRUN) for c in p.calls])
        for fn, args in self.calls:
            fn(*args)
        if not self._direct:
            self._go_direct()
        for out, wide in self._narrowed:
            np.copyto(out, wide, casting="unsafe")
        return self.outputs
