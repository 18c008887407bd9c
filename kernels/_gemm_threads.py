"""Large GEMMs split into row or column blocks (or images, or whole matrices of a stack) that the calling thread and ``EDGETRAIN_NUM_THREADS - 1``
helpers claim one at a time (``edgetrain.parallel``), BLAS itself kept to one thread.

OpenBLAS splits a GEMM statically: the caller waits for every worker's share. On cores shared with other
processes a worker the OS has not scheduled yet stalls the whole GEMM for a time slice (gpt at 2 threads on a
busy 2-core host: 5x slower than at 1 thread). Here a helper that has not started holds no work: the caller
claims the next block itself, so a step is never slower than the caller alone, and as fast as the free cores
allow. numpy's matmul releases the GIL while BLAS runs, so the blocks run in parallel.

float32 GEMMs whose operands BLAS takes as they are go to ``_gemm_pool`` instead (the same claiming, in native
threads: this module's blocks pass the GIL at every hand-off, which cost more than the second core gave). The
blocks here remain for the rest: other element types, layouts numpy copies, the trimmed runtime.
"""
from __future__ import annotations

import numpy as np

from edgetrain import config, parallel

try:
    from . import _gemm_pool        # not in the trimmed runtime, which keeps the Python pool below
except ImportError:
    _gemm_pool = None

MIN_FLOPS = 1 << 25        # smaller GEMMs (~0.5 ms) stay one call: at 2 threads the hand-offs made the mlp's
                           # 0.1-0.2 ms GEMMs slower than one thread
MIN_ROWS = 64              # rows (or columns) of a block at least, and
BLOCKS_PER_THREAD = 2      # blocks per thread at most: each block packs its whole other operand again (2-D
                           # GEMMs of gpt in 8 row blocks cost 12-20% more CPU than one call, in 4 blocks 6-9%)
MIN_BATCHED_FLOPS = 1 << 22     # stacked GEMMs from ~50 us: their blocks repack nothing (each matrix is a BLAS
                                # call of its own anyway), so only the hand-off costs


def split(fn, a: np.ndarray, b: np.ndarray, y: np.ndarray, *rest):
    """``(fn, args)`` for ``fn(a, b, y, *rest)`` (y = a @ b), as row or column blocks run on the intra-op
    threads (``edgetrain.parallel``) when threads are configured and the GEMM is large, else the one call.
    Stacked GEMMs (attention's heads) go in blocks of whole matrices instead (``batched``)."""
    threads = config.num_threads()
    if threads >= 2 and a.ndim >= 2 and b.ndim >= 2 and y.ndim >= 3:
        return batched(fn, a, b, y, *rest)      # which tries the native pool first
    native = _native(fn, a, b, y, rest)
    if native is not None:
        return native
    if threads < 2 or a.ndim != 2 or b.ndim != 2 or 2 * y.size * a.shape[1] < MIN_FLOPS:
        return fn, (a, b, y, *rest)
    # blocks along y's longer dim: a weight gradient [128, 512] in 4 row blocks of 32 cost 21% more CPU than one
    # call, in 4 column blocks 6%
    by_rows = y.shape[0] >= y.shape[1]
    length = y.shape[0 if by_rows else 1]
    n = min(length // MIN_ROWS, threads * BLOCKS_PER_THREAD)
    if n < 2:
        return fn, (a, b, y, *rest)
    bounds = [length * k // n for k in range(n + 1)]
    if by_rows:
        blocks = [lambda _slot, lo=lo, hi=hi: fn(a[lo:hi], b, y[lo:hi], *rest) for lo, hi in zip(bounds, bounds[1:])]
    else:
        blocks = [lambda _slot, lo=lo, hi=hi: fn(a, b[:, lo:hi], y[:, lo:hi], *rest)
                  for lo, hi in zip(bounds, bounds[1:])]
    return parallel.run_blocks, (blocks, threads)


def per_image(fn, a: np.ndarray, b: np.ndarray, y: np.ndarray):
    """``(fn, args)`` for the batched ``fn(a, b, y)`` (y[i] = a @ b[i]; a conv's W times each image's columns),
    as blocks of whole images (each one stacked call) on the intra-op threads when threads are configured and
    the GEMMs are large."""
    native = _native(fn, a, b, y, ())
    if native is not None:
        return native
    threads, images = config.num_threads(), b.shape[0]
    if threads < 2 or images < 2 or 2 * y.size * a.shape[-1] < MIN_FLOPS:
        return fn, (a, b, y)
    n = min(images, threads * parallel.BLOCKS_PER_THREAD)
    bounds = [images * k // n for k in range(n + 1)]
    blocks = [lambda _slot, lo=lo, hi=hi: fn(a, b[lo:hi], y[lo:hi]) for lo, hi in zip(bounds, bounds[1:])]
    return parallel.run_blocks, (blocks, threads)


def batched(fn, a: np.ndarray, b: np.ndarray, y: np.ndarray, *rest):
    """``(fn, args)`` for the stacked ``fn(a, b, y, *rest)`` (y[i] = a[i] @ b[i], operands broadcast as numpy's
    matmul; both at least 2-D, y at least 3-D), as blocks of y's first axis on the intra-op threads when the
    GEMMs are large together: an operand with that axis (of y's length) is cut with y, one broadcast along it
    is passed whole."""
    native = _native(fn, a, b, y, rest)
    if native is not None:
        return native
    threads, stack = config.num_threads(), y.shape[0]
    if threads < 2 or stack < 2 or 2 * y.size * a.shape[-1] < MIN_BATCHED_FLOPS:
        return fn, (a, b, y, *rest)
    cut_a = a.ndim == y.ndim and a.shape[0] == stack
    cut_b = b.ndim == y.ndim and b.shape[0] == stack
    n = min(stack, threads * parallel.BLOCKS_PER_THREAD)
    bounds = [stack * k // n for k in range(n + 1)]
    blocks = [lambda _slot, lo=lo, hi=hi: fn(a[lo:hi] if cut_a else a, b[lo:hi] if cut_b else b, y[lo:hi], *rest)
              for lo, hi in zip(bounds, bounds[1:])]
    return parallel.run_blocks, (blocks, threads)


def _native(fn, a, b, y, rest: tuple):
    """The GEMM on ``_gemm_pool``'s native threads when it applies (``fn`` is numpy's matmul, or a function
    marked ``alpha_argument``: ``fn(a, b, y, alpha)`` computes alpha * a @ b), else None."""
    if _gemm_pool is None:
        return None
    if fn is np.matmul and not rest:
        alpha = 1.0
    elif getattr(fn, "alpha_argument", False) and len(rest) == 1:
        alpha = float(rest[0])
    else:
        return None
    return _gemm_pool.job(a, b, y, alpha)
