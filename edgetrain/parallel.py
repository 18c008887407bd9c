"""Intra-op threads (``EDGETRAIN_NUM_THREADS``): a call's work cut into blocks that the calling thread and
``threads - 1`` helpers claim one at a time.

Kernels are compiled ``nogil`` (and numpy's BLAS releases the GIL) rather than ``parallel=True``: prange would
tie every kernel to Numba's threading layer, and the ahead-of-time kernel set (pycc) has no parallel target.
Blocks are claimed, not assigned: on cores shared with other processes a helper the OS has not scheduled yet
holds no work, the caller takes the next block itself, so a call is never slower than the caller alone (a static
split waits a whole time slice for the late share; gpt at 2 threads on a busy host ran 5x slower that way).
Each thread passes its slot (caller 0, helpers 1...) to the blocks it runs, so a block can use that thread's
own scratch. Between jobs the helpers busy-wait (without the GIL, for ``config.spin_us()``: longer than the gaps
between the splits of one training step) before they sleep, and the caller busy-waits for its last block: with a
free core a hand-off then costs microseconds instead of an OS wake-up (tens of them on these VMs). The split thresholds did not move: on the shared 2-core host a helper
started its block in under 10% of jobs (the second core held by other processes), so smaller splits lost.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from . import config

BLOCKS_PER_THREAD = 2      # blocks to claim per thread: a late helper costs at most one block, and every block
                           # boundary may pass the GIL between threads
_spin = []                 # [loop, its rounds per microsecond] once kernels/_spin registered its nogil busy-wait


def use_spin(loop) -> None:
    """Wait between jobs with ``loop(state, i, value, equal, rounds)`` (kernels/_spin.py: reads ``state[i]``
    without the GIL while ``(state[i] == value) == equal``, at most ``rounds`` times; returns the last read), or,
    with None, sleep on a lock. Pools switch at their next wait."""
    _spin[:] = [] if loop is None else [loop, None]


def spin_loop():
    """The busy-wait in use, or None."""
    return _spin[0] if _spin else None


def _spin_rounds(spin: list) -> int:
    """Rounds of ``spin``'s loop (a copy of ``_spin``) in ``config.spin_us()``; its speed timed once (the fastest of three
    short runs: a preempted run reads slow, which only shortens the spin)."""
    loop, per_us = spin
    if per_us is None:
        probe, n = np.zeros(1, np.int64), 1 << 14
        loop(probe, 0, 1, False, 1)             # compiles, or loads from Numba's cache
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            loop(probe, 0, 1, False, n)         # probe[0] never becomes 1: all n rounds
            best = min(best, time.perf_counter() - t)
        per_us = n * 1e-6 / max(best, 1e-9)
        current = _spin[:]
        if current and current[0] is loop:
            _spin[1] = per_us
    return int(per_us * config.spin_us())


def slots() -> int:
    """How many threads may run a call's blocks at once: the scratch a splitting kernel needs, one per slot."""
    return config.num_threads()


class _Pool:
    def __init__(self, helpers: int):
        self._wake = threading.Condition()
        self._serial = np.zeros(1, np.int64)    # bumped per job; helpers spinning read it without the GIL
        self._sleepers = 0
        self._job = None
        for slot in range(1, helpers + 1):
            threading.Thread(target=self._serve, args=(slot,), daemon=True, name=f"edgetrain-{slot}").start()

    def _serve(self, slot: int):
        seen, serial = 0, self._serial
        while True:
            spin = _spin[:]
            if not spin or spin[0](serial, 0, seen, True, _spin_rounds(spin)) == seen:
                with self._wake:
                    self._sleepers += 1
                    while serial[0] == seen:
                        self._wake.wait()
                    self._sleepers -= 1
            seen = int(serial[0])
            _drain(self._job, slot)     # read after the serial, written before it: this job or a newer one

    def run(self, blocks):
        left = np.array([len(blocks)], np.int64)
        job = (blocks, iter(range(len(blocks))), left, threading.Lock(), threading.Event(), [])
        with self._wake:
            self._job = job
            self._serial[0] += 1
            if self._sleepers:
                self._wake.notify_all()
        _drain(job, 0)
        # the last block may still run on a helper: watch its count rather than sleep (a wake-up costs more than
        # a short block), then sleep on the job's event (set when the count reaches 0)
        spin = _spin[:]
        if left[0] and (not spin or spin[0](left, 0, 0, False, _spin_rounds(spin))):
            job[4].wait()
        if job[5]:
            raise job[5][0]

    def sleeping(self) -> int:
        """Helpers asleep on the lock (the rest are spinning, or running a job)."""
        with self._wake:
            return self._sleepers


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


def pool(threads: int) -> _Pool:
    """The pool of ``threads - 1`` helpers (made at first use; its threads live as long as the process)."""
    with _POOLS_LOCK:
        return _POOLS.get(threads) or _POOLS.setdefault(threads, _Pool(threads - 1))


def run_blocks(blocks: list, threads: int) -> None:
    """Run every ``block(slot)`` on ``threads`` threads (the caller is slot 0); the first error any block raised
    is raised here, after all of them finished."""
    if threads < 2 or len(blocks) < 2:
        for block in blocks:
            block(0)
        return
    pool(threads).run(blocks)


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
