"""The busy-wait of the intra-op threads (``edgetrain.parallel``): a compiled loop that watches one int64 of an
array without holding the GIL, for a bounded number of rounds.

A thread that sleeps on a lock between jobs is woken by the OS: on these VMs that costs tens of microseconds
per hand-off, more than the second core gives on a 0.1-0.5 ms GEMM (the mlp at 2 threads ran slower than at 1).
A Python loop cannot spin instead: it holds the GIL the other thread needs. This loop runs nogil and reads with
an atomic (acquire) load, so the compiler cannot hoist the read out of the loop, and pauses the core between
reads (x86 ``pause``, arm64 ``yield``, LLVM's intrinsics for them), and every ``YIELD_EVERY`` reads
offers the core to other threads (``sched_yield``): on oversubscribed cores a spin that kept its core would
delay the very thread it waits for.

Registered with ``edgetrain.parallel`` when ``_jit`` loads Numba (the trimmed build has no ``_spin``): a warm
process that never loads Numba keeps the sleeping hand-off (``parallel.spin_loop()`` is None there).
"""
from __future__ import annotations

import platform
import sys

from edgetrain import parallel

# LLVM's spin-loop hints (inline asm does not assemble in Numba's object emitter): name, its constant argument
_PAUSE = {"x86_64": ("llvm.x86.sse2.pause", None), "amd64": ("llvm.x86.sse2.pause", None),
          "aarch64": ("llvm.aarch64.hint", 1), "arm64": ("llvm.aarch64.hint", 1)}


YIELD_EVERY = 16           # rounds between sched_yield calls: a spinning thread hands its core to whoever waits
                           # for it (on shared or oversubscribed cores: the caller, or the helper it waits for)

_load_acquire = _pause = _yield = None       # Numba's intrinsics, made by register


def _spin(state, i, value, equal, rounds):
    """Wait while ``(state[i] == value) == equal``, at most ``rounds`` reads; the last value read."""
    if i < 0 or i >= state.size:
        raise IndexError("spin: index outside the watched array")
    for k in range(rounds):
        v = _load_acquire(state, i)
        if (v == value) != equal:
            return v
        if k % YIELD_EVERY == YIELD_EVERY - 1:
            _yield()
        else:
            _pause()
    return _load_acquire(state, i)


def register(numba):
    """Make the intrinsics and hand the loop (compiled at its first call) to ``edgetrain.parallel``; ``_jit``
    calls this when it loads Numba. With ``NUMBA_DISABLE_JIT`` the intrinsics cannot run: the threads keep
    sleeping between jobs. The intrinsics stay in this file so that editing them invalidates Numba's cache."""
    global _load_acquire, _pause, _yield
    if numba.config.DISABLE_JIT:
        return
    from llvmlite import ir
    from numba.core import cgutils, types

    @numba.extending.intrinsic
    def _load_acquire(typingctx, arr, i):
        """``arr[i]`` of a C-contiguous int64 array, read with an atomic acquire load (not hoisted, not torn)."""
        if not (isinstance(arr, types.Array) and arr.dtype == types.int64 and isinstance(i, types.Integer)):
            return None

        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
            return builder.load_atomic(ptr, "acquire", 8)
        return types.int64(arr, i), codegen

    @numba.extending.intrinsic
    def _pause(typingctx):
        def codegen(context, builder, signature, args):
            hint = _PAUSE.get(platform.machine().lower())
            if hint is not None:
                name, arg = hint
                args = [] if arg is None else [ir.Constant(ir.IntType(32), arg)]
                fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
                    ir.VoidType(), [a.type for a in args]), name)
                builder.call(fn, args)
            return context.get_dummy_value()
        return types.none(), codegen

    @numba.extending.intrinsic
    def _yield(typingctx):
        def codegen(context, builder, signature, args):
            if sys.platform != "win32":      # POSIX sched_yield, resolved in the process (libc)
                fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []),
                                                    "sched_yield")
                builder.call(fn, [])
            return context.get_dummy_value()
        return types.none(), codegen

    parallel.use_spin(numba.njit(nogil=True, cache=True)(_spin))
