"""LSTM, GRU and RNN kernels: GEMMs through numpy's BLAS around jitted per-step cell updates.

Forward: the input projection of every step and direction is one GEMM up front (X [T*B, I] times all
directions' W^T); then, step by step, one GEMM for the recurrent projection h_{t-1} R^T (GRU without
linear_before_reset: two, the candidate gate's reads r * h_{t-1}) and one jitted pass over the batch for the
gates and states. Gradient: per step the jitted pass turns dh (and dc) into the gates' pre-activation
gradients, kept for every step, and one GEMM carries them back through R; afterwards dW, dR and dX are one
GEMM each over all steps, dB a GEMV.

Sequence lengths: a sequence b stops at step lens[b] (the reverse direction starts there), its state then
stays as it is and Y is zero; its gradient passes those steps untouched. Every array the kernels see is a view
of the caller's buffers (steps are strided views: X's layout decides the order of the rows).
"""
from __future__ import annotations

import math

import numpy as np

from edgetrain.ops.rnn import ACTIVATIONS, input_at, rnn_geometry

from ._jit import jit, when_numba_loads


TANH_F32 = 3     # a kernel-side code (ops.rnn.ACTIVATIONS has 0-2): Tanh for float32 results, see _act


@jit(inline="always")
def _act(code, v):
    if code == 0:
        if v >= 0:
            return 1.0 / (1.0 + math.exp(-v))
        e = math.exp(v)
        return e / (1.0 + e)
    if code == 1:
        return math.tanh(v)
    if code == TANH_F32:
        # libm's tanh was 3/4 of an LSTM step; (1 - e) / (1 + e) with e = exp(-2|v|) in float64 is within
        # 1e-12 relative of it for |v| >= 1e-4 (far below float32's rounding), v itself below that
        a = abs(v)
        e = math.exp(-2.0 * a)
        r = (1.0 - e) / (1.0 + e) if a >= 1e-4 else a
        return r if v >= 0 else -r
    return v if v > 0 else 0.0


@jit(inline="always")
def _dact(code, y):
    """The activation's derivative, from its output y."""
    if code == 0:
        return y * (1.0 - y)
    if code == 1 or code == TANH_F32:
        return 1.0 - y * y
    return 1.0 if y > 0 else 0.0


def _kernel_codes(acts, dtype):
    """The activation codes per direction as the step kernels take them (float32: the faster Tanh)."""
    if dtype != np.float32:
        return acts
    return tuple(tuple(TANH_F32 if a == ACTIVATIONS["tanh"] else a for a in per_dir) for per_dir in acts)


# --- the default activations (Sigmoid, Tanh, Tanh: the only ones ORT 1.19 trains), vectorizable -----------
# The general kernels switch on activation codes per element and call libm's exp: LLVM leaves those loops
# scalar. The "_std" kernels below fix the activations, keep every loop 1-D over a row and never read and
# write one array in the same loop (LLVM gives up on unknown distances within an array), and take exp from a
# polynomial in float64 that LLVM vectorizes.
# exp(x), x <= 0: 2**n exp(r), n = round(x / ln2) by the 1.5 * 2**52 shift (its low bits are n, so no
# float-to-int conversion, which AVX2 has no vector form of), r = x - n ln2 (ln2 in two parts), |r| <= ln2/2,
# Taylor to degree 12 (remainder < 2e-16 relative), evaluated by Estrin's scheme: within 2 ulp of float64,
# so float32 results round as from the exact value (float64 results keep libm's exp and tanh). Below -708 it
# gives exp(-708) (2**n stays normal), which no float32 sigmoid or tanh tells from 0; NaN gives NaN.
_ROUND_SHIFT = 6755399441055744.0
_LN2_HI, _LN2_LO, _LOG2E = 6.93147180369123816490e-01, 1.90821492927058770002e-10, 1.44269504088896338700e+00
_EXP_TAYLOR = tuple(1.0 / math.factorial(k) for k in range(13))      # 1/k!
DEFAULT_ACTS = (ACTIVATIONS["sigmoid"], ACTIVATIONS["tanh"], ACTIVATIONS["tanh"])


def _sigmoid(exp):
    def sigmoid(v):
        e = exp(-abs(np.float64(v)))
        return (1.0 if v >= 0 else e) / (1.0 + e)
    return sigmoid


def _tanh(exp):
    """Tanh as (1 - e) / (1 + e), e = exp(-2|v|), or its series to degree 7 for |v| < 0.01 (remainder below
    1e-17 relative; 1 - e cancels at most 3 digits above): correctly rounded for float32, float64 arguments
    included (float64 intermediates stored as float32), not for float64 results."""
    def tanh(v):
        a = abs(np.float64(v))
        e = exp(-2.0 * a)
        a2 = a * a
        series = a + a * a2 * (-1.0 / 3 + a2 * (2.0 / 15 - a2 * (17.0 / 315)))
        r = (1.0 - e) / (1.0 + e) if a >= 0.01 else series
        return r if v >= 0 else -r
    return tanh


