"""Conv kernels (NUMBA_NOTES §5): a jitted im2col into the planned workspace, then one batched
``np.matmul(out=)`` (BLAS) for the whole batch; a direct jitted loop when each group has one input channel
(depthwise), where per-group GEMMs would have an inner dimension of only kh * kw.

1-D convs run as 2-D ones with H = 1. Everything is a view of the caller's arrays: no allocation per call.
"""
from __future__ import annotations

import numpy as np

from edgetrain.ops.conv import conv_geometry

from ._jit import jit


# Each (n, c) plane is first copied into a zero-padded scratch plane ``xp``, so the copy and multiply-add
# loops below need no bounds logic. Loops run over 0-based ranges into sliced views: Numba then drops its
# negative-index wraparound check and LLVM vectorizes them (about 2x faster im2col than clipping ranges
# per row, 11x faster inner loops than indexing with ``ox + offset``).

@jit(inline="always")   # inlined: a nested dispatcher would miss in cold runs but never hit in warm ones
def _pad_plane(src, xp, ph, pw):
    """xp = src zero-padded by ``ph`` rows on top and ``pw`` columns on the left (the rest of xp is zero)."""
    h, w = src.shape
    hp, wp = xp.shape
    flat = xp.reshape(hp * wp)
    for k in range(ph * wp):
        flat[k] = 0
    for y in range(h):
        row = xp[ph + y]
        for k in range(pw):
            row[k] = 0
        dst = row[pw:pw + w]
        s = src[y]
        for k in range(w):
            dst[k] = s[k]
        tail = row[pw + w:]
        for k in range(wp - pw - w):
            tail[k] = 0
    rest = flat[(ph + h) * wp:]
    for k in range((hp - ph - h) * wp):
        rest[k] = 0


@jit
def _im2col(x, cols, xp, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow):
    """cols[n, (c*kh + i)*kw + j, oy*ow + ox] = x[n, c, oy*sh - ph + i*dh, ox*sw - pw + j*dw] (0 outside)."""
    n_batch, c_in = x.shape[0], x.shape[1]
    for n in range(n_batch):
        for c in range(c_in):
            _pad_plane(x[n, c], xp, ph, pw)
            for i in range(kh):
                for j in range(kw):
                    row = cols[n, (c * kh + i) * kw + j]
                    for oy in range(oh):
                        src = xp[oy * sh + i * dh, j * dw:]
                        dst = row[oy * ow:(oy + 1) * ow]
                        if sw == 1:
                            for k in range(ow):
                                dst[k] = src[k]
                        else:
                            for k in range(ow):
                                dst[k] = src[k * sw]


@jit
def _conv_direct(x, wt, y, xp, acc, group, sh, sw, dh, dw, ph, pw):
    """Convolution with one input channel per group (depthwise, or C_in = 1): each padded input plane is
    multiplied by every tap of each of its group's filters. With unit strides a tap is one long multiply-add
    over the flattened padded plane (``acc`` rows are ``wp`` wide; the extra columns are dropped)."""
    n_batch, c_in = x.shape[0], x.shape[1]
    m_out, _, kh, kw = wt.shape
    oh, ow = y.shape[2], y.shape[3]
    hp, wp = xp.shape
    xpf = xp.reshape(hp * wp)
    mg = m_out // group
    span = (oh - 1) * wp + ow
    for n in range(n_batch):
        for c in range(c_in):
            _pad_plane(x[n, c], xp, ph, pw)
            for m in range(c * mg, (c + 1) * mg):
                out = y[n, m]
                if sh == 1 and sw == 1:
                    for k in range(span):
                        acc[k] = 0
                    for i in range(kh):
                        j = 0
                        while j + 3 <= kw:   # three taps per pass: a third of the acc loads and stores
                            w0, w1, w2 = wt[m, 0, i, j], wt[m, 0, i, j + 1], wt[m, 0, i, j + 2]
                            shift = i * dh * wp + j * dw
                            s0 = xpf[shift:shift + span]
                            s1 = xpf[shift + dw:shift + dw + span]
                            s2 = xpf[shift + 2 * dw:shift + 2 * dw + span]
                            for k in range(span):
                                acc[k] += w0 * s0[k] + w1 * s1[k] + w2 * s2[k]
                            j += 3
                        while j < kw:
                            wv = wt[m, 0, i, j]
                            shift = i * dh * wp + j * dw
                            src = xpf[shift:shift + span]
                            for k in range(span):
                                acc[k] += wv * src[k]
                            j += 1
                    for oy in range(oh):
                        dst = out[oy]
                        a = acc[oy * wp:oy * wp + ow]
                        for k in range(ow):
                            dst[k] = a[k]
                else:
                    for oy in range(oh):
                        dst = out[oy]
                        for k in range(ow):
                            dst[k] = 0
                        for i in range(kh):
                            for j in range(kw):
                                wv = wt[m, 0, i, j]
                                src = xp[oy * sh + i * dh, j * dw:]
                                for k in range(ow):
                                    dst[k] += wv * src[k * sw]


def conv(ctx):
    """Launcher: ``run(X, W[, B], Y, *workspace)`` (workspace as ``ops.conv.conv_workspace`` declares)."""
    g = conv_geometry(ctx)
    win = g.window
    kh, kw = win.kernel
    sh, sw = win.strides
    dh, dw = win.dilations
    ph, pw = win.pads_begin
    oh, ow = win.out
    n, c, m, group = g.n, g.c, g.m, g.group
    cg, mg = c // group, m // group
    x4 = (n, c) + g.in_hw
    w4 = (m, cg, kh, kw)
    y4 = (n, m, oh, ow)
    n_in = len(ctx.node.inputs)
    has_bias = ctx.has_input(2)
    bias_shape = (1, m, 1, 1)

    if g.direct:
        def run(*args):
            y = args[n_in].reshape(y4)
            _conv_direct(args[0].reshape(x4), args[1].reshape(w4), y, args[n_in + 1], args[n_in + 2],
                         group, sh, sw, dh, dw, ph, pw)
            if has_bias:
                np.add(y, args[2].reshape(bias_shape), out=y)
        return run

    pointwise = g.pointwise
    ckk, ohw = g.ckk, g.ohw
    if group == 1:
        w_shape, cols_shape, y_shape = (m, ckk), (n, ckk, ohw), (n, m, ohw)
    else:   # grouped GEMM: W[g, Mg, Cg*kk] @ cols[n, g, Cg*kk, ohw] -> y[n, g, Mg, ohw]
        w_shape, y_shape = (group, mg, ckk // group), (n, group, mg, ohw)
        cols_shape = (n, group, ckk // group, ohw)

    def run(*args):
        x, y = args[0], args[n_in]
        if pointwise:
            cols = x.reshape(cols_shape)
        else:
            cols = args[n_in + 1]
            _im2col(x.reshape(x4), cols, args[n_in + 2], kh, kw, sh, sw, dh, dw, ph, pw, oh, ow)
            cols = cols.reshape(cols_shape)
        np.matmul(args[1].reshape(w_shape), cols, out=y.reshape(y_shape))
        if has_bias:
            y = y.reshape(y4)
            np.add(y, args[2].reshape(bias_shape), out=y)
    return run
