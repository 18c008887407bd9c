"""Pooling kernels: serial jitted loops over [N*C, H, W] views (1-D pools run with H = 1); global pools over
[N*C, spatial] views; MaxPoolGrad a scatter-add at the Indices, AveragePoolGrad the pool's adjoint with the
same loop structure. Launchers bind once (``kernels.bindable``): the views are made when the program is built,
so a call allocates nothing."""
from __future__ import annotations

import math

import numpy as np

from edgetrain.ops.pool import max_unpool_shape, pool_geometry

from . import bindable, checked
from ._jit import jit


def _col_ranges(w: int, ow: int, sw: int, dw: int, pw: int, kw: int) -> np.ndarray:
    """[kw, 3]: for tap column j, the output columns [lo, hi) whose input column ``o*sw + j*dw - pw`` is in
    [0, w), and that offset ``j*dw - pw``. Precomputed by the launcher: computed in the kernel's loops, the
    integer divisions cost a fifth of its time."""
    out = np.zeros((kw, 3), np.int64)
    for j in range(kw):
        off = j * dw - pw
        lo = 0 if off >= 0 else (-off + sw - 1) // sw
        hi = (w - 1 - off) // sw + 1 if w - 1 - off >= 0 else 0
        lo = min(lo, ow)
        out[j] = lo, max(lo, min(hi, ow)), off
    return out


def _tap_counts(size: int, out: int, k: int, s: int, d: int, pb: int, pe: int, include_pad: bool):
    """Per output position along one axis: how many of the window's taps AveragePool divides by; taps in the
    explicit pads count with count_include_pad (positions past them, added by ceil_mode, never count)."""
    lo, hi = (-pb, size + pe) if include_pad else (0, size)
    counts = np.array([sum(lo <= o * s - pb + t * d < hi for t in range(k)) for o in range(out)], np.float64)
    counts[counts == 0] = np.nan   # an empty window averages to NaN (a 0 would raise ZeroDivisionError)
    return counts


# Max pooling runs one output row at a time, one kernel tap at a time over the row's in-bounds columns, with
# np.maximum (LLVM vectorizes it; a ``v if v > o else o`` select did not vectorize). Inner loops index with
# unsigned integers (``U``), for which Numba emits no negative-index wraparound check (up to 2x faster than
# slicing a view per tap; 4-5x faster overall than a per-output loop over taps).
U = np.uint64


@jit
def _max_pool(x, y, idx, want_idx, ranges, kh, sh, sw, dh, dw, ph, pw, col_major):
    """y[p, oy, ox] = max over the window's in-bounds taps; idx = the flattened position in x (N*C*H*W)
    of the first maximum in window order, row major (``col_major`` = 0) or with H and W swapped
    (storage_order 1). A NaN in the window gives NaN (as numpy and PyTorch do; onnxruntime skips NaNs),
    with index -1."""
    nc, h, w = x.shape
    oh, ow = y.shape[1], y.shape[2]
    kw = ranges.shape[0]
    for p in range(nc):
        plane = x[p]
        for oy in range(oh):
            dst = y[p, oy]
            for k in range(ow):
                dst[k] = -np.inf
            for i in range(kh):
                iy = oy * sh - ph + i * dh
                if iy < 0 or iy >= h:
                    continue
                row = plane[iy]
                for j in range(kw):
                    lo, hi = ranges[j, 0], ranges[j, 1]
                    first = U(lo * sw + j * dw - pw)
                    ulo = U(lo)
                    if sw == 1:
                        for k in range(hi - lo):
                            dst[ulo + U(k)] = np.maximum(row[first + U(k)], dst[ulo + U(k)])
                    elif sw == 2:
                        for k in range(hi - lo):
                            dst[ulo + U(k)] = np.maximum(row[first + U(2 * k)], dst[ulo + U(k)])
                    else:
                        for k in range(hi - lo):
                            dst[ulo + U(k)] = np.maximum(row[first + U(k * sw)], dst[ulo + U(k)])
            if not want_idx:
                continue
            # Indices in a second sweep over the taps in reverse order, so the first tap equal to the maximum
            # is written last; an arithmetic select, as a branch on equality is mispredicted.
            di = idx[p, oy]
            for k in range(ow):
                di[k] = -1
            for i in range(kh - 1, -1, -1):
                iy = oy * sh - ph + i * dh
                if iy < 0 or iy >= h:
                    continue
                row = plane[iy]
                for j in range(kw - 1, -1, -1):
                    lo, hi = ranges[j, 0], ranges[j, 1]
                    ix = lo * sw + j * dw - pw
                    first = U(ix)
                    ulo = U(lo)
                    at = p * h * w + (ix * h + iy if col_major else iy * w + ix)
                    step = sw * h if col_major else sw
                    for k in range(hi - lo):
                        hit = np.int64(row[first + U(k * sw)] == dst[ulo + U(k)])
                        old = di[ulo + U(k)]
                        di[ulo + U(k)] = old + hit * (at + k * step - old)