_tanh_f32 = _tanh(math.exp)
_sigmoid_any = _sigmoid(math.exp)


def _rounds_to_f32(v, like):
    """Whether a gate's result is stored as float32: ``v`` is float32, or ``like`` (the destination, an
    array or a scalar) is (float64 intermediates of float32 data, such as a new cell state, take the fast
    form)."""
    return isinstance(v, np.float32) or getattr(like, "dtype", None) == np.float32


def gate_sigmoid(v, like=None):
    """Python's forms (NUMBA_DISABLE_JIT); Numba's take exp from ``_exp_nonpositive`` when the result is
    float32 (``like``: see ``_rounds_to_f32``)."""
    return _sigmoid_any(v)


def gate_tanh(v, like=None):
    return _tanh_f32(v) if _rounds_to_f32(v, like) else math.tanh(v)


def _exp_nonpositive(x):
    x = -708.0 if x < -708.0 else x       # NaN stays NaN
    t = x * _LOG2E + _ROUND_SHIFT
    n = t - _ROUND_SHIFT
    r = x - n * _LN2_HI - n * _LN2_LO
    # Estrin's scheme: 4 dependent multiply-adds instead of Horner's 12 (the loops were latency-bound: 1.6x
    # faster sigmoids); c = _EXP_TAYLOR
    c = _EXP_TAYLOR
    r2 = r * r
    r4 = r2 * r2
    p = (((c[0] + c[1] * r) + (c[2] + c[3] * r) * r2) + ((c[4] + c[5] * r) + (c[6] + c[7] * r) * r2) * r4
         + (((c[8] + c[9] * r) + (c[10] + c[11] * r) * r2) + c[12] * r4) * (r4 * r4))
    return p * np.int64((np.float64(t).view(np.int64) + 1023) << 52).view(np.float64)


def _numba_extensions(numba):
    """Numba's forms of ``gate_sigmoid`` and ``gate_tanh``: compiled with numpy's error model (no
    zero-division branch in the loop) and inlined by LLVM into the kernels; float32 takes the polynomial exp
    (float64 keeps libm's exp and tanh: the float32 form of Tanh loses float64 digits near 0). Registered when
    ``_jit`` loads Numba, and kept in this file so that editing them invalidates Numba's cache of the kernels
    using them."""
    types = numba.core.types

    def by_type(f32, other):
        def choose(v, like=None):
            dest = getattr(like, "dtype", like)
            fn = f32 if types.float32 in (v, dest) else other
            return lambda v, like=None: fn(v)
        return choose

    exp = numba.njit(inline="always", error_model="numpy")(_exp_nonpositive)
    forms = {gate_sigmoid: (_sigmoid(exp), _sigmoid(math.exp)),
             gate_tanh: (_tanh(exp), lambda v: math.tanh(v))}
    for fn, (f32, other) in forms.items():
        f32, other = (numba.njit(inline="always", error_model="numpy")(f) for f in (f32, other))
        numba.extending.overload(fn, jit_options={"error_model": "numpy"})(by_type(f32, other))


when_numba_loads(_numba_extensions)


@jit
def _lstm_step_std(xw, rec, wb, rb, p, h, c, y, call, iofc, save, t, lens, g64, c64):
    """``_lstm_step`` for Sigmoid, Tanh, Tanh. The gates and the new cell state stay in float64 until stored
    (g64 [4 * hidden] and c64 [hidden] hold them, as ``_lstm_step``'s registers do); rec receives the
    pre-activations. One gate per loop, each loop writing one array: LLVM vectorizes none of a loop that
    stores to one row at two offsets, or reads a row it writes at an unknown distance."""
    batch, hidden = h.shape
    for b in range(batch):
        if t >= lens[b]:
            y[b] = 0
            if save:
                call[b] = 0
                iofc[b] = 0
            continue
        a, xb, cb, hb, yb = rec[b], xw[b], c[b], h[b], y[b]
        for j in range(4 * hidden):
            a[j] = xb[j] + a[j] + wb[j] + rb[j]
        for j in range(hidden):
            g64[j] = gate_sigmoid(a[j] + p[j] * cb[j])
        for j in range(hidden):
            g64[2 * hidden + j] = gate_sigmoid(a[2 * hidden + j] + p[2 * hidden + j] * cb[j])
        for j in range(hidden):
            g64[3 * hidden + j] = gate_tanh(a[3 * hidden + j])
        for j in range(hidden):
            c64[j] = g64[2 * hidden + j] * cb[j] + g64[j] * g64[3 * hidden + j]
        for j in range(hidden):
            g64[hidden + j] = gate_sigmoid(a[hidden + j] + p[hidden + j] * c64[j], hb)
        for j in range(hidden):
            hb[j] = g64[hidden + j] * gate_tanh(c64[j], hb)
            yb[j] = hb[j]
            cb[j] = c64[j]
        if save:
            ib, cab = iofc[b], call[b]
            for j in range(4 * hidden):
                ib[j] = g64[j]
            for j in range(hidden):
                cab[j] = cb[j]


