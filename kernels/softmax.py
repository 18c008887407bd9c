"""Softmax, LogSoftmax, SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss: one fused kernel each (max, sum of exp, normalize).

X is viewed as ``[outer, n, inner]`` with ``n`` the softmax axis. When ``inner == 1`` rows are contiguous and
the max/sum stay in registers; otherwise a ``[2, inner]`` workspace holds them so every pass walks X in memory
order. float32 uses ``fast_exp``, a polynomial exp that LLVM vectorizes (``math.exp`` is a scalar libm call,
4-6x slower here), and sums in float32 vector lanes; float64 uses ``math.exp`` and float64 sums.

LogSoftmax stores ``x - max`` first and subtracts ``log(sum)`` in a later pass: with fastmath in one
expression, ``(x - max) - log(sum)`` may be reassociated into ``x - (max + log(sum))``, which loses digits in
float32 for large scores.
"""
from __future__ import annotations

import math

import numpy as np

from edgetrain.ops.softmax import REDUCTIONS, sce_reduction, softmax_view

from . import bindable, by_rows, checked
from ._jit import FASTMATH, jit, when_numba_loads

# Cephes expf: exp(x) = 2**n * exp(r), r = x - n*ln2 (ln2 split in two), |r| <= ln2/2, degree-7 polynomial.
_LOG2E = 1.44269504088896341
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
_EXP_LO, _EXP_HI = -87.33654, 88.37626   # below: 0 (2**n would be subnormal); above: inf (2**n would overflow)


def fast_exp(x):
    """exp(x) within 3 ulp for float32 on [-87.3, 88.4] (0 below, inf above, NaN kept); float64: math.exp."""
    return math.exp(x)


_int_bits_as_float32 = None   # Numba's intrinsic, made by _numba_extensions


def _exp32(x):
    f = np.float32
    xc = x if x > f(_EXP_LO) else f(_EXP_LO)      # NaN goes to _EXP_LO too, so n below is always an integer
    xc = xc if xc < f(_EXP_HI) else f(_EXP_HI)
    n = np.floor(xc * f(_LOG2E) + f(0.5))
    r = xc - n * f(_LN2_HI) - n * f(_LN2_LO)
    p = f(_EXP_POLY[0])
    p = p * r + f(_EXP_POLY[1])
    p = p * r + f(_EXP_POLY[2])
    p = p * r + f(_EXP_POLY[3])
    p = p * r + f(_EXP_POLY[4])
    p = p * r + f(_EXP_POLY[5])
    p = p * r * r + r + f(1.0)
    e = p * _int_bits_as_float32((np.int32(n) + np.int32(127)) << np.int32(23))
    return f(0.0) if x < f(_EXP_LO) else (f(np.inf) if x > f(_EXP_HI) else (e if x == x else x))


