"""Single-precision GEMMs (and AdamW updates) split over intra-op threads that never take the GIL between
blocks.

``edgetrain.parallel``'s pool hands Python callables to its helpers, so every hand-off passes the GIL: a helper
that sees a job must take the GIL the caller holds, sleeps on it, and is woken by the OS (on these VMs a woken
thread runs 50-200 us later). Measured at 2 threads, a GEMM split into blocks there ran no faster than one call
(gpt: 31 ms of GEMMs at 1 thread and at 2), and two 26 us blocks took 126 us against 53 serially.

Here a job is numbers: a descriptor (``D_*``) of one ``cblas_sgemm`` call, or a stack of them, cut into blocks of
rows, columns or stacked matrices. Helpers spin in native code (``serve``), claim blocks with an atomic add on
one word that also holds the job's serial number and block count (a claim of a finished job cannot run against
the next job's descriptor), and call numpy's own BLAS (``edgetrain.blas.sgemm``, one thread) by address. The
caller publishes, runs blocks itself and waits for the last, also in native code (``run``). A helper the OS has
not scheduled holds no block, so the caller is never slower than alone, as in ``edgetrain.parallel``. Measured in
one process, 2 threads: 512x128x512 851 -> 480 us, 512x128x128 194 -> 119 us.

A helper spins ``config.spin_us()`` after its last job, then sleeps on a condition; the caller wakes sleepers
before it publishes (a sleeper woken late finds the job's blocks taken, and joins the next). One caller at a
time: a second thread calling in meanwhile runs its GEMM as one numpy call.

An AdamW update (``adamw_job``) runs the same way: blocks of the flat state, each ``kernels/training.py``'s
``adamw_update`` on its slice (element-wise: the bits of one call). Numba caches the compiled ``run`` with that
kernel inside it, keyed by this file alone: after editing ``adamw_update``, clear the cache (``edgetrain cache
clear``) or touch this file (an installed package's files are all new, so its cache is).

Row blocks round differently from the whole GEMM in OpenBLAS (its kernel choice depends on the block's rows),
as the Python pool's blocks did: 2 threads agree with 1 to float32 rounding, not bit for bit.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

from edgetrain import blas, config

from . import _spin, direct
from . import training as _training
from ._jit import jit

# descriptor fields (int64): the sgemm's address, integer width, transposes, sizes, leading dims, operand
# addresses, the stack of matrices (STACK of them, as INNER x STACK // INNER; element strides of A, B, C along
# the outer and the inner axis, 0 for an operand that is one matrix for all), how it is cut
(D_FN, D_ILP64, D_TA, D_TB, D_M, D_N, D_K, D_LDA, D_LDB, D_LDC, D_A, D_B, D_C, D_STACK, D_INNER,
 D_SA, D_SB, D_SC, D_IA, D_IB, D_IC, D_CUT, D_BLOCKS, D_KIND) = range(24)
DESC = 24
KIND_GEMM, KIND_ADAMW = 0, 1
# an AdamW job's fields (the first words, which a GEMM's use for its own): addresses of the flat parameters,
# gradients and moments, of the learning rate, step and constants, of one scratch row per block; the size, the
# adam mode and bias correction (kernels/training.py's adamw_update arguments)
(U_P, U_G, U_M, U_V, U_LR, U_STEP, U_CONSTS, U_SCRATCH, U_SIZE, U_MODE, U_CORRECT) = range(11)
SCRATCH = 6                # a scratch row's elements (adamw_update's step-dependent scalars)
CUT_ROWS, CUT_COLS, CUT_STACK = 0, 1, 2
NO_TRANS, TRANS = 111, 112             # CBLAS's enum values
# control words, each on its own cache line: the job word (serial << 40 | blocks << 20 | next block to claim),
# blocks not finished yet, helpers asleep
W_JOB, W_LEFT, W_ASLEEP = 0, 8, 16
FIELD = (1 << 20) - 1

MIN_FLOPS = 1 << 22        # GEMMs from ~50 us split: 512x128x128 (8.4 MFLOP) ran 194 -> 119 us at 2 threads
MIN_CUT = 16               # rows or columns a block holds at least (OpenBLAS's kernels tile by 4-16)
BLOCKS_PER_THREAD = 2      # a late helper costs at most one block; more blocks repack the other operand more

# plain Python cannot run the intrinsics: with NUMBA_DISABLE_JIT the GEMMs stay numpy calls
_NO_JIT = os.environ.get("NUMBA_DISABLE_JIT", "0").strip() not in ("", "0")


@jit
def _adamw_block(d, blk):
    """Block ``blk`` of an AdamW job: adamw_update on its slice of the flat state (element-wise, so every element
    gets the bits one call gives it), its step scalars into its own scratch row."""
    n, blocks = d[U_SIZE], d[D_BLOCKS]
    lo, hi = n * blk // blocks, n * (blk + 1) // blocks
    state = [_spin.carray(_spin.float32_at(d[u] + 4 * lo), hi - lo) for u in (U_P, U_G, U_M, U_V)]
    lr = _spin.carray(_spin.float32_at(d[U_LR]), 1)
    step = _spin.carray(_spin.int64_at(d[U_STEP]), 1)
    consts = _spin.carray(_spin.float32_at(d[U_CONSTS]), SCRATCH)
    scratch = _spin.carray(_spin.float32_at(d[U_SCRATCH] + 4 * SCRATCH * blk), SCRATCH)
    _training.adamw_update(state[0], state[1], state[2], state[3], lr, step, consts, scratch, d[U_MODE],
                           d[U_CORRECT] != 0)


@jit
def _block(d, alpha, blk):
    """Block ``blk`` of the job ``d`` describes: its rows, columns or stacked matrices, one sgemm each (or its
    slice of an AdamW update)."""
    if d[D_KIND] == KIND_ADAMW:
        _adamw_block(d, blk)
        return
    cut, blocks = d[D_CUT], d[D_BLOCKS]
    length = d[D_M] if cut == CUT_ROWS else d[D_N] if cut == CUT_COLS else d[D_STACK]
    lo, hi = length * blk // blocks, length * (blk + 1) // blocks
    m, n, a, b, c, first, last = d[D_M], d[D_N], d[D_A], d[D_B], d[D_C], 0, d[D_STACK]
    if cut == CUT_ROWS:         # rows of op(A) and C: a row of op(A) is A's column when A is transposed
        a += 4 * lo * (1 if d[D_TA] == TRANS else d[D_LDA])
        c += 4 * lo * d[D_LDC]
        m = hi - lo
    elif cut == CUT_COLS:       # columns of op(B) and C
        b += 4 * lo * (d[D_LDB] if d[D_TB] == TRANS else 1)
        c += 4 * lo
        n = hi - lo
    else:
        first, last = lo, hi
    inner = d[D_INNER]
    for s in range(first, last):
        o, i = s // inner, s % inner
        _spin.sgemm(d[D_FN], d[D_ILP64], d[D_TA], d[D_TB], m, n, d[D_K], alpha[0],
               a + 4 * (o * d[D_SA] + i * d[D_IA]), d[D_LDA], b + 4 * (o * d[D_SB] + i * d[D_IB]), d[D_LDB],
               c + 4 * (o * d[D_SC] + i * d[D_IC]), d[D_LDC])


@jit
def _claim_and_run(ctl, d, alpha):
    """Claim blocks of the published job and run them until none is left."""
    while True:
        word = _spin.fetch_add(ctl, W_JOB, 1)
        if (word & FIELD) >= ((word >> 20) & FIELD):
            return
        _block(d, alpha, word & FIELD)
        _spin.fetch_add(ctl, W_LEFT, -1)


@jit
def serve(ctl, d, alpha, seen, rounds):
    """A helper's loop: run the blocks of every job published after serial ``seen``; after ``rounds`` spins
    with none, return the last serial seen (the helper then sleeps)."""
    k = 0
    while k < rounds:
        serial = _spin.load_acquire(ctl, W_JOB) >> 40
        if serial != seen:
            seen = serial
            _claim_and_run(ctl, d, alpha)
            k = 0
        else:
            k += 1
            if k % _spin.YIELD_EVERY == 0:
                _spin.sched_yield()
            else:
                _spin.pause()
    return seen


@jit
def run(ctl, d, alpha, job, job_alpha):
    """The caller: publish ``job`` (copied into the shared descriptor ``d``), run blocks, wait for the last."""
    for i in range(DESC):
        d[i] = job[i]
    alpha[0] = job_alpha[0]
    blocks = job[D_BLOCKS]
    _spin.store_release(ctl, W_LEFT, blocks)
    serial = ((_spin.load_acquire(ctl, W_JOB) >> 40) + 1) & FIELD
    _spin.store_release(ctl, W_JOB, (serial << 40) | (blocks << 20))
    _claim_and_run(ctl, d, alpha)
    k = 0
    while _spin.load_acquire(ctl, W_LEFT) != 0:
        k += 1
        if k % _spin.YIELD_EVERY == 0:
            _spin.sched_yield()
        else:
            _spin.pause()


class _Pool:
    def __init__(self, helpers: int):
        self.ctl = np.zeros(24, np.int64)
        self.desc = np.zeros(DESC, np.int64)
        self.alpha = np.ones(1, np.float32)
        self.busy = threading.Lock()
        self._wake = threading.Condition()
        self._rounds = None
        self._run = run
        for slot in range(1, helpers + 1):
            threading.Thread(target=self._serve, daemon=True, name=f"edgetrain-gemm-{slot}").start()

    def rounds(self) -> int:
        """Spins of ``serve`` in ``config.spin_us()`` (its speed timed once, the fastest of three runs)."""
        if self._rounds is None:
            probe, n = np.zeros(24, np.int64), 1 << 14
            best = float("inf")
            for _ in range(3):
                t = time.perf_counter()
                serve(probe, self.desc, self.alpha, 0, n)      # serial 0 never changes: all n rounds
                best = min(best, time.perf_counter() - t)
            self._rounds = max(1, int(n * 1e-6 * config.spin_us() / max(best, 1e-9)))
        return self._rounds

    def _serve(self):
        seen = 0
        while True:
            seen = serve(self.ctl, self.desc, self.alpha, seen, self.rounds())
            with self._wake:
                self.ctl[W_ASLEEP] += 1
                while int(self.ctl[W_JOB]) >> 40 == seen:
                    self._wake.wait()
                self.ctl[W_ASLEEP] -= 1

    def call(self, job: np.ndarray, job_alpha: np.ndarray, whole):
        """Run ``job`` on the pool, or ``whole()`` if another thread is using it."""
        if not self.busy.acquire(blocking=False):
            whole()
            return
        try:
            if self.ctl[W_ASLEEP]:
                with self._wake:
                    self._wake.notify_all()
            self._run(self.ctl, self.desc, self.alpha, job, job_alpha)
            if self._run is run:        # every job's arguments have the same types
                self._run = direct(run, (self.ctl, self.desc, self.alpha, job, job_alpha))
        finally:
            self.busy.release()


_POOLS: dict[int, _Pool] = {}
_POOLS_LOCK = threading.Lock()


def _pool(threads: int) -> _Pool:
    with _POOLS_LOCK:
        return _POOLS.get(threads) or _POOLS.setdefault(threads, _Pool(threads - 1))


def _layout(x: np.ndarray):
    """(transpose flag, leading dim) of a float32 matrix stack whose last two dims BLAS takes as they are (one
    unit stride, the other at least a row or column), or None."""
    if x.dtype != np.float32 or x.ndim < 2 or x.size == 0 or any(v % 4 for v in x.strides):
        return None
    rows, cols = x.shape[-2:]
    s0, s1 = x.strides[-2:]
    if s1 == 4 and s0 >= 4 * max(1, cols):
        return NO_TRANS, s0 // 4
    if s0 == 4 and s1 >= 4 * max(1, rows):
        return TRANS, s1 // 4
    return None


def _run(x: np.ndarray) -> int:
    """How many trailing leading axes of ``x`` collapse into one axis (their strides nest)."""
    shape, strides = x.shape[:-2][::-1], x.strides[:-2][::-1]
    k = 1
    while k < len(shape) and strides[k] == strides[k - 1] * shape[k - 1]:
        k += 1
    return k


def _stack_strides(x: np.ndarray, k: int):
    """(outer, inner) strides in elements of ``x``'s leading axes as two: the last ``k`` (collapsing, inner)
    and the rest (outer, which must collapse too); (0, 0) for one matrix; None if the outer axes do not nest."""
    if x.ndim == 2:
        return 0, 0
    shape, strides = x.shape[:-2], [v // 4 for v in x.strides[:-2]]
    outer = len(shape) - k
    for j in range(outer - 1):
        if strides[j] != strides[j + 1] * shape[j + 1]:
            return None
    return (strides[outer - 1] if outer else 0), strides[-1]


def job(a: np.ndarray, b: np.ndarray, y: np.ndarray, alpha: float = 1.0):
    """``(fn, args)`` computing ``y = alpha * a @ b`` (numpy's matmul broadcasting of stacks: each operand
    stacked like y, or one matrix) on the native pool, or None when it does not apply: one thread, no BLAS
    found, not float32, a layout BLAS cannot take, y overlapping an operand, or too small to gain."""
    threads = config.num_threads()
    if threads < 2 or y.dtype != np.float32 or y.ndim < 2 or y.size == 0 or _NO_JIT:
        return None
    if y.strides[-2] == 4 and y.strides[-1] != 4 and min(y.shape[-2:]) > 1:
        # y transposed in memory (a permuted output): compute y^T = b^T @ a^T into its row-major view
        a, b, y = b.swapaxes(-1, -2), a.swapaxes(-1, -2), y.swapaxes(-1, -2)
    m, n = y.shape[-2:]
    k = a.shape[-1]
    stack = y.size // (m * n)
    if 2 * y.size * k < MIN_FLOPS or a.shape[-2:] != (m, k) or b.shape[-2:] != (k, n):
        return None
    found = blas.sgemm()
    layouts = [_layout(x) for x in (a, b, y)]
    stacked = [x for x in (a, b, y) if x.ndim > 2]
    if found is None or None in layouts or layouts[2][0] != NO_TRANS:
        return None
    if any(x.shape[:-2] != y.shape[:-2] for x in stacked) or not all(y.strides[:-2]):
        return None         # a broadcast operand of the stack's shape is fine; a broadcast output is not
    if np.may_share_memory(y, a) or np.may_share_memory(y, b):
        return None         # bounds only: a view interleaved with y goes to numpy, which copies

    nested = min((_run(x) for x in stacked), default=0)
    strides = [_stack_strides(x, nested) for x in (a, b, y)]
    if None in strides:
        return None
    inner = int(np.prod(y.shape[-2 - nested:-2])) if nested else 1
    (ta, lda), (tb, ldb), (_, ldc) = layouts
    (sa, ia), (sb, ib), (sc, ic) = strides
    if stack >= 2:
        cut, length = CUT_STACK, stack
    else:
        cut, length = (CUT_ROWS, m) if m >= n else (CUT_COLS, n)
    per_block = 1 if cut == CUT_STACK else MIN_CUT
    blocks = min(threads * BLOCKS_PER_THREAD, length // per_block, FIELD)     # the job word's field holds it
    if blocks < 2:
        return None
    d = np.zeros(DESC, np.int64)
    fields = {D_FN: found[0], D_ILP64: int(found[1]), D_TA: ta, D_TB: tb, D_M: m, D_N: n, D_K: k, D_LDA: lda,
              D_LDB: ldb, D_LDC: ldc, D_A: a.ctypes.data, D_B: b.ctypes.data, D_C: y.ctypes.data,
              D_STACK: stack, D_INNER: inner, D_SA: sa, D_SB: sb, D_SC: sc, D_IA: ia, D_IB: ib, D_IC: ic,
              D_CUT: cut, D_BLOCKS: blocks}
    for i, v in fields.items():
        d[i] = v
    scale = np.array([alpha], np.float32)
    keep = (a, b, y)        # the descriptor holds raw addresses: the arrays must outlive it

    def whole():
        np.matmul(a, b, out=y)
        if alpha != 1.0:
            np.multiply(y, y.dtype.type(alpha), out=y)
    pool = _pool(threads)

    def launch():
        pool.call(d, scale, whole)
    launch.kernel_calls = ((run, (pool.ctl, pool.desc, pool.alpha, d, scale)),
                           (serve, (pool.ctl, pool.desc, pool.alpha, 0, 1)))
    launch.operands = keep
    return launch, ()


UPDATE_MIN = 1 << 15       # elements of an AdamW update from which it splits (~12 us of work): the hand-off to a
                           # spinning helper is a few us, and a helper not running takes no block


def adamw_job(call: tuple):
    """``(fn, args)`` running ``kernels.training.adamw_update(*call)`` (flat float32 state) in blocks on the
    native pool, or None when it does not apply (one thread, other types, too small to gain)."""
    p, g, m, v, lr, step, consts, scratch, mode, correct_bias = call
    threads = config.num_threads()
    if threads < 2 or _NO_JIT or p.shape[0] < UPDATE_MIN:
        return None
    flat = (p, g, m, v, lr, consts)
    if any(a.dtype != np.float32 or a.ndim != 1 or not a.flags.c_contiguous for a in flat) or \
            step.dtype != np.int64 or step.ndim != 1 or consts.shape[0] != SCRATCH or \
            any(a.shape != p.shape for a in (g, m, v)):
        return None
    blocks = min(threads * BLOCKS_PER_THREAD, p.shape[0])
    rows = np.zeros((blocks, SCRATCH), np.float32)
    d = np.zeros(DESC, np.int64)
    fields = {U_P: p.ctypes.data, U_G: g.ctypes.data, U_M: m.ctypes.data, U_V: v.ctypes.data,
              U_LR: lr.ctypes.data, U_STEP: step.ctypes.data, U_CONSTS: consts.ctypes.data,
              U_SCRATCH: rows.ctypes.data, U_SIZE: p.shape[0], U_MODE: int(mode),
              U_CORRECT: int(bool(correct_bias)), D_CUT: CUT_ROWS, D_BLOCKS: blocks, D_KIND: KIND_ADAMW}
    for i, value in fields.items():
        d[i] = value
    one = np.ones(1, np.float32)
    pool = _pool(threads)

    def whole():
        _training.adamw_update(*call)

    def launch():
        pool.call(d, one, whole)
    launch.kernel_calls = ((run, (pool.ctl, pool.desc, pool.alpha, d, one)),
                           (serve, (pool.ctl, pool.desc, pool.alpha, 0, 1)))
    launch.operands = (call, rows)      # the descriptor holds raw addresses: the arrays must outlive it
    return launch, ()