@jit
def _gru_gates_std(xw, rec, wb, rb, h, zrh, rh, t, lens):
    """``_gru_gates`` with Sigmoid."""
    batch, hidden = h.shape
    for b in range(batch):
        if t >= lens[b]:
            rh[b] = 0
            continue
        zb, xb, ab, hb, rhb = zrh[b], xw[b], rec[b], h[b], rh[b]
        for j in range(2 * hidden):
            zb[j] = gate_sigmoid(xb[j] + ab[j] + wb[j] + rb[j])
        for j in range(hidden):
            rhb[j] = zb[hidden + j] * hb[j]


@jit(inline="always")
def _gru_new_state(zb, hb, yb, n64, hidden):
    """One batch row's new state h = (1 - z) n + z h (into h and y) and the candidate n kept for the gradient
    (zb's third block): the common tail of ``_gru_finish_std`` and ``_gru_step_std``."""
    k = 2 * hidden
    for j in range(hidden):
        hb[j] = (1.0 - zb[j]) * n64[j] + zb[j] * hb[j]
        yb[j] = hb[j]
    for j in range(hidden):
        zb[k + j] = n64[j]


@jit
def _gru_finish_std(xw, rec, wb, rb, h, y, zrh, t, lens, n64):
    """``_gru_finish`` with Tanh, without linear_before_reset (with it: ``_gru_step_std``); the candidate
    stays in float64 (n64 [hidden]) until stored."""
    batch, hidden = h.shape
    for b in range(batch):
        if t >= lens[b]:
            y[b] = 0
            zrh[b] = 0
            continue
        zb, xb, ab, hb = zrh[b], xw[b], rec[b], h[b]
        k = 2 * hidden
        for j in range(hidden):
            n64[j] = gate_tanh(xb[k + j] + wb[k + j] + ab[k + j] + rb[k + j])
        _gru_new_state(zb, hb, y[b], n64, hidden)


@jit
def _gru_step_std(xw, rec, wb, rb, h, y, zrh, t, lens, n64):
    """A whole GRU step with linear_before_reset (rec holds h_{t-1} R^T for all three gates):
    ``_gru_gates_std`` and ``_gru_finish_std`` in one pass over the batch."""
    batch, hidden = h.shape
    k = 2 * hidden
    for b in range(batch):
        if t >= lens[b]:
            y[b] = 0
            zrh[b] = 0
            continue
        zb, xb, ab, hb = zrh[b], xw[b], rec[b], h[b]
        for j in range(k):
            zb[j] = gate_sigmoid(xb[j] + ab[j] + wb[j] + rb[j])
        for j in range(hidden):
            n64[j] = gate_tanh(xb[k + j] + wb[k + j] + zb[hidden + j] * (ab[k + j] + rb[k + j]))
        _gru_new_state(zb, hb, y[b], n64, hidden)


# --- forward steps ----------------------------------------------------------------------------------------

@jit
def _lstm_step(xw, rec, wb, rb, p, h, c, y, call, iofc, save, t, lens, fa, ga, ha):
    """One LSTM step over the batch: gates i, o, f, c from xw + rec + biases (+ peepholes), then the
    states."""
    batch, hidden = h.shape
    for b in range(batch):
        if t >= lens[b]:
            for j in range(hidden):
                y[b, j] = 0
            if save:
                for j in range(hidden):
                    call[b, j] = 0
                for j in range(4 * hidden):
                    iofc[b, j] = 0
            continue
        for j in range(hidden):
            cp = c[b, j]
            gi = _act(fa, xw[b, j] + rec[b, j] + wb[j] + rb[j] + p[j] * cp)
            gf = _act(fa, xw[b, 2 * hidden + j] + rec[b, 2 * hidden + j] + wb[2 * hidden + j]
                      + rb[2 * hidden + j] + p[2 * hidden + j] * cp)
            gc = _act(ga, xw[b, 3 * hidden + j] + rec[b, 3 * hidden + j] + wb[3 * hidden + j]
                      + rb[3 * hidden + j])
            cn = gf * cp + gi * gc
            go = _act(fa, xw[b, hidden + j] + rec[b, hidden + j] + wb[hidden + j] + rb[hidden + j]
                      + p[hidden + j] * cn)
            hn = go * _act(ha, cn)
            c[b, j] = cn
            h[b, j] = hn
            y[b, j] = hn
            if save:
                call[b, j] = cn
                iofc[b, j] = gi
                iofc[b, hidden + j] = go
                iofc[b, 2 * hidden + j] = gf
                iofc[b, 3 * hidden + j] = gc


@jit
def _gru_gates(xw, rec, wb, rb, h, zrh, rh, t, lens, fa):
    """GRU step, part one: z and r (into zrh) and r * h_{t-1} (into rh)."""
    batch, hidden = h.shape
    for b in range(batch):
        if t >= lens[b]:
            for j in range(hidden):
                rh[b, j] = 0
            continue
        for j in range(2 * hidden):
            zrh[b, j] = _act(fa, xw[b, j] + rec[b, j] + wb[j] + rb[j])
        for j in range(hidden):
            rh[b, j] = zrh[b, hidden + j] * h[b, j]


