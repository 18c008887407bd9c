"""Large GEMMs split into row blocks (or images) that the calling thread and ``EDGETRAIN_NUM_THREADS - 1``
helpers claim one at a time (``edgetrain.parallel``), BLAS itself kept to one thread.

OpenBLAS splits a GEMM statically: the caller waits for every worker's share. On cores shared with other
processes a worker the OS has not scheduled yet stalls the whole GEMM for a time slice (gpt at 2 threads on a
busy 2-core host: 5x slower than at 1 thread). Here a helper that has not started holds no work: the caller
claims the next block itself, so a step is never slower than the caller alone, and as fast as the free cores
allow. numpy's matmul releases the GIL while BLAS runs, so the blocks run in parallel.
"""
from __future__ import annotations

import numpy as np

from edgetrain import config, parallel

MIN_FLOPS = 1 << 23        # smaller GEMMs (~0.1 ms) stay one call: dispatch would cost more than it saves


def split(fn, a: np.ndarray, b: np.ndarray, y: np.ndarray, *rest):
    """``(fn, args)`` for ``fn(a, b, y, *rest)`` (y = a @ b, row by row), as row blocks run on the intra-op
    threads (``edgetrain.parallel``) when threads are configured and the GEMM is large, else the one call."""
    threads = config.num_threads()
    if threads < 2 or a.ndim != 2 or b.ndim != 2 or 2 * y.size * a.shape[1] < MIN_FLOPS:
        return fn, (a, b, y, *rest)
    rows = y.shape[0]
    n = min(rows, threads * parallel.BLOCKS_PER_THREAD)
    bounds = [rows * k // n for k in range(n + 1)]
    blocks = [lambda _slot, lo=lo, hi=hi: fn(a[lo:hi], b, y[lo:hi], *rest)
              for lo, hi in zip(bounds, bounds[1:]) if hi > lo]
    return parallel.run_blocks, (blocks, threads)


def per_image(fn, a: np.ndarray, b: np.ndarray, y: np.ndarray):
    """``(fn, args)`` for the batched ``fn(a, b, y)`` (y[i] = a @ b[i]; a conv's W times each image's columns),
    as one block per image on the intra-op threads when threads are configured and the GEMMs are large."""
    threads = config.num_threads()
    if threads < 2 or b.shape[0] < 2 or 2 * y.size * a.shape[-1] < MIN_FLOPS:
        return fn, (a, b, y)
    blocks = [lambda _slot, i=i: fn(a, b[i], y[i]) for i in range(b.shape[0])]
    return parallel.run_blocks, (blocks, threads)
