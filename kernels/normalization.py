"""Normalization kernels: a statistics kernel, then a normalizing kernel, per op.

* Statistics (``_row_stats``, ``_channel_stats``) accumulate in float64, two passes (mean, then the centred
  variance), with fastmath so the sums vectorize. They go to a float64 workspace of (mean, var or 1/std) pairs.
* The normalizing pass runs in X's element type (float32 vectorizes twice as wide as float64) and **without**
  fastmath: it computes ``((x - m32) - (m - m32)) * a + b`` where ``m32`` is the mean rounded to X's type.
  ``x - m32`` is exact when x is near the mean, and the small correction keeps the float64 mean's digits, so a
  float32 input with |mean| >> std still normalizes accurately. With fastmath this would be reassociated into
  ``x - (m32 + (m - m32))`` = ``x - m32``, and the digits would be lost; fastmath would also leak into it if it
  were inlined into a fastmath kernel, hence two separate kernels called from the launcher.

Launchers view X as ``[N, C, inner]`` (batch/instance norm), ``[N * G, C/G * inner]`` rows (group norm
statistics) or ``[rows, n]`` (layer norm). Absent optional outputs get a dummy made once, when the step is built.

The gradient kernels (BatchNormalizationGrad, LayerNormalizationGrad) compute in float64 with fastmath: their
sums vectorize, and reassociating ``(x - mean) * inv`` costs nothing visible at float64's precision. Omitted
outputs ("") are not computed.
"""
from __future__ import annotations

import math

import numpy as np

from edgetrain.ops.base import axis_view
from edgetrain.ops.normalization import (
    lrn_view,
    bn_training_mode,
    group_norm_per_channel,
    layer_norm_axis,
    lp_axis,
    stash_dtype,
)

from edgetrain import parallel

from . import ROW_BLOCK, bindable, by_rows, direct, in_turn
from ._jit import jit


def _ncx(shape) -> tuple[int, int, int]:
    return int(shape[0]), int(shape[1]), int(np.prod(shape[2:], dtype=np.int64))


def _noop(*args):
    """Empty outputs: nothing to compute."""


def _output_slot(ctx, k: int) -> int:
    """Position of output ``k`` in the launcher's arguments, or -1 if the node omits it."""
    outs = ctx.node.outputs
    return len(ctx.node.inputs) + k if k < len(outs) and outs[k] else -1


# --- statistics (fastmath, float64) -----------------------------------------------------------------------

@jit(fastmath=True)
def _row_stats(x, eps, stats):
    """stats[r] = (mean, 1 / sqrt(var + eps)) of each row of x [rows, n] (biased variance)."""
    rows, n = x.shape
    if n == 0:       # a mean of nothing is NaN (the ONNX reference's answer), and so is 1 / sqrt(NaN + eps)
        stats[:, :] = math.nan
        return
    for r in range(rows):
        s = np.float64(0.0)   # float64 without the JIT too (numpy: 0.0 + float32 is float32)
        for k in range(n):
            s += x[r, k]
        m = s / n
        v = np.float64(0.0)
        for k in range(n):
            d = x[r, k] - m
            v += d * d
        stats[r, 0] = m
        stats[r, 1] = 1.0 / math.sqrt(v / n + eps)


@jit(fastmath=True)
def _channel_stats(x, stats):
    """stats[c] = (mean, biased var) of x[:, c, :] for x [N, C, inner]."""
    n, c, inner = x.shape
    count = n * inner
    if count == 0:   # an empty batch: NaN statistics, as the ONNX reference and onnxruntime give
        stats[:, :] = math.nan
        return
    for ch in range(c):
        s = np.float64(0.0)   # float64 without the JIT too (numpy: 0.0 + float32 is float32)
        for i in range(n):
            for k in range(inner):
                s += x[i, ch, k]
        m = s / count
        v = np.float64(0.0)
        for i in range(n):
            for k in range(inner):
                d = x[i, ch, k] - m
                v += d * d
        stats[ch, 0] = m
        stats[ch, 1] = v / count


# --- normalizing passes (no fastmath, X's type) -----------------------------------------------------------

@jit
def _normalize_channel(x, y, ch, m, a, bias):
    """y[:, ch, :] = (x[:, ch, :] - m) * a + bias, with m split into X's type plus a correction."""
    mt = y.dtype.type(m)
    dt = y.dtype.type(m - mt)
    at = y.dtype.type(a)
    bt = y.dtype.type(bias)
    for i in range(x.shape[0]):
        for k in range(x.shape[2]):
            y[i, ch, k] = ((x[i, ch, k] - mt) - dt) * at + bt


