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

The intrinsics here (atomic load, store and add on an int64 array element, the spin-loop hint, sched_yield,
cblas_sgemm by address, typed pointers to an address) are also the native GEMM pool's (``_gemm_pool.py``).
Numba's cache keys a function by its own file: after editing an intrinsic, clear the cache (``edgetrain cache
clear``) or touch ``_gemm_pool.py``.
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

load_acquire = store_release = fetch_add = pause = sched_yield = sgemm = None     # Numba intrinsics (register)
float32_at = int64_at = carray = None
ROW_MAJOR = 101            # CBLAS's order enum: edgetrain's GEMMs are row-major


def _spin(state, i, value, equal, rounds):
    """Wait while ``(state[i] == value) == equal``, at most ``rounds`` reads; the last value read."""
    if i < 0 or i >= state.size:
        raise IndexError("spin: index outside the watched array")
    for k in range(rounds):
        v = load_acquire(state, i)
        if (v == value) != equal:
            return v
        if k % YIELD_EVERY == YIELD_EVERY - 1:
            sched_yield()
        else:
            pause()
    return load_acquire(state, i)


def register(numba):
    """Make the intrinsics and hand the loop (compiled at its first call) to ``edgetrain.parallel``; ``_jit``
    calls this when it loads Numba. With ``NUMBA_DISABLE_JIT`` the intrinsics cannot run: the threads keep
    sleeping between jobs. The intrinsics stay in this file so that editing them invalidates Numba's cache."""
    global load_acquire, store_release, fetch_add, pause, sched_yield, sgemm, float32_at, int64_at, carray
    if numba.config.DISABLE_JIT:
        return
    from llvmlite import ir
    from numba.core import cgutils, types

    def element(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        return cgutils.get_item_pointer(context, builder, sig.args[0], ary, [args[1]], wraparound=False)

    def int64_element(arr, i):
        return isinstance(arr, types.Array) and arr.dtype == types.int64 and isinstance(i, types.Integer)

    @numba.extending.intrinsic
    def load_acquire(typingctx, arr, i):
        """``arr[i]`` of a C-contiguous int64 array, read with an atomic acquire load (not hoisted, not torn)."""
        if not int64_element(arr, i):
            return None

        def codegen(context, builder, sig, args):
            return builder.load_atomic(element(context, builder, sig, args), "acquire", 8)
        return types.int64(arr, i), codegen

    @numba.extending.intrinsic
    def store_release(typingctx, arr, i, value):
        """``arr[i] = value`` as an atomic release store: what was written before is seen before it."""
        if not int64_element(arr, i):
            return None

        def codegen(context, builder, sig, args):
            builder.store_atomic(context.cast(builder, args[2], sig.args[2], types.int64),
                                 element(context, builder, sig, args), "release", 8)
            return context.get_dummy_value()
        return types.none(arr, i, value), codegen

    @numba.extending.intrinsic
    def fetch_add(typingctx, arr, i, value):
        """``arr[i] += value`` atomically; the value before."""
        if not int64_element(arr, i):
            return None

        def codegen(context, builder, sig, args):
            return builder.atomic_rmw("add", element(context, builder, sig, args),
                                      context.cast(builder, args[2], sig.args[2], types.int64), "seq_cst")
        return types.int64(arr, i, value), codegen

    @numba.extending.intrinsic
    def pause(typingctx):
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
    def sched_yield(typingctx):
        def codegen(context, builder, signature, args):
            if sys.platform != "win32":      # POSIX sched_yield, resolved in the process (libc)
                fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []),
                                                    "sched_yield")
                builder.call(fn, [])
            return context.get_dummy_value()
        return types.none(), codegen

    @numba.extending.intrinsic
    def sgemm(typingctx, fn, ilp64, ta, tb, m, n, k, alpha, a, lda, b, ldb, c, ldc):
        """cblas_sgemm(RowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, 0, c, ldc) at address ``fn``, with 64-bit
        integers when ``ilp64`` (edgetrain.blas.sgemm says which); operands and sizes as int64."""
        sig = types.none(*([types.int64] * 7), types.float32, *([types.int64] * 6))

        def codegen(context, builder, sig, args):
            fn, ilp64, ta, tb, m, n, k, alpha, a, lda, b, ldb, c, ldc = args
            i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
            ptr = ir.IntType(8).as_pointer()
            enum = [ir.Constant(i32, ROW_MAJOR), builder.trunc(ta, i32), builder.trunc(tb, i32)]
            with builder.if_else(builder.icmp_unsigned("!=", ilp64, ir.Constant(i64, 0))) as (wide, narrow):
                for block, width in ((wide, i64), (narrow, i32)):
                    with block:
                        def size(v, width=width):
                            return v if width is i64 else builder.trunc(v, i32)
                        fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, width, width, width, f32, ptr,
                                                               width, ptr, width, f32, ptr, width])
                        builder.call(builder.inttoptr(fn, fnty.as_pointer()), enum + [
                            size(m), size(n), size(k), alpha, builder.inttoptr(a, ptr), size(lda),
                            builder.inttoptr(b, ptr), size(ldb), ir.Constant(f32, 0.0),
                            builder.inttoptr(c, ptr), size(ldc)])
            return context.get_dummy_value()
        return sig, codegen

    def pointer_at(dtype):
        @numba.extending.intrinsic
        def at(typingctx, address):
            """A typed pointer to the memory at integer ``address`` (for ``numba.carray``)."""
            if not isinstance(address, types.Integer):
                return None

            def codegen(context, builder, sig, args):
                return builder.inttoptr(args[0], context.get_value_type(sig.return_type))
            return types.CPointer(dtype)(address), codegen
        return at

    float32_at, int64_at = pointer_at(types.float32), pointer_at(types.int64)
    carray = numba.carray       # an array over a typed pointer, in jitted code (this module imports no Numba)
    parallel.use_spin(numba.njit(nogil=True, cache=True)(_spin))