@jit
def _gru_finish(xw, rec, wb, rb, h, y, zrh, t, lens, ga, lbr):
    """GRU step, part two: the candidate ht~ (rec holds Rh (r * h) or, with linear_before_reset, Rh h) and the
    new state."""
    batch, hidden = h.shape
    for b in range(batch):
        if t >= lens[b]:
            for j in range(hidden):
                y[b, j] = 0
            for j in range(3 * hidden):
                zrh[b, j] = 0
            continue
        for j in range(hidden):
            k = 2 * hidden + j
            if lbr:
                a = xw[b, k] + wb[k] + zrh[b, hidden + j] * (rec[b, k] + rb[k])
            else:
                a = xw[b, k] + wb[k] + rec[b, k] + rb[k]
            n = _act(ga, a)
            z = zrh[b, j]
            hn = (1.0 - z) * n + z * h[b, j]
            zrh[b, k] = n
            h[b, j] = hn
            y[b, j] = hn


@jit
def _rnn_step(xw, rec, wb, rb, h, y, t, lens, fa):
    batch, hidden = h.shape
    for b in range(batch):
        if t >= lens[b]:
            for j in range(hidden):
                y[b, j] = 0
            continue
        for j in range(hidden):
            hn = _act(fa, xw[b, j] + rec[b, j] + wb[j] + rb[j])
            h[b, j] = hn
            y[b, j] = hn


# --- backward steps ---------------------------------------------------------------------------------------

@jit
def _lstm_back(dy, has_dy, iofc, call, cprev, p, dh, dc, dpre, dp, t, lens, fa, ga, ha):
    """dh, dc (gradients of this step's states) -> the gates' pre-activation gradients (dpre) and dc of the
    previous step; dh is consumed (the caller adds dpre R for the previous step); dp accumulates the
    peepholes' gradients."""
    batch, hidden = dh.shape
    for b in range(batch):
        if t >= lens[b]:
            for j in range(4 * hidden):
                dpre[b, j] = 0
            continue
        for j in range(hidden):
            dht = dh[b, j] + (dy[b, j] if has_dy else 0.0)
            gi, go = iofc[b, j], iofc[b, hidden + j]
            gf, gc = iofc[b, 2 * hidden + j], iofc[b, 3 * hidden + j]
            c, cp = call[b, j], cprev[b, j]
            tc = _act(ha, c)
            dao = dht * tc * _dact(fa, go)
            dct = dc[b, j] + dht * go * _dact(ha, tc) + dao * p[hidden + j]
            dai = dct * gc * _dact(fa, gi)
            daf = dct * cp * _dact(fa, gf)
            dac = dct * gi * _dact(ga, gc)
            dc[b, j] = dct * gf + dai * p[j] + daf * p[2 * hidden + j]
            dh[b, j] = 0
            dpre[b, j] = dai
            dpre[b, hidden + j] = dao
            dpre[b, 2 * hidden + j] = daf
            dpre[b, 3 * hidden + j] = dac
            dp[j] += dai * cp
            dp[hidden + j] += dao * c
            dp[2 * hidden + j] += daf * cp


@jit
def _lstm_back_std(dy, has_dy, iofc, call, cprev, p, dh, dc, dpre, dp, t, lens, tc64, dct64, da64):
    """``_lstm_back`` for Sigmoid, Tanh, Tanh, in loops LLVM vectorizes (see ``_lstm_step_std``): tanh(c), dc
    and the gates' gradients stay in float64 (tc64, dct64 [hidden], da64 [4 * hidden]) until stored."""
    batch, hidden = dh.shape
    h2, h3 = 2 * hidden, 3 * hidden
    for b in range(batch):
        if t >= lens[b]:
            dpre[b] = 0
            continue
        g, dyb, dhb, dcb, cb, cpb = iofc[b], dy[b], dh[b], dc[b], call[b], cprev[b]
        for j in range(hidden):
            tc64[j] = gate_tanh(cb[j])
        for j in range(hidden):      # the output gate's, dao
            go = g[hidden + j]
            da64[hidden + j] = (dhb[j] + (dyb[j] if has_dy else 0.0)) * tc64[j] * (go * (1.0 - go))
        for j in range(hidden):
            dht = dhb[j] + (dyb[j] if has_dy else 0.0)
            dct64[j] = (dcb[j] + dht * g[hidden + j] * (1.0 - tc64[j] * tc64[j])
                        + da64[hidden + j] * p[hidden + j])
        for j in range(hidden):
            da64[j] = dct64[j] * g[h3 + j] * (g[j] * (1.0 - g[j]))
        for j in range(hidden):
            da64[h2 + j] = dct64[j] * cpb[j] * (g[h2 + j] * (1.0 - g[h2 + j]))
        for j in range(hidden):
            da64[h3 + j] = dct64[j] * g[j] * (1.0 - g[h3 + j] * g[h3 + j])
        for j in range(hidden):
            dcb[j] = dct64[j] * g[h2 + j] + da64[j] * p[j] + da64[h2 + j] * p[h2 + j]
        dhb[:] = 0
        pb = dpre[b]
        for j in range(4 * hidden):
            pb[j] = da64[j]
        for j in range(hidden):
            dp[j] += da64[j] * cpb[j]
        for j in range(hidden):
            dp[hidden + j] += da64[hidden + j] * cb[j]
        for j in range(hidden):
            dp[h2 + j] += da64[h2 + j] * cpb[j]