@jit
def _average_pool(x, y, ranges, row_count, col_count, kh, sh, sw, dh, ph):
    """y[p, oy, ox] = (sum of the window's in-bounds taps) / (row_count[oy] * col_count[ox]): the window's tap
    count is separable, precomputed per row and column by the launcher (count_include_pad decides which taps
    count). Same loop structure as ``_max_pool``."""
    nc, h, w = x.shape
    oh, ow = y.shape[1], y.shape[2]
    kw = ranges.shape[0]
    for p in range(nc):
        plane = x[p]
        for oy in range(oh):
            dst = y[p, oy]
            for k in range(ow):
                dst[k] = 0
            for i in range(kh):
                iy = oy * sh - ph + i * dh
                if iy < 0 or iy >= h:
                    continue
                row = plane[iy]
                for j in range(kw):
                    lo, hi = ranges[j, 0], ranges[j, 1]
                    first = U(lo * sw + ranges[j, 2])
                    ulo = U(lo)
                    if sw == 1:
                        for k in range(hi - lo):
                            dst[ulo + U(k)] += row[first + U(k)]
                    elif sw == 2:
                        for k in range(hi - lo):
                            dst[ulo + U(k)] += row[first + U(2 * k)]
                    else:
                        for k in range(hi - lo):
                            dst[ulo + U(k)] += row[first + U(k * sw)]
            rc = row_count[oy]
            for k in range(ow):
                dst[k] = dst[k] / (rc * col_count[k])


@jit(fastmath=True)
def _global_average(x, y):
    nc, s = x.shape
    for p in range(nc):
        row = x[p]
        total = 0.0
        for k in range(s):
            total += row[k]
        y[p] = total / s


@jit
def _global_max(x, y):
    nc, s = x.shape
    for p in range(nc):
        row = x[p]
        best = row[0]
        for k in range(1, s):
            if row[k] > best:
                best = row[k]
        y[p] = best


@jit
def _max_pool_2x2(x, y, idx, want_idx):
    """The common 2x2, stride 2 pool with every window in bounds: one pass per output row, indices (row major)
    in the same pass; 4-6x faster than the general loops. Same results, NaN and tie rules as ``_max_pool``."""
    nc, h, w = x.shape
    oh, ow = y.shape[1], y.shape[2]
    for p in range(nc):
        for oy in range(oh):
            r0, r1, dst = x[p, 2 * oy], x[p, 2 * oy + 1], y[p, oy]
            if not want_idx:
                for ox in range(ow):
                    j = U(2 * ox)
                    dst[U(ox)] = np.maximum(np.maximum(r0[j], r0[j + U(1)]), np.maximum(r1[j], r1[j + U(1)]))
                continue
            di = idx[p, oy]
            row0 = p * h * w + 2 * oy * w
            for ox in range(ow):
                j = U(2 * ox)
                a, b, c, d = r0[j], r0[j + U(1)], r1[j], r1[j + U(1)]
                m, at = a, row0 + 2 * ox          # strict > keeps the first maximum in window order
                if b > m:
                    m, at = b, at + 1
                if c > m:
                    m, at = c, row0 + w + 2 * ox
                if d > m:
                    m, at = d, row0 + w + 2 * ox + 1
                if np.isnan(a) or np.isnan(b) or np.isnan(c) or np.isnan(d):
                    m, at = np.nan, -1
                dst[U(ox)] = m
                di[U(ox)] = at


def _planes(ctx, x=None):
    """[N*C, H, W] shapes of X (input 0, or the shape ``x``) and of the pooled output (1-D as H = 1), and the
    2-D window."""
    x = ctx.shape(0) if x is None else x
    win = pool_geometry(ctx, x).as_2d()
    nc = x[0] * x[1]
    hw = tuple(x[2:]) if len(x) == 4 else (1, x[2])
    return (nc,) + hw, (nc,) + win.out, win


