"""Intra-op threads (``EDGETRAIN_NUM_THREADS``): a call's work cut into blocks that the calling thread and
``threads - 1`` helpers claim one at a time.

Kernels are compiled ``nogil`` (and numpy's BLAS releases the GIL) rather than ``parallel=True``: prange would
tie every kernel to Numba's threading layer, and the ahead-of-time kernel set (pycc) has no parallel target.
Blocks are claimed, not assigned: on cores shared with other processes a helper the OS has not scheduled yet
holds no work, the caller takes the next block itself, so a call is never slower than the caller alone (a static
split waits a whole time slice for the late share; gpt at 2 threads on a busy host ran 5x slower that way).
Each thread passes its slot (caller 0, helpers 1...) to the blocks it runs, so a block can use that thread's
own scratch. A hand-off costs tens of microseconds: callers split only work that is large enough.
"""
from __future__ import annotations

import threading

from . import config

BLOCKS_PER_THREAD = 4      # blocks to claim per thread: a late helper costs at most one block


def slots() -> int:
    """How many threads may run a call's blocks at once: the scratch a splitting kernel needs, one per slot."""
    return config.num_threads()


class _Pool:
    def __init__(self, helpers: int):
        self._wake = threading.Condition()
        self._job = None
        self._serial = 0
        for slot in range(1, helpers + 1):
            threading.Thread(target=self._serve, args=(slot,), daemon=True, name=f"edgetrain-{slot}").start()

    def _serve(self, slot: int):
        seen = 0
        while True:
            with self._wake:
                while self._serial == seen:
                    self._wake.wait()
                seen, job = self._serial, self._job
            _drain(job, slot)

    def run(self, blocks):
        job = (blocks, iter(range(len(blocks))), [len(blocks)], threading.Lock(), threading.Event(), [])
        with self._wake:
            self._job = job
            self._serial += 1
            self._wake.notify_all()
        _drain(job, 0)
        job[4].wait()
        if job[5]:
            raise job[5][0]


def _drain(job, slot: int):
    blocks, claims, left, lock, done, errors = job
    for i in claims:            # next() on a shared range iterator is atomic under the GIL: each block once
        try:
            blocks[i](slot)
        except BaseException as e:      # noqa: BLE001 -- handed to the caller, which raises it
            errors.append(e)
        with lock:
            left[0] -= 1
            if left[0] == 0:
                done.set()


_POOLS: dict[int, _Pool] = {}
_POOLS_LOCK = threading.Lock()


def run_blocks(blocks: list, threads: int) -> None:
    """Run every ``block(slot)`` on ``threads`` threads (the caller is slot 0); the first error any block raised
    is raised here, after all of them finished."""
    if threads < 2 or len(blocks) < 2:
        for block in blocks:
            block(0)
        return
    with _POOLS_LOCK:
        pool = _POOLS.get(threads) or _POOLS.setdefault(threads, _Pool(threads - 1))
    pool.run(blocks)


def split(n: int, work, min_each: int = 1, most: int | None = None) -> None:
    """``work(slot, lo, hi)`` over ``[0, n)`` in blocks of at least ``min_each`` items, on up to ``slots()``
    threads (or ``most``: the scratch slots the caller holds); ``slot`` is the running thread's."""
    threads = max(1, min(slots() if most is None else most, n // max(1, min_each)))
    if threads == 1:
        work(0, 0, n)
        return
    parts = max(1, min(threads * BLOCKS_PER_THREAD, n // max(1, min_each)))
    bounds = [n * k // parts for k in range(parts + 1)]
    run_blocks([lambda slot, lo=lo, hi=hi: work(slot, lo, hi) for lo, hi in zip(bounds, bounds[1:]) if hi > lo],
               threads)
