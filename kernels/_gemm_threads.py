"""Large 2-D GEMMs split into row blocks that the calling thread and ``EDGETRAIN_NUM_THREADS - 1`` helpers
claim one at a time, BLAS itself kept to one thread.

OpenBLAS splits a GEMM statically: the caller waits for every worker's share. On cores shared with other
processes a worker the OS has not scheduled yet stalls the whole GEMM for a time slice (gpt at 2 threads on a
busy 2-core host: 5x slower than at 1 thread). Here a helper that has not started holds no work: the caller
claims the next block itself, so a step is never slower than the caller alone, and as fast as the free cores
allow. numpy's matmul releases the GIL while BLAS runs, so the blocks run in parallel.
"""
from __future__ import annotations

import threading

import numpy as np

from edgetrain import config

MIN_FLOPS = 1 << 23        # smaller GEMMs (~0.1 ms) stay one call: dispatch would cost more than it saves
BLOCKS_PER_THREAD = 4      # blocks to claim: a late helper costs at most one block


class _Pool:
    def __init__(self, helpers: int):
        self._wake = threading.Condition()
        self._job = None
        self._serial = 0
        for _ in range(helpers):
            threading.Thread(target=self._serve, daemon=True, name="edgetrain-gemm").start()

    def _serve(self):
        seen = 0
        while True:
            with self._wake:
                while self._serial == seen:
                    self._wake.wait()
                seen, job = self._serial, self._job
            _drain(job)

    def run(self, blocks):
        job = (blocks, iter(range(len(blocks))), [len(blocks)], threading.Lock(), threading.Event(), [])
        with self._wake:
            self._job = job
            self._serial += 1
            self._wake.notify_all()
        _drain(job)
        job[4].wait()
        if job[5]:
            raise job[5][0]


def _drain(job):
    blocks, claims, left, lock, done, errors = job
    for i in claims:            # next() on a shared range iterator is atomic under the GIL: each block once
        fn, args = blocks[i]
        try:
            fn(*args)
        except BaseException as e:      # noqa: BLE001 -- handed to the caller, which raises it
            errors.append(e)
        with lock:
            left[0] -= 1
            if left[0] == 0:
                done.set()


_POOLS: dict[int, _Pool] = {}


def _pool(threads: int) -> _Pool:
    if threads not in _POOLS:
        _POOLS[threads] = _Pool(threads - 1)
    return _POOLS[threads]


def split(fn, a: np.ndarray, b: np.ndarray, y: np.ndarray, *rest):
    """``(fn, args)`` for ``fn(a, b, y, *rest)`` (y = a @ b, row by row), as row blocks run by the pool when
    threads are configured and the GEMM is large, else the one call."""
    threads = config.num_threads()
    if threads < 2 or a.ndim != 2 or b.ndim != 2 or 2 * y.size * a.shape[1] < MIN_FLOPS:
        return fn, (a, b, y, *rest)
    rows = y.shape[0]
    n = min(rows, threads * BLOCKS_PER_THREAD)
    bounds = [rows * k // n for k in range(n + 1)]
    blocks = [(fn, (a[lo:hi], b, y[lo:hi], *rest)) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]
    return _pool(threads).run, (blocks,)