@jit
def _gru_back(dy, has_dy, zrh, hprev, q, dh, dpre, drec, t, lens, fa, ga, lbr):
    """dh -> the gates' pre-activation gradients; with linear_before_reset complete (drec's candidate part is
    dq = da_h * r, q = Rh h + Rbh), else r's waits for Rh^T da_h (``_gru_back_reset``). dh becomes the direct
    part z * dh of the previous step's."""
    batch, hidden = dh.shape
    for b in range(batch):
        if t >= lens[b]:
            for j in range(3 * hidden):
                dpre[b, j] = 0
                drec[b, j] = 0
            continue
        for j in range(hidden):
            dht = dh[b, j] + (dy[b, j] if has_dy else 0.0)
            z, r, n = zrh[b, j], zrh[b, hidden + j], zrh[b, 2 * hidden + j]
            hp = hprev[b, j]
            dah = dht * (1.0 - z) * _dact(ga, n)
            daz = dht * (hp - n) * _dact(fa, z)
            dh[b, j] = dht * z
            dpre[b, j] = daz
            drec[b, j] = daz
            dpre[b, 2 * hidden + j] = dah
            if lbr:
                dar = dah * q[b, j] * _dact(fa, r)
                dpre[b, hidden + j] = dar
                drec[b, hidden + j] = dar
                drec[b, 2 * hidden + j] = dah * r
            else:
                drec[b, 2 * hidden + j] = dah


@jit
def _gru_back_std(dy, has_dy, zrh, hprev, q, dh, dpre, drec, t, lens, lbr):
    """``_gru_back`` for Sigmoid, Tanh, in loops LLVM vectorizes (see ``_lstm_step_std``): each loop writes
    one array at one offset, and recomputes dh_t and da_h (a few products) rather than storing them."""
    batch, hidden = dh.shape
    h2 = 2 * hidden
    for b in range(batch):
        if t >= lens[b]:
            dpre[b] = 0
            drec[b] = 0
            continue
        g, dyb, dhb, hpb, pb, rb = zrh[b], dy[b], dh[b], hprev[b], dpre[b], drec[b]
        for j in range(hidden):      # da_z
            pb[j] = (dhb[j] + (dyb[j] if has_dy else 0.0)) * (hpb[j] - g[h2 + j]) * (g[j] * (1.0 - g[j]))
        for j in range(hidden):      # da_h
            pb[h2 + j] = (dhb[j] + (dyb[j] if has_dy else 0.0)) * (1.0 - g[j]) * (1.0 - g[h2 + j] * g[h2 + j])
        for j in range(hidden):
            rb[j] = pb[j]
        if lbr:
            qb = q[b]
            for j in range(hidden):      # da_r
                dah = (dhb[j] + (dyb[j] if has_dy else 0.0)) * (1.0 - g[j]) * (1.0 - g[h2 + j] * g[h2 + j])
                pb[hidden + j] = dah * qb[j] * (g[hidden + j] * (1.0 - g[hidden + j]))
            for j in range(hidden):
                rb[hidden + j] = pb[hidden + j]
            for j in range(hidden):
                dah = (dhb[j] + (dyb[j] if has_dy else 0.0)) * (1.0 - g[j]) * (1.0 - g[h2 + j] * g[h2 + j])
                rb[h2 + j] = dah * g[hidden + j]
        else:
            for j in range(hidden):
                rb[h2 + j] = pb[h2 + j]
        for j in range(hidden):
            dhb[j] = (dhb[j] + (dyb[j] if has_dy else 0.0)) * g[j]


@jit
def _gru_back_reset(drh, zrh, hprev, dh, dpre, drec, t, lens, fa):
    """Without linear_before_reset: drh = da_h Rh is the gradient of r * h_{t-1}: r's pre-activation gradient
    and h_{t-1}'s share through r."""
    batch, hidden = dh.shape
    for b in range(batch):
        if t >= lens[b]:
            continue
        for j in range(hidden):
            r = zrh[b, hidden + j]
            dar = drh[b, j] * hprev[b, j] * _dact(fa, r)
            dpre[b, hidden + j] = dar
            drec[b, hidden + j] = dar
            dh[b, j] += drh[b, j] * r


@jit
def _rnn_back(dy, has_dy, y, dh, dpre, t, lens, fa):
    batch, hidden = dh.shape
    for b in range(batch):
        if t >= lens[b]:
            for j in range(hidden):
                dpre[b, j] = 0
            continue
        for j in range(hidden):
            dpre[b, j] = (dh[b, j] + (dy[b, j] if has_dy else 0.0)) * _dact(fa, y[b, j])
            dh[b, j] = 0