@jit
def _bn_apply(x, scale, b, mean, var, eps, y):
    """Inference: per channel, y = (x - mean) * scale / sqrt(var + eps) + b."""
    for ch in range(x.shape[1]):
        _normalize_channel(x, y, ch, mean[ch], scale[ch] / math.sqrt(var[ch] + eps), b[ch])


@jit
def _bn_train_apply(x, scale, b, mean, var, stats, eps, momentum, y, running_mean, running_var, want_mean,
                    want_var):
    """Training: normalize with the batch statistics; running = input * momentum + batch * (1 - momentum)."""
    for ch in range(x.shape[1]):
        m = stats[ch, 0]
        v = stats[ch, 1]
        if want_mean:
            running_mean[ch] = mean[ch] * momentum + m * (1.0 - momentum)
        if want_var:
            running_var[ch] = var[ch] * momentum + v * (1.0 - momentum)
        _normalize_channel(x, y, ch, m, scale[ch] / math.sqrt(v + eps), b[ch])


@jit
def _layer_norm_apply(x, scale, b, has_bias, stats, y):
    """y[r] = (x[r] - mean[r]) * inv[r] * scale + b."""
    rows, n = x.shape
    for r in range(rows):
        m = stats[r, 0]
        mt = y.dtype.type(m)
        dt = y.dtype.type(m - mt)
        it = y.dtype.type(stats[r, 1])
        if has_bias:
            for k in range(n):
                y[r, k] = ((x[r, k] - mt) - dt) * it * scale[k] + b[k]
        else:
            for k in range(n):
                y[r, k] = ((x[r, k] - mt) - dt) * it * scale[k]


@jit
def _group_norm_apply(x, scale, b, groups, per_channel, stats, y):
    """y[i, c] = (x[i, c] - mean[i, g]) * inv[i, g] * scale[p] + b[p], g = c // (C / groups), p = c or g."""
    n, c, inner = x.shape
    cpg = c // groups
    for i in range(n):
        for ch in range(c):
            g = ch // cpg
            p = ch if per_channel else g
            _normalize_channel(x[i:i + 1], y[i:i + 1], ch, stats[i * groups + g, 0],
                               stats[i * groups + g, 1] * scale[p], b[p])


@jit
def _copy_stats(stats, col, out):
    for r in range(out.shape[0]):
        out[r] = stats[r, col]


@jit
def _inv_std(stats, eps, out):
    """out[c] = 1 / sqrt(var[c] + eps) from (mean, var) pairs."""
    for r in range(out.shape[0]):
        out[r] = 1.0 / math.sqrt(stats[r, 1] + eps)


# --- gradients (fastmath, float64) ------------------------------------------------------------------------

@jit(fastmath=True)
def _bn_grad(dy, x, scale, mean, inv, dx, dscale, dbias, want_dx, want_dscale, want_dbias):
    """Per channel over x [N, C, inner], xhat = (x - mean) * inv:
    dB = sum(dY), dScale = sum(dY * xhat), dX = scale * inv * (dY - dB / M - xhat * dScale / M), M = N * inner."""
    n, c, inner = x.shape
    count = n * inner
    for ch in range(c):
        m = np.float64(mean[ch])
        iv = np.float64(inv[ch])
        s_dy = np.float64(0.0)
        s_dyc = np.float64(0.0)
        for i in range(n):
            for k in range(inner):
                g = np.float64(dy[i, ch, k])
                s_dy += g
                s_dyc += g * (x[i, ch, k] - m)
        s_dyxh = s_dyc * iv
        if want_dbias:
            dbias[ch] = s_dy
        if want_dscale:
            dscale[ch] = s_dyxh
        if want_dx:
            a = np.float64(scale[ch]) * iv
            k1 = a * s_dy / count
            k2 = a * iv * s_dyxh / count
            for i in range(n):
                for k in range(inner):
                    dx[i, ch, k] = a * dy[i, ch, k] - k1 - (x[i, ch, k] - m) * k2