def max_pool(ctx):
    """Launcher: ``run(X, Y[, Indices])``."""
    x3, y3, win = _planes(ctx)
    kh, kw = win.kernel
    sh, sw = win.strides
    dh, dw = win.dilations
    ph, pw = win.pads_begin
    col_major = ctx.attr("storage_order")
    ranges = _col_ranges(x3[2], y3[2], sw, dw, pw, kw)
    no_idx = np.empty((1, 1, 1), np.int64)   # stands in for an absent Indices output (never written)

    if (kh, kw, sh, sw, dh, dw, ph, pw, col_major) == (2, 2, 2, 2, 1, 1, 0, 0, 0) and \
            2 * y3[1] <= x3[1] and 2 * y3[2] <= x3[2]:
        @bindable
        def bind_2x2(x, y, idx=None):
            want = idx is not None
            return _max_pool_2x2, (x.reshape(x3), y.reshape(y3), idx.reshape(y3) if want else no_idx, want)
        return bind_2x2

    @bindable
    def bind(x, y, idx=None):
        want = idx is not None
        return _max_pool, (x.reshape(x3), y.reshape(y3), idx.reshape(y3) if want else no_idx, want, ranges,
                           kh, sh, sw, dh, dw, ph, pw, col_major)
    return bind


def average_pool(ctx):
    """Launcher: ``run(X, Y)``."""
    x3, y3, win = _planes(ctx)
    kh, kw = win.kernel
    sh, sw = win.strides
    dh, dw = win.dilations
    ph, pw = win.pads_begin
    pe_h, pe_w = win.pads_end
    include_pad = bool(ctx.attr("count_include_pad"))
    ranges = _col_ranges(x3[2], y3[2], sw, dw, pw, kw)
    rows = _tap_counts(x3[1], y3[1], kh, sh, dh, ph, pe_h, include_pad)
    cols = _tap_counts(x3[2], y3[2], kw, sw, dw, pw, pe_w, include_pad)

    @bindable
    def bind(x, y):
        return _average_pool, (x.reshape(x3), y.reshape(y3), ranges, rows, cols, kh, sh, sw, dh, ph)
    return bind


def max_unpool(ctx):
    """Launcher: ``run(X, Indices[, output_shape], Y)``; an index outside Y raises InputError naming it."""
    size = int(np.prod(max_unpool_shape(ctx), dtype=np.int64))
    allowed = f"an index into the {size} elements of the output"

    @bindable
    def bind(x, idx, *rest):
        call = (x.reshape(-1), idx.reshape(-1), rest[-1].reshape(-1))
        return checked(_max_unpool, call, ctx, 1, idx, allowed)
    return bind


@jit
def _max_unpool(x, idx, y):
    """y = 0, then y[idx[k]] = x[k]; returns the first k whose index is outside y, or -1."""
    y[:] = 0
    for k in range(x.shape[0]):
        i = idx[k]
        if i < 0 or i >= y.shape[0]:
            return k
        y[i] = x[k]
    return -1


def lp_pool(ctx):
    """Launcher: ``run(X, Y)``."""
    x3, y3, win = _planes(ctx)
    p = float(ctx.attr("p"))

    @bindable
    def bind(x, y):
        window = (win.kernel, win.strides, win.dilations, win.pads_begin)
        return _lp_pool, (x.reshape(x3), y.reshape(y3), *window, p)
    return bind


@jit
def _lp_pool(x, y, kernel, strides, dilations, pads, p):
    """y[c, oy, ox] = (sum of |x|^p over the window's in-bounds taps)^(1/p)."""
    nc, h, w = x.shape
    oh, ow = y.shape[1], y.shape[2]
    for c in range(nc):
        for oy in range(oh):
            for ox in range(ow):
                acc = 0.0
                for i in range(kernel[0]):
                    iy = oy * strides[0] - pads[0] + i * dilations[0]
                    if iy < 0 or iy >= h:
                        continue
                    for j in range(kernel[1]):
                        ix = ox * strides[1] - pads[1] + j * dilations[1]
                        if 0 <= ix < w:
                            v = abs(np.float64(x[c, iy, ix]))
                            acc += v * v if p == 2.0 else v ** p
                y[c, oy, ox] = math.sqrt(acc) if p == 2.0 else acc ** (1.0 / p)