@jit
def _previous(states, initial, prev, reverse, lens):
    """prev[t, b] = the state step t started from: the state of the step before it in its direction, or the
    initial one (states and prev are [T, B, H])."""
    seq, batch, hidden = states.shape
    for t in range(seq):
        for b in range(batch):
            first = (t + 1 >= lens[b]) if reverse else (t == 0)
            for j in range(hidden):
                if first:
                    prev[t, b, j] = initial[b, j]
                else:
                    prev[t, b, j] = states[t + 1 if reverse else t - 1, b, j]


@jit
def _times_reset(zrh, hprev, out):
    """out[t, b] = r * h_{t-1} (zrh, hprev and out are [T, B, .])."""
    seq, batch, hidden = hprev.shape
    for t in range(seq):
        for b in range(batch):
            for j in range(hidden):
                out[t, b, j] = zrh[t, b, hidden + j] * hprev[t, b, j]


# --- launchers --------------------------------------------------------------------------------------------

class _Views:
    """Index helpers shared by the launchers: [T, B, ...] views of X-ordered rows, Y and saved tensors."""

    def __init__(self, ctx):
        self.g = g = rnn_geometry(ctx)
        self.ctx = ctx
        self.dtype = ctx.type(0).dtype
        self.gh = g.gates * g.hidden
        self.zeros_b = np.zeros((g.directions, 2 * self.gh), self.dtype)
        self.zeros_p = np.zeros((g.directions, 3 * g.hidden), self.dtype)
        self.zeros_state = np.zeros((g.directions, g.batch, g.hidden), self.dtype)
        self.zeros_step = np.zeros((g.batch, g.hidden), self.dtype)
        self.full = np.full(g.batch, g.seq, np.int32)
        self.acts = _kernel_codes(g.acts, self.dtype)
        # per direction: the default activations, run by the "_std" kernels
        self.std = tuple(a == DEFAULT_ACTS[:len(a)] for a in g.acts)
        self.order = [range(g.seq - 1, -1, -1) if r else range(g.seq) for r in g.reverse]

    def rows(self, a, width):
        """[T*B, width] rows in X's order as [T, B, width]."""
        g = self.g
        return a.reshape(g.seq, g.batch, width) if g.layout == 0 else \
            a.reshape(g.batch, g.seq, width).swapaxes(0, 1)

    def y(self, y):
        """Y as [T, D, B, H] whatever the layout."""
        return y if self.g.layout == 0 else y.transpose(1, 2, 0, 3)

    def state(self, s):
        """A state input or output as [D, B, H]."""
        if s is None:
            return self.zeros_state
        return s if self.g.layout == 0 else s.swapaxes(0, 1)

    def lens(self, sl, at=4):
        if sl is None:
            return self.full
        bad = np.flatnonzero((sl < 1) | (sl > self.g.seq))
        if bad.size:
            raise self.ctx.bad_value(at, sl, int(bad[0]), f"a sequence length in [1, {self.g.seq}]")
        return sl

    def bias(self, bias, d):
        b = self.zeros_b if bias is None else bias
        return b[d, :self.gh], b[d, self.gh:]


def _arg(args, i):
    return args[i] if i < len(args) else None