@jit(fastmath=True)
def _ln_grad(dy, x, scale, mean, inv, dx, want_dx, acc, want_acc):
    """Rows of x [rows, n], xhat = (x - mean) * inv, dxhat = dY * scale:
    dX = inv * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)); acc[0] = sum over rows of dY * xhat (dScale),
    acc[1] = sum of dY (dBias)."""
    rows, n = x.shape
    if want_acc:
        for k in range(n):
            acc[0, k] = 0.0
            acc[1, k] = 0.0
    for r in range(rows):
        m = np.float64(mean[r])
        iv = np.float64(inv[r])
        if want_acc:
            for k in range(n):
                g = np.float64(dy[r, k])
                acc[0, k] += g * ((x[r, k] - m) * iv)
                acc[1, k] += g
        if want_dx:
            s1 = np.float64(0.0)
            s2 = np.float64(0.0)
            for k in range(n):
                g = np.float64(dy[r, k]) * scale[k]
                s1 += g
                s2 += g * (x[r, k] - m)
            s1 = s1 / n
            s2 = s2 * iv * iv / n
            for k in range(n):
                dx[r, k] = iv * (np.float64(dy[r, k]) * scale[k] - s1 - (x[r, k] - m) * s2)


# --- launchers --------------------------------------------------------------------------------------------

def batch_norm(ctx):
    """y = (x - mean) / sqrt(var + eps) * scale + B per channel; in training mode with the batch's mean and
    biased variance, and running = input * momentum + batch * (1 - momentum). Also BatchNormInternal, whose
    outputs 3 and 4 are the batch mean and 1 / sqrt(batch var + eps)."""
    n, c, inner = _ncx(ctx.shape(0))
    eps = ctx.attr("epsilon")
    momentum = ctx.attr("momentum")
    training = bn_training_mode(ctx)
    dummy = np.empty(c, ctx.type(3).dtype)
    if c == 0 or (not training and n * inner == 0):
        return _noop     # nothing to write (an empty batch in training mode still has running statistics)

    if not training:
        @bindable
        def bind(x, scale, b, mean, var, y, *_):
            return _bn_apply, (x.reshape(n, c, inner), scale.reshape(c), b.reshape(c), mean.reshape(c),
                               var.reshape(c), eps, y.reshape(n, c, inner))
        return bind

    y_at, rm_at, rv_at, sm_at, si_at = (_output_slot(ctx, k) for k in range(5))

    @bindable
    def bind_training(*args):
        x3 = args[0].reshape(n, c, inner)
        stats = args[-1]
        apply = (x3, args[1].reshape(c), args[2].reshape(c), args[3].reshape(c), args[4].reshape(c), stats,
                 eps, momentum, args[y_at].reshape(n, c, inner), args[rm_at] if rm_at >= 0 else dummy,
                 args[rv_at] if rv_at >= 0 else dummy, rm_at >= 0, rv_at >= 0)
        # BatchNormInternal's saved_mean and saved_inv_std
        saved_mean = args[sm_at] if sm_at >= 0 else None
        saved_inv = args[si_at] if si_at >= 0 else None

        def run():
            _channel_stats(x3, stats)
            _bn_train_apply(*apply)
            if saved_mean is not None:
                _copy_stats(stats, 0, saved_mean)
            if saved_inv is not None:
                _inv_std(stats, eps, saved_inv)
        run.kernel_calls = [(_channel_stats, (x3, stats)), (_bn_train_apply, apply)] + \
            ([(_copy_stats, (stats, 0, saved_mean))] if saved_mean is not None else []) + \
            ([(_inv_std, (stats, eps, saved_inv))] if saved_inv is not None else [])
        return run, ()
    return bind_training


def layer_norm(ctx):
    """Each row of X[axis:] (``n`` elements): y = (x - mean) / sqrt(var + eps) * scale + B (biased var)."""
    shape = ctx.shape(0)
    axis = layer_norm_axis(ctx)
    rows = int(np.prod(shape[:axis], dtype=np.int64))
    n = int(np.prod(shape[axis:], dtype=np.int64))
    eps = ctx.attr("epsilon")
    has_bias = ctx.has_input(2)
    stash_dtype(ctx)
    if rows == 0:
        return _noop     # (n == 0 still has Mean and InvStdDev to write: NaN)

    y_at, mean_at, inv_at = (_output_slot(ctx, k) for k in range(3))
    b_at = 2 if has_bias else 1   # without B, pass Scale again (unused)

    @bindable
    def bind(*args):
        x2 = args[0].reshape(rows, n)
        stats = args[-1]
        apply = (x2, args[1].reshape(n), args[b_at].reshape(n), has_bias, stats, args[y_at].reshape(rows, n))
        copies = [(_copy_stats, (stats, k, args[at].reshape(rows)), (1, 0, 1))
                  for k, at in ((0, mean_at), (1, inv_at)) if at >= 0]
        return by_rows([(_row_stats, (x2, eps, stats), (1, 0, 1)), (_layer_norm_apply, apply, (1, 0, 0, 0, 1, 1)),
                        *copies], rows, n)
    return bind