def _numba_extensions(numba):
    """Numba's forms of ``fast_exp`` and its bit cast, registered when ``_jit`` loads Numba (before any kernel
    compiles): a warm process that runs ahead-of-time kernels never loads it. They stay in this file so that
    editing them invalidates Numba's cache of the kernels using them."""
    global _int_bits_as_float32
    types = numba.core.types

    @numba.extending.intrinsic
    def _int_bits_as_float32(typingctx, i):
        """The float32 whose bit pattern is the low 32 bits of integer ``i``."""
        if not isinstance(i, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            v = args[0]
            if i.bitwidth != 32:
                v = builder.trunc(v, context.get_value_type(types.int32))
            return builder.bitcast(v, context.get_value_type(types.float32))
        return types.float32(i), codegen

    @numba.extending.overload(fast_exp, jit_options={"fastmath": set(FASTMATH)})   # LLVM inlines it into the caller
    def _fast_exp_impl(x):
        if x == types.float32:
            return _exp32
        return lambda x: math.exp(x)


when_numba_loads(_numba_extensions)


def softmax(ctx):
    """y = exp(x - max) / sum(exp(x - max)) along the axis."""
    return _launcher(ctx, False)


def hardmax(ctx):
    view = softmax_view(ctx)

    def run(x, y):
        _hardmax(x.reshape(view), y.reshape(view))
    return run


@jit
def _hardmax(x, y):
    """y[o, :, i] = one-hot of the first largest x[o, :, i] (the first NaN, as numpy's argmax)."""
    outer, n, inner = x.shape
    y[:] = 0
    for o in range(outer):
        for i in range(inner):
            best = 0
            for k in range(1, n):
                if x[o, best, i] != x[o, best, i]:
                    break
                if x[o, k, i] > x[o, best, i] or x[o, k, i] != x[o, k, i]:
                    best = k
            if n > 0:
                y[o, best, i] = 1


def log_softmax(ctx):
    """y = (x - max) - log(sum(exp(x - max))) along the axis."""
    return _launcher(ctx, True)


def _launcher(ctx, log: bool):
    outer, n, inner = softmax_view(ctx)
    if outer * n * inner == 0:
        def run_empty(x, y, *ws):
            pass
        return run_empty
    if inner == 1:
        @bindable
        def bind_rows(x, y):
            return by_rows([(_softmax_rows, (x.reshape(outer, n), y.reshape(outer, n), log), (1, 1, 0))], outer, n)
        return bind_rows

    @bindable
    def bind_strided(x, y, ws):
        return _softmax_strided, (x.reshape(outer, n, inner), y.reshape(outer, n, inner), ws, log)
    return bind_strided


@jit(inline="always")     # called once a row: inlined, a row of 32 costs no call and no view of it
def _row_max(row):
    """max(row) with 8 running maxima, which LLVM vectorizes without reordering a reduction (no nnan flag)."""
    n = row.shape[0]
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = row[0]
    k = 0
    while k + 8 <= n:
        a0 = row[k] if row[k] > a0 else a0
        a1 = row[k + 1] if row[k + 1] > a1 else a1
        a2 = row[k + 2] if row[k + 2] > a2 else a2
        a3 = row[k + 3] if row[k + 3] > a3 else a3
        a4 = row[k + 4] if row[k + 4] > a4 else a4
        a5 = row[k + 5] if row[k + 5] > a5 else a5
        a6 = row[k + 6] if row[k + 6] > a6 else a6
        a7 = row[k + 7] if row[k + 7] > a7 else a7
        k += 8
    m = max(max(max(a0, a1), max(a2, a3)), max(max(a4, a5), max(a6, a7)))
    while k < n:
        m = row[k] if row[k] > m else m
        k += 1
    return m


@jit(fastmath=True)
def _softmax_rows(x, y, log):
    rows, n = x.shape
    for r in range(rows):
        m = _row_max(x[r])
        s = y.dtype.type(0.0)
        if log:
            for k in range(n):
                d = x[r, k] - m
                y[r, k] = d
                s += fast_exp(d)
            ls = y.dtype.type(math.log(s))
            for k in range(n):
                y[r, k] -= ls
        else:
            for k in range(n):
                e = fast_exp(x[r, k] - m)
                y[r, k] = e
                s += e
            inv = y.dtype.type(1.0) / s
            for k in range(n):
                y[r, k] *= inv


@jit(fastmath=True)
def _softmax_strided(x, y, ws, log):
    outer, n, inner = x.shape
    mx = ws[0]
    s = ws[1]
    for o in range(outer):
        for i in range(inner):
            mx[i] = x[o, 0, i]
            s[i] = 0.0
        for k in range(1, n):
            for i in range(inner):
                if x[o, k, i] > mx[i]:
                    mx[i] = x[o, k, i]
        for k in range(n):
            for i in range(inner):
                d = x[o, k, i] - mx[i]
                e = fast_exp(d)
                s[i] += e
                y[o, k, i] = d if log else e
        if log:
            for i in range(inner):
                s[i] = math.log(s[i])
            for k in range(n):
                for i in range(inner):
                    y[o, k, i] -= s[i]
        else:
            for i in range(inner):
                s[i] = 1.0 / s[i]
            for k in range(n):
                for i in range(inner):
                    y[o, k, i] *= s[i]


# --- SoftmaxCrossEntropyLoss ------------------------------------------------------------------------------

def _sce_config(ctx, scores_input: int):
    """Scores viewed as [n, c, d]; reduction index; ignore_index as (has, value)."""
    shape = ctx.shape(scores_input)
    n, c, d = int(shape[0]), int(shape[1]), int(np.prod(shape[2:], dtype=np.int64))
    ignore = ctx.attr("ignore_index")
    return n, c, d, REDUCTIONS.index(sce_reduction(ctx)), ignore is not None, int(ignore or 0)


def _labels_allowed(c: int, has_ignore: bool, ignore: int) -> str:
    return f"a class index in [0, {c})" + (f" nor ignore_index {ignore}" if has_ignore else "")


def softmax_cross_entropy(ctx):
    """log_prob = LogSoftmax(scores, axis=1); loss[i, d] = -log_prob[i, label, d] * w[label] (0 where
    label == ignore_index), then summed, or divided by the sum of the weights of the non-ignored samples.
    A label outside [0, C) (other than ignore_index) raises InputError."""
    return _label_loss_launcher(ctx, True)


def nll_loss(ctx):
    """NegativeLogLikelihoodLoss: SoftmaxCrossEntropyLoss's loss with the input taken as log_prob as it is."""
    return _label_loss_launcher(ctx, False)


def _label_loss_launcher(ctx, softmax: bool):
    n, c, d, reduction, has_ignore, ignore = _sce_config(ctx, 0)
    has_weights = ctx.has_input(2)
    n_in = len(ctx.node.inputs)
    want_log_prob = len(ctx.node.outputs) > 1 and bool(ctx.node.outputs[1])
    dummy_lp = np.empty((1, 1, 1), ctx.type(0).dtype)
    dummy_w = np.ones(1, ctx.type(0).dtype)
    allowed = _labels_allowed(c, has_ignore, ignore)

    @bindable
    def bind(*args):
        scores, labels = args[0], args[1]
        weights = args[2] if has_weights else dummy_w
        loss = args[n_in]
        log_prob = args[n_in + 1].reshape(n, c, d) if want_log_prob else dummy_lp
        call = (scores.reshape(n, c, d), labels.reshape(n, d), weights, has_weights, has_ignore, ignore,
                reduction, loss.reshape(-1), log_prob, want_log_prob, softmax)
        return checked(_sce, call, ctx, 1, labels, allowed)
    return bind


@jit
def _sce(x, labels, weights, has_weights, has_ignore, ignore, reduction, loss, log_prob, want_log_prob, softmax):
    """Returns -1, or the flat index of the first label outside [0, c) that is not ignore_index (checked before
    it indexes ``x`` or ``weights``; the outputs are then incomplete). Without ``softmax`` ``x`` is log_prob
    already (NegativeLogLikelihoodLoss): m and log(sum) are 0."""
    n, c, d = x.shape
    total = np.float64(0.0)
    wsum = np.float64(0.0)
    for i in range(n):
        for j in range(d):
            lab = labels[i, j]
            ignored = has_ignore and lab == ignore
            if not ignored and (lab < 0 or lab >= c):
                return i * d + j
            m = np.float64(0.0)   # float64 without the JIT too (numpy: float32 - 0.5 is float32)
            ls = 0.0
            if softmax:
                m = np.float64(x[i, 0, j])
                for k in range(1, c):
                    if x[i, k, j] > m:
                        m = np.float64(x[i, k, j])
                s = 0.0
                for k in range(c):
                    s += math.exp(x[i, k, j] - m)
                ls = math.log(s)
            if want_log_prob:
                for k in range(c):
                    log_prob[i, k, j] = (x[i, k, j] - m) - ls
            li = 0.0
            w = 0.0
            if not ignored:
                w = weights[lab] if has_weights else 1.0
                li = -((x[i, lab, j] - m) - ls) * w
            if reduction == 0:
                loss[i * d + j] = li
            total += li
            wsum += w
    if reduction == 1:
        loss[0] = total
    elif reduction == 2:
        loss[0] = np.divide(total, wsum)   # IEEE: weights summing to 0 (all ignored) give NaN or inf, as numpy
    return -1


def softmax_cross_entropy_grad(ctx):
    """A label outside [0, C) (other than ignore_index) raises InputError."""
    return _label_loss_grad_launcher(ctx, True)


def nll_loss_grad(ctx):
    """NegativeLogLikelihoodLossGrad(dY, input, target[, weight]): the input is read for its shape only."""
    return _label_loss_grad_launcher(ctx, False)


def _label_loss_grad_launcher(ctx, softmax: bool):
    n, c, d, reduction, has_ignore, ignore = _sce_config(ctx, 1)
    has_weights = ctx.has_input(3)
    dummy_w = np.ones(1, ctx.type(1).dtype)
    n_in = len(ctx.node.inputs)
    allowed = _labels_allowed(c, has_ignore, ignore)

    @bindable
    def bind(*args):
        dy, log_prob, labels = args[0], args[1], args[2]
        weights = args[3] if has_weights else dummy_w
        call = (dy.reshape(-1), log_prob.reshape(n, c, d), labels.reshape(n, d), weights, has_weights,
                has_ignore, ignore, reduction, args[n_in].reshape(n, c, d), softmax)
        return checked(_sce_grad, call, ctx, 2, labels, allowed)
    return bind


@jit
def _sce_grad(dy, log_prob, labels, weights, has_weights, has_ignore, ignore, reduction, dx, softmax):
    """Returns -1, or the flat index of the first label outside [0, c) that is not ignore_index (checked in the
    first loop that reads the labels, before one indexes ``weights`` or selects a class). Without ``softmax``
    (NegativeLogLikelihoodLoss) the loss is linear in its input: no exp(log_prob) term. exp(log_prob) is
    ``fast_exp`` (float32: within 3 ulp, gradients within 1 ulp of libm's; 3x faster on a 32x10 batch, where
    libm's exp was most of the kernel); the forward keeps libm's exp: a loss from the same weights is ORT's to
    the bit."""
    n, c, d = log_prob.shape
    wsum = np.float64(0.0)
    if reduction == 2:
        for i in range(n):
            for j in range(d):
                lab = labels[i, j]
                if not (has_ignore and lab == ignore):
                    if lab < 0 or lab >= c:
                        return i * d + j
                    wsum += weights[lab] if has_weights else 1.0
    for i in range(n):
        for j in range(d):
            lab = labels[i, j]
            if has_ignore and lab == ignore:
                for k in range(c):
                    dx[i, k, j] = 0.0
                continue
            if lab < 0 or lab >= c:
                return i * d + j
            w = np.float64(weights[lab]) if has_weights else 1.0
            scale = w * (dy[i * d + j] if reduction == 0 else dy[0])
            if reduction == 2:
                scale = np.divide(scale, wsum)   # weights summing to 0: NaN or inf (Numba's / would raise)
            for k in range(c):
                p = fast_exp(log_prob[i, k, j]) if softmax else 0.0
                dx[i, k, j] = (p - (1.0 if k == lab else 0.0)) * scale
    return -1


def softmax_grad(ctx):
    return _softmax_grad_launcher(ctx, log=False)


def log_softmax_grad(ctx):
    return _softmax_grad_launcher(ctx, log=True)


def _softmax_grad_launcher(ctx, log: bool):
    outer, n, inner = softmax_view(ctx)

    @bindable
    def bind(dy, y, dx):
        if inner == 1:      # contiguous rows: loops of unit stride, which LLVM vectorizes
            shape, kernel = (outer, n), _softmax_grad_rows
        else:
            shape, kernel = (outer, n, inner), _softmax_grad
        return by_rows([(kernel, (dy.reshape(shape), y.reshape(shape), dx.reshape(shape), log), (1, 1, 1, 0))],
                       outer, n * inner)
    return bind


@jit(fastmath=True)      # the float64 sums vectorize (reordered at float64's precision: not visible in float32)
def _softmax_grad_rows(dy, y, dx, log):
    """_softmax_grad of rows [outer, n] (the softmax axis last)."""
    outer, n = y.shape
    for o in range(outer):
        s = np.float64(0.0)
        if log:
            for k in range(n):
                s += dy[o, k]
            for k in range(n):
                dx[o, k] = dy[o, k] - math.exp(y[o, k]) * s
        else:
            for k in range(n):
                s += dy[o, k] * y[o, k]
            for k in range(n):
                dx[o, k] = y[o, k] * (dy[o, k] - s)


@jit(fastmath=True)      # the float64 sums vectorize (reordered at float64's precision: not visible in float32)
def _softmax_grad(dy, y, dx, log):
    outer, n, inner = y.shape
    for o in range(outer):
        for i in range(inner):
            s = np.float64(0.0)
            if log:
                for k in range(n):
                    s += dy[o, k, i]
                for k in range(n):
                    dx[o, k, i] = dy[o, k, i] - math.exp(y[o, k, i]) * s
            else:
                for k in range(n):
                    s += dy[o, k, i] * y[o, k, i]
                for k in range(n):
                    dx[o, k, i] = y[o, k, i] * (dy[o, k, i] - s)