def _forward(ctx, cell):
    v = _Views(ctx)
    g = v.g
    n_in, n_out = len(ctx.node.inputs), len(ctx.node.outputs)
    gh, hidden = v.gh, g.hidden
    training = ctx.node.op_type.endswith("Training")
    # Y and GRU's gates when the node does not output them (made once: a step never allocates)
    y_scratch = np.empty(g.y_shape(), v.dtype) if n_out == 0 or not ctx.node.outputs[0] else None
    gates = np.empty((g.seq, g.batch, gh), v.dtype) if cell == "GRU" and not training else None
    g64, c64 = np.empty(gh), np.empty(hidden)      # the "_std" kernels' float64 rows
    rt = np.empty((hidden, gh), v.dtype)            # R^T of one direction

    def run(*args):
        x, w, r = args[0], args[1], args[2]
        bias, sl, h0 = _arg(args[:n_in], 3), _arg(args[:n_in], 4), _arg(args[:n_in], 5)
        c0, p = (_arg(args[:n_in], 6), _arg(args[:n_in], 7)) if cell == "LSTM" else (None, None)
        outs = list(args[n_in:n_in + n_out]) + [None] * 5
        xw, rec, h, c = args[n_in + n_out:]
        lens = v.lens(sl)
        np.matmul(x.reshape(g.seq * g.batch, g.inputs), w.reshape(g.directions * gh, g.inputs).T, out=xw)
        xw4 = v.rows(xw, g.directions * gh)
        y4 = v.y(outs[0] if outs[0] is not None else y_scratch)
        h0v, c0v = v.state(h0), v.state(c0)
        if cell == "LSTM":
            call, iofc = (outs[3], outs[4]) if training else (None, None)
        zrh = outs[2] if cell == "GRU" and training else None
        for d in range(g.directions):
            wb, rb = v.bias(bias, d)
            np.copyto(h, h0v[d])
            acts = v.acts[d]
            np.copyto(rt, r[d].T)       # the step GEMMs read R^T by rows (an eighth faster than R's columns)
            # np.dot: h, rt and rec are C-contiguous, and its call costs 0.4 us less than np.matmul's
            xd = xw4[:, :, d * gh:(d + 1) * gh]
            if cell == "LSTM":
                np.copyto(c, c0v[d])
                pd = (v.zeros_p if p is None else p)[d]
                step = _lstm_step_std if v.std[d] else _lstm_step
                last = (g64, c64) if v.std[d] else acts
                for t in v.order[d]:
                    np.dot(h, rt, out=rec)
                    saved = (call[t, d], iofc[t, d]) if training else (rec, rec)
                    step(xd[t], rec, wb, rb, pd, h, c, y4[t, d], *saved, training, t, lens, *last)
            elif cell == "GRU" and g.linear_before_reset:
                for t in v.order[d]:
                    zt = zrh[t, d] if zrh is not None else gates[t]
                    np.dot(h, rt, out=rec)
                    if v.std[d]:
                        _gru_step_std(xd[t], rec, wb, rb, h, y4[t, d], zt, t, lens, c64)
                    else:
                        _gru_gates(xd[t], rec, wb, rb, h, zt, c, t, lens, acts[0])
                        _gru_finish(xd[t], rec, wb, rb, h, y4[t, d], zt, t, lens, acts[1], True)
            elif cell == "GRU":
                std = v.std[d]
                for t in v.order[d]:
                    zt = zrh[t, d] if zrh is not None else gates[t]
                    np.matmul(h, rt[:, :2 * hidden], out=rec[:, :2 * hidden])
                    if std:
                        _gru_gates_std(xd[t], rec, wb, rb, h, zt, c, t, lens)
                    else:
                        _gru_gates(xd[t], rec, wb, rb, h, zt, c, t, lens, acts[0])
                    np.matmul(c, rt[:, 2 * hidden:], out=rec[:, 2 * hidden:])
                    if std:
                        _gru_finish_std(xd[t], rec, wb, rb, h, y4[t, d], zt, t, lens, c64)
                    else:
                        _gru_finish(xd[t], rec, wb, rb, h, y4[t, d], zt, t, lens, acts[1], False)
            else:
                for t in v.order[d]:
                    np.dot(h, rt, out=rec)
                    _rnn_step(xd[t], rec, wb, rb, h, y4[t, d], t, lens, acts[0])
            # the final states: the state each sequence ended in
            if outs[1] is not None:
                np.copyto(v.state(outs[1])[d], h)
            if cell == "LSTM" and outs[2] is not None:
                np.copyto(v.state(outs[2])[d], c)
    return run


def lstm(ctx):
    """Launcher of LSTM and com.microsoft LSTMTraining: ``run(X, W, R, [B, sequence_lens, initial_h,
    initial_c, P], Y, [Y_h, Y_c, CAll, IOFC], xw, rec, h, c)``."""
    return _forward(ctx, "LSTM")


def gru(ctx):
    """Launcher of GRU and com.microsoft GRUTraining (outputs Y, Y_h, ZRH)."""
    return _forward(ctx, "GRU")


def rnn(ctx):
    return _forward(ctx, "RNN")