def group_norm(ctx):
    """Per sample and group of C / num_groups channels: y = (x - mean) / sqrt(var + eps) * scale + bias,
    scale/bias indexed by group (opset 18-20) or by channel (opset 21)."""
    n, c, inner = _ncx(ctx.shape(0))
    groups = ctx.attr("num_groups")
    per_channel = group_norm_per_channel(ctx)
    eps = ctx.attr("epsilon")
    if n * c * inner == 0:
        return _noop

    def run(x, scale, b, y, stats):
        _row_stats(x.reshape(n * groups, c // groups * inner), eps, stats)
        _group_norm_apply(x.reshape(n, c, inner), scale.reshape(-1), b.reshape(-1), groups, per_channel, stats,
                          y.reshape(n, c, inner))
    return run


def instance_norm(ctx):
    """Group normalization with one group per channel."""
    n, c, inner = _ncx(ctx.shape(0))
    eps = ctx.attr("epsilon")
    if n * c * inner == 0:
        return _noop

    def run(x, scale, b, y, stats):
        _row_stats(x.reshape(n * c, inner), eps, stats)
        _group_norm_apply(x.reshape(n, c, inner), scale.reshape(c), b.reshape(c), c, True, stats,
                          y.reshape(n, c, inner))
    return run


def batch_norm_grad(ctx):
    """BatchNormalizationGrad(dY, X, scale, saved_mean, saved_inv_std) -> dX, dScale, dB."""
    n, c, inner = _ncx(ctx.shape(1))
    dx_at, ds_at, db_at = (_output_slot(ctx, k) for k in range(3))
    dtype = ctx.type(1).dtype
    dummy_x = np.empty((1, 1, 1), dtype)
    dummy_c = np.empty(1, dtype)
    if n * c * inner == 0:
        def run_empty(*args):      # no samples: the parameters get zero gradients
            for at in (ds_at, db_at):
                if at >= 0:
                    args[at][...] = 0
        return run_empty

    @bindable
    def bind(*args):
        outs = (args[dx_at].reshape(n, c, inner) if dx_at >= 0 else dummy_x,
                args[ds_at].reshape(c) if ds_at >= 0 else dummy_c,
                args[db_at].reshape(c) if db_at >= 0 else dummy_c)
        return _bn_grad, (args[0].reshape(n, c, inner), args[1].reshape(n, c, inner), args[2].reshape(c),
                          args[3].reshape(c), args[4].reshape(c), *outs, dx_at >= 0, ds_at >= 0, db_at >= 0)
    return bind


def layer_norm_grad(ctx):
    """LayerNormalizationGrad(dY, X, scale, mean, inv_std_dev) -> dX, dScale, dBias over rows of X[axis:]."""
    shape = ctx.shape(1)
    axis = layer_norm_axis(ctx)
    rows = int(np.prod(shape[:axis], dtype=np.int64))
    n = int(np.prod(shape[axis:], dtype=np.int64))
    dx_at, ds_at, db_at = (_output_slot(ctx, k) for k in range(3))
    want_acc = ds_at >= 0 or db_at >= 0
    dummy_x = np.empty((1, 1), ctx.type(1).dtype)
    if rows * n == 0:
        def run_empty(*args):      # no rows: the parameters get zero gradients
            for at in (ds_at, db_at):
                if at >= 0:
                    args[at][...] = 0
        return run_empty

    @bindable
    def bind(*args):
        acc = args[-1]
        call = (args[0].reshape(rows, n), args[1].reshape(rows, n), args[2].reshape(n), args[3].reshape(rows),
                args[4].reshape(rows), args[dx_at].reshape(rows, n) if dx_at >= 0 else dummy_x, dx_at >= 0, acc,
                want_acc)
        copies = [(np.copyto, (args[at].reshape(n), acc[k], "same_kind")) for k, at in ((0, ds_at), (1, db_at))
                  if at >= 0]
        blocks = parallel.slots() * parallel.BLOCKS_PER_THREAD
        blocks = min(blocks, rows // max(1, ROW_BLOCK // n)) if parallel.slots() > 1 else 1
        if blocks < 2:
            return in_turn([(_ln_grad, call), *copies])
        return _ln_grad_in_blocks(call, blocks, rows, copies)
    return bind


def _ln_grad_in_blocks(call, blocks: int, rows: int, copies):
    """``(fn, args)`` for _ln_grad over blocks of rows on the intra-op threads: dX row by row as in one call; the
    parameters' sums per block (one accumulator each, made here once), then added in block order."""
    dy, x, scale, mean, inv, dx, want_dx, acc, want_acc = call
    partial = np.zeros((blocks,) + acc.shape, acc.dtype)
    bounds = [rows * k // blocks for k in range(blocks + 1)]
    parts = [(dy[lo:hi], x[lo:hi], scale, mean[lo:hi], inv[lo:hi], dx[lo:hi] if want_dx else dx, want_dx,
              partial[k], want_acc) for k, (lo, hi) in enumerate(zip(bounds, bounds[1:]))]
    chosen = [_ln_grad] * blocks        # each block's call direct from its second run

    def block(_slot, k):
        fn = chosen[k]
        fn(*parts[k])
        if fn is _ln_grad:
            chosen[k] = direct(_ln_grad, parts[k])
    jobs = [lambda slot, k=k: block(slot, k) for k in range(blocks)]
    after, after_args = in_turn(([(np.sum, (partial, 0, None, acc))] if want_acc else []) + copies)
    threads = parallel.slots()

    def run():
        parallel.run_blocks(jobs, threads)
        after(*after_args)
    run.kernel_calls = ((_ln_grad, parts[0]),)
    return run, ()


def lp_normalization(ctx):
    """y = x / ||x||_p along the axis, one pass for the norm and one to scale, per column of [outer, n, inner]."""
    view = axis_view(ctx, lp_axis(ctx, len(ctx.shape(0))))
    squared = ctx.attr("p") == 2

    def run(x, y):
        _lp_normalize(x.reshape(view), y.reshape(view), squared)
    return run


@jit
def _lp_normalize(x, y, squared):
    outer, n, inner = x.shape
    for o in range(outer):
        for i in range(inner):
            s = 0.0
            for r in range(n):
                v = x[o, r, i]
                s += v * v if squared else abs(v)
            norm = np.sqrt(s) if squared else s
            if norm == 0.0:     # an all-zero column stays zero (ONNX's reference), not 0/0
                norm = 1.0
            for r in range(n):
                y[o, r, i] = x[o, r, i] / norm


def _lrn_params(ctx):
    size = int(ctx.attr("size"))
    return (float(ctx.attr("alpha")) / size, float(ctx.attr("beta")), float(ctx.attr("bias")), (size - 1) // 2,
            size - 1 - (size - 1) // 2)


def lrn(ctx):
    view = lrn_view(ctx)
    scale, beta, bias, lo, hi = _lrn_params(ctx)

    def run(x, y):
        _lrn(x.reshape(view), y.reshape(view), scale, beta, bias, lo, hi)
    return run


@jit
def _window_sums(x, n, i, scale, bias, lo, hi, out):
    """out[c] = bias + scale * sum of x[n, c', i]^2 over c' in [c - lo, c + hi] (inside [0, C))."""
    channels = x.shape[1]
    for c in range(channels):
        acc = 0.0
        for k in range(max(0, c - lo), min(channels, c + hi + 1)):
            v = np.float64(x[n, k, i])
            acc += v * v
        out[c] = bias + scale * acc


@jit
def _lrn(x, y, scale, beta, bias, lo, hi):
    """y = x / (bias + alpha / size * sum of x^2 over the channel window)^beta."""
    batch, channels, inner = x.shape
    s = np.empty(channels)
    for n in range(batch):
        for i in range(inner):
            _window_sums(x, n, i, scale, bias, lo, hi, s)
            for c in range(channels):
                y[n, c, i] = x[n, c, i] * s[c] ** -beta


def lrn_grad(ctx):
    view = lrn_view(ctx, 1)
    scale, beta, bias, lo, hi = _lrn_params(ctx)

    def run(dy, x, y, dx):
        _lrn_grad(dy.reshape(view), x.reshape(view), y.reshape(view), dx.reshape(view), scale, beta, bias, lo, hi)
    return run


@jit
def _lrn_grad(dy, x, y, dx, scale, beta, bias, lo, hi):
    """dx_k = dy_k s_k^-beta - 2 beta scale x_k * sum over c with k in c's window ([k - hi, k + lo]) of
    dy_c y_c / s_c."""
    batch, channels, inner = x.shape
    s = np.empty(channels)
    t = np.empty(channels)
    for n in range(batch):
        for i in range(inner):
            _window_sums(x, n, i, scale, bias, lo, hi, s)
            for c in range(channels):
                t[c] = np.float64(dy[n, c, i]) * y[n, c, i] / s[c]
            for k in range(channels):
                acc = 0.0
                for c in range(max(0, k - hi), min(channels, k + lo + 1)):
                    acc += t[c]
                dx[n, k, i] = dy[n, k, i] * s[k] ** -beta - 2.0 * beta * scale * x[n, k, i] * acc