# --- gradients --------------------------------------------------------------------------------------------

@jit
def _max_pool_grad(dy, idx, dx, h, w, col_major):
    """dx = 0, then dx[idx[k]] += dy[k] (indices flattened over N*C*H*W; with ``col_major`` H and W are
    swapped within each plane, as storage_order 1 writes them). Index -1 (a window of NaNs) is skipped.
    Returns the first k whose index is out of range, or -1."""
    size = dx.shape[0]
    hw = h * w
    for k in range(size):
        dx[k] = 0
    for k in range(dy.shape[0]):
        i = idx[k]
        if i < 0 or i >= size:
            if i == -1:
                continue
            return k
        if col_major:
            q = i % hw
            i += (q % h) * w + q // h - q
        dx[i] += dy[k]
    return -1


@jit
def _average_pool_grad(dy, dx, ranges, counts, kh, sh, sw, dh, ph):
    """The adjoint of ``_average_pool``: dx[p, iy, ix] = sum of dy[p, oy, ox] / counts[oy, ox] over the
    windows (oy, ox) whose in-bounds taps include (iy, ix)."""
    nc, h, w = dx.shape
    oh = dy.shape[1]
    kw = ranges.shape[0]
    for p in range(nc):
        plane = dx[p]
        for iy in range(h):
            row = plane[iy]
            for k in range(w):
                row[k] = 0
        for oy in range(oh):
            g = dy[p, oy]
            cnt = counts[oy]
            for i in range(kh):
                iy = oy * sh - ph + i * dh
                if iy < 0 or iy >= h:
                    continue
                row = plane[iy]
                for j in range(kw):
                    lo, hi = ranges[j, 0], ranges[j, 1]
                    first = U(lo * sw + ranges[j, 2])
                    ulo = U(lo)
                    for k in range(hi - lo):
                        row[first + U(k * sw)] += g[ulo + U(k)] / cnt[ulo + U(k)]


def max_pool_grad(ctx):
    """Launcher: ``run(dY, Indices, dX)``; an index outside [0, dX's size) other than -1 raises InputError."""
    x = ctx.out(0).shape
    h, w = (x[2], x[3]) if len(x) == 4 else (1, x[2])
    col_major = ctx.attr("storage_order")
    size = int(np.prod(x, dtype=np.int64))
    allowed = f"a flat position in dX of shape {list(x)}, in [0, {size}), or -1"

    @bindable
    def bind(dy, idx, dx):
        call = (dy.reshape(-1), idx.reshape(-1), dx.reshape(-1), h, w, col_major)
        return checked(_max_pool_grad, call, ctx, 1, idx, allowed)
    return bind


def average_pool_grad(ctx):
    """Launcher: ``run(dY, dX)``."""
    x3, y3, win = _planes(ctx, ctx.out(0).shape)
    kh, kw = win.kernel
    sh, sw = win.strides
    dh, dw = win.dilations
    ph, pw = win.pads_begin
    pe_h, pe_w = win.pads_end
    include_pad = bool(ctx.attr("count_include_pad"))
    ranges = _col_ranges(x3[2], y3[2], sw, dw, pw, kw)
    counts = np.outer(_tap_counts(x3[1], y3[1], kh, sh, dh, ph, pe_h, include_pad),
                      _tap_counts(x3[2], y3[2], kw, sw, dw, pw, pe_w, include_pad))

    @bindable
    def bind(dy, dx):
        return _average_pool_grad, (dy.reshape(y3), dx.reshape(x3), ranges, counts, kh, sh, sw, dh, ph)
    return bind


def _global(kernel, ctx):
    x = ctx.shape(0)
    nc = x[0] * x[1]
    rows = (nc, int(np.prod(x[2:], dtype=np.int64)))

    @bindable
    def bind(x, y):
        return kernel, (x.reshape(rows), y.reshape(nc))
    return bind


@bindable
def _fill_nan(x, y):
    return y.fill, (np.nan,)


def global_average_pool(ctx):
    """Launcher: ``run(X, Y)``. Over an empty spatial extent Y is NaN, a mean of nothing (the ONNX reference's
    answer; the shape rule refuses GlobalMaxPool there)."""
    if 0 in ctx.shape(0)[2:]:
        return _fill_nan
    return _global(_global_average, ctx)


def global_max_pool(ctx):
    """Launcher: ``run(X, Y)``."""
    return _global(_global_max, ctx)