def _backward(ctx, cell):
    v = _Views(ctx)
    g = v.g
    n_in, n_out = len(ctx.node.inputs), len(ctx.node.outputs)
    at = input_at(ctx.node.op_type)
    gh, hidden, rows = v.gh, g.hidden, g.seq * g.batch
    lbr = g.linear_before_reset
    dp_scratch = np.empty(3 * hidden, v.dtype)     # peephole gradients nobody asked for
    tc64, dct64, da64 = np.empty(hidden), np.empty(hidden), np.empty(gh)     # _lstm_back_std's float64 rows
    ones = np.ones(rows, v.dtype)      # dB as a GEMV over the steps' rows: twice np.sum's column sums' speed

    def run(*args):
        ins = dict(zip(at, args[:n_in]))      # by name; an absent input is missing or None
        outs = list(args[n_in:n_in + n_out]) + [None] * (7 - n_out)
        ws = args[n_in + n_out:]
        dpre, hp, aux, dh, dc, tmp = ws[:6]
        drec = ws[6] if cell == "GRU" else dpre
        x, w, r = args[0], args[1], args[2]
        bias, sl, h0 = ins.get("B"), ins.get("SL"), ins.get("H0")
        lens = v.lens(sl, at["SL"])
        y4 = v.y(ins["HAll"])
        dy = ins.get("dY")
        dy4 = v.y(dy) if dy is not None else None
        dyh = ins.get("dY_h")
        h0v = v.state(h0)
        dpre4, drec4 = v.rows(dpre, g.directions * gh), v.rows(drec, g.directions * gh)
        hp3, aux3 = v.rows(hp, hidden), v.rows(aux, hidden)
        dx, dw, dr, db, dh0 = outs[:5]
        for d in range(g.directions):
            acts = v.acts[d]
            reverse = g.reverse[d]
            rb = v.bias(bias, d)[1]
            np.copyto(dh, v.state(dyh)[d] if dyh is not None else v.zeros_step)
            _previous(y4[:, d], h0v[d], hp3, reverse, lens)
            dpd, drd = dpre4[:, :, d * gh:(d + 1) * gh], drec4[:, :, d * gh:(d + 1) * gh]
            rd = r[d]
            steps = v.order[d][::-1]
            if cell == "LSTM":
                call4, iofc4 = ins.get("CAll"), ins.get("IOFC")
                _previous(call4[:, d], v.state(ins.get("C0"))[d], aux3, reverse, lens)
                dyc = ins.get("dY_c")
                np.copyto(dc, v.state(dyc)[d] if dyc is not None else v.zeros_step)
                p = (v.zeros_p if ins.get("P") is None else ins["P"])[d]
                dp = outs[6][d] if outs[6] is not None else dp_scratch
                dp[:] = 0
                back = _lstm_back_std if v.std[d] else _lstm_back
                last = (tc64, dct64, da64) if v.std[d] else acts
                for t in steps:
                    dyt = dy4[t, d] if dy4 is not None else dh
                    back(dyt, dy4 is not None, iofc4[t, d], call4[t, d], aux3[t], p, dh, dc, dpd[t], dp, t,
                         lens, *last)
                    np.matmul(dpd[t], rd, out=tmp)
                    np.add(dh, tmp, out=dh)
            elif cell == "GRU":
                zrh4 = ins.get("ZRH")
                if lbr:   # q = Rh h_{t-1} + Rbh for every step at once
                    np.matmul(hp, rd[2 * hidden:].T, out=aux)
                    np.add(aux, rb[2 * hidden:], out=aux)
                back = _gru_back_std if v.std[d] else _gru_back
                last = () if v.std[d] else acts[:2]
                for t in steps:
                    dyt = dy4[t, d] if dy4 is not None else dh
                    back(dyt, dy4 is not None, zrh4[t, d], hp3[t], aux3[t], dh, dpd[t], drd[t], t, lens,
                         *last, lbr)
                    if lbr:
                        np.matmul(drd[t], rd, out=tmp)
                    else:
                        np.matmul(dpd[t][:, 2 * hidden:], rd[2 * hidden:], out=tmp)
                        _gru_back_reset(tmp, zrh4[t, d], hp3[t], dh, dpd[t], drd[t], t, lens, acts[0])
                        np.matmul(drd[t][:, :2 * hidden], rd[:2 * hidden], out=tmp)
                    np.add(dh, tmp, out=dh)
                if not lbr:   # Rh's operand is r * h_{t-1}
                    _times_reset(zrh4[:, d], hp3, aux3)
            else:
                for t in steps:
                    _rnn_back(dy4[t, d] if dy4 is not None else dh, dy4 is not None, y4[t, d], dh, dpd[t], t,
                              lens, acts[0])
                    np.matmul(dpd[t], rd, out=tmp)
                    np.add(dh, tmp, out=dh)
            if dh0 is not None:
                np.copyto(v.state(dh0)[d], dh)
            if cell == "LSTM" and outs[5] is not None:
                np.copyto(v.state(outs[5])[d], dc)
            cols = slice(d * gh, (d + 1) * gh)
            if dr is not None:
                if cell == "GRU" and not lbr:
                    np.matmul(drec[:, cols][:, :2 * hidden].T, hp, out=dr[d, :2 * hidden])
                    np.matmul(drec[:, cols][:, 2 * hidden:].T, aux, out=dr[d, 2 * hidden:])
                else:
                    np.matmul(drec[:, cols].T, hp, out=dr[d])
            if dw is not None:
                np.matmul(dpre[:, cols].T, x.reshape(rows, g.inputs), out=dw[d])
            if db is not None:
                np.matmul(ones, dpre[:, cols], out=db[d, :gh])
                if drec is dpre:
                    np.copyto(db[d, gh:], db[d, :gh])
                else:
                    np.matmul(ones, drec[:, cols], out=db[d, gh:])
        if dx is not None:
            np.matmul(dpre, w.reshape(g.directions * gh, g.inputs), out=dx.reshape(rows, g.inputs))
    return run


def lstm_grad(ctx):
    """Launcher of com.microsoft LSTMGrad: ``run(X, W, R, sequence_lens, initial_h, initial_c, HAll, CAll, IOFC,
    dHAll, dHt, dCt[, P], dX, dW, dR, dB, dH0, dC0, dP, *workspace)`` (``ops.rnn.INPUTS``; absent ones None)."""
    return _backward(ctx, "LSTM")


def gru_grad(ctx):
    return _backward(ctx, "GRU")


def rnn_grad(ctx):
    return _backward(ctx, "RNN")
