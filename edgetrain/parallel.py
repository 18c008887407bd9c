"""Intra-op threads for nogil kernels: one slice of a batch per thread (``EDGETRAIN_NUM_THREADS``).

The kernels are compiled ``nogil`` rather than ``parallel=True``: prange would tie every kernel to Numba's
threading layer, and the ahead-of-time kernel set (pycc) has no parallel target. Handing a slice to a waiting
thread costs tens of microseconds, so launchers split only calls with enough work in each slice.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from . import config

_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_lock = threading.Lock()


def slots() -> int:
    """How many slices a call may run at once: the scratch a splitting kernel needs per slice."""
    return config.num_threads()


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size < workers:
            if _pool is not None:
                _pool.shutdown(wait=True)
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="edgetrain-kernel")
            _pool_size = workers
        return _pool


def split(n: int, work, min_each: int = 1, most: int | None = None) -> None:
    """``work(slot, lo, hi)`` over ``[0, n)`` in up to ``slots()`` (or ``most``: the scratch the caller holds)
    slices of at least ``min_each`` items, at once: the calling thread runs slot 0. Every slice finishes
    before this returns; the first error raised in any slice is raised here."""
    parts = max(1, min(slots() if most is None else most, n // max(1, min_each)))
    if parts == 1:
        work(0, 0, n)
        return
    bounds = [n * k // parts for k in range(parts + 1)]
    futures = [_executor(parts - 1).submit(work, k, bounds[k], bounds[k + 1]) for k in range(1, parts)]
    error = None
    try:
        work(0, bounds[0], bounds[1])
    except BaseException as e:      # noqa: BLE001 -- re-raised below, after the other slices stopped
        error = e
    for f in futures:
        try:
            f.result()
        except BaseException as e:  # noqa: BLE001
            error = error or e
    if error is not None:
        raise error
