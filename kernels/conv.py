"""Conv kernels (NUMBA_NOTES §5): a jitted im2col into the planned workspace, then one batched
``np.matmul(out=)`` (BLAS) for the whole batch; a direct jitted loop when each group has one input channel
(depthwise), where per-group GEMMs would have an inner dimension of only kh * kw.

ConvGrad (com.microsoft) takes the same two paths. GEMM path: with dY's batch axis moved next to its pixels
(dY_t, [M, N*OH*OW]), dW = dY_t im2col(X)^T and dX = col2im(W^T dY_t), each one GEMM over the whole batch
(X's columns recomputed into the workspace, which then holds dX's; ``ops.conv.conv_grad_layout``); dB a jitted
row sum. The direct path computes dW and dX tap by tap over padded planes.

ConvTranspose is ConvGrad's dX path with X in dY's place (``ops.conv`` derives the Conv whose adjoint it is).

1-D convs run as 2-D ones with H = 1. Everything is a view of the caller's arrays: no allocation per call.
"""
from __future__ import annotations

import numpy as np

from edgetrain.ops.conv import (
    batch_gemm,
    col2im_geometry,
    conv_geometry,
    conv_grad_layout,
    conv_grad_outputs,
    conv_transpose_geometry,
    stacked_planes,
)

from edgetrain import parallel

from . import bindable, in_turn
from ._gemm_threads import per_image, split
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
def _im2col(x, cols, xp, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow, rows_first):
    """cols[n, (c*kh + i)*kw + j, oy*ow + ox] = x[n, c, oy*sh - ph + i*dh, ox*sw - pw + j*dw] (0 outside);
    with ``rows_first`` the first two axes of cols are swapped ([C*kh*kw, N, OH*OW]: one GEMM's operand for
    the whole batch)."""
    n_batch, c_in = x.shape[0], x.shape[1]
    for n in range(n_batch):
        for c in range(c_in):
            _pad_plane(x[n, c], xp, ph, pw)
            for i in range(kh):
                for j in range(kw):
                    r = (c * kh + i) * kw + j
                    row = cols[r, n] if rows_first else cols[n, r]
                    for oy in range(oh):
                        src = xp[oy * sh + i * dh, j * dw:]
                        dst = row[oy * ow:(oy + 1) * ow]
                        if sw == 1:
                            for k in range(ow):
                                dst[k] = src[k]
                        else:
                            for k in range(ow):
                                dst[k] = src[k * sw]


@jit(inline="always")
def _phase_split(src, phases, sh, sw, ph, pw):
    """phases[a*sw + b, r, q] = xpad[r*sh + a, q*sw + b], xpad being ``src`` zero-padded by ``ph`` rows on top
    and ``pw`` columns on the left (zeros past it too): a strided tap over xpad is then a unit-stride one over
    one phase. With unit strides the one phase is the padded plane."""
    if sh == 1 and sw == 1:
        _pad_plane(src, phases[0], ph, pw)
        return
    h, w = src.shape
    flat = phases.reshape(phases.size)
    for k in range(phases.size):
        flat[k] = 0
    for y in range(h):
        a, r = (y + ph) % sh, (y + ph) // sh
        s = src[y]
        if sw == 2:    # one pass per row into both column phases (LLVM vectorizes the de-interleave)
            b0 = pw % 2
            o0 = phases[a * 2 + b0, r, pw // 2:]
            o1 = phases[a * 2 + 1 - b0, r, (pw + 1) // 2:]
            half = w // 2
            for k in range(half):
                o0[k] = s[U(2) * U(k)]
                o1[k] = s[U(2) * U(k) + U(1)]
            if w % 2:
                o0[half] = s[w - 1]
        else:
            for b in range(sw):
                j0 = (b - pw) % sw          # the first column of src that lands in phase b
                o = phases[a * sw + b, r, (j0 + pw) // sw:]
                sb = s[j0:]
                for k in range((w - j0 + sw - 1) // sw):
                    o[k] = sb[U(k) * U(sw)]


@jit(inline="always")
def _tap(pf, offsets, t, span):
    """Tap t's ``span`` elements of the flattened phases."""
    o = offsets[t]
    return pf[o:o + span]


@jit(inline="always")
def _tap_passes(pf, wm, offsets, acc, span):
    """acc[k] = sum over taps t of wm[t] * pf[offsets[t] + k], k < span. Taps go six at a time: one pass over
    acc per six taps, and at most seven arrays per loop, which LLVM still vectorizes with runtime alias checks
    (nine taps at once it leaves scalar)."""
    taps = wm.shape[0]
    t = 0
    while t < taps:
        if taps - t >= 6:
            w0, w1, w2, w3, w4, w5 = wm[t], wm[t + 1], wm[t + 2], wm[t + 3], wm[t + 4], wm[t + 5]
            s0, s1 = _tap(pf, offsets, t, span), _tap(pf, offsets, t + 1, span)
            s2, s3 = _tap(pf, offsets, t + 2, span), _tap(pf, offsets, t + 3, span)
            s4, s5 = _tap(pf, offsets, t + 4, span), _tap(pf, offsets, t + 5, span)
            if t == 0:
                for k in range(span):
                    acc[k] = (w0 * s0[k] + w1 * s1[k] + w2 * s2[k]) + (w3 * s3[k] + w4 * s4[k]
                                                                       + w5 * s5[k])
            else:
                for k in range(span):
                    acc[k] += (w0 * s0[k] + w1 * s1[k] + w2 * s2[k]) + (w3 * s3[k] + w4 * s4[k]
                                                                        + w5 * s5[k])
            t += 6
        elif taps - t >= 3:
            w0, w1, w2 = wm[t], wm[t + 1], wm[t + 2]
            s0, s1 = _tap(pf, offsets, t, span), _tap(pf, offsets, t + 1, span)
            s2 = _tap(pf, offsets, t + 2, span)
            if t == 0:
                for k in range(span):
                    acc[k] = w0 * s0[k] + w1 * s1[k] + w2 * s2[k]
            else:
                for k in range(span):
                    acc[k] += w0 * s0[k] + w1 * s1[k] + w2 * s2[k]
            t += 3
        else:
            w0 = wm[t]
            s0 = _tap(pf, offsets, t, span)
            if t == 0:
                for k in range(span):
                    acc[k] = w0 * s0[k]
            else:
                for k in range(span):
                    acc[k] += w0 * s0[k]
            t += 1


@jit(fastmath=True)
def _conv_direct(x, wt, y, phases, acc, offsets, group, sh, sw, ph, pw):
    """Convolution with one input channel per group (depthwise, or C_in = 1). Each input plane is split into
    its stride phases once (``_phase_split``); every tap t is then one unit-stride multiply-add over the
    flattened phases from ``offsets[t]`` (``tap_offsets``) into ``acc`` (``_tap_passes``), whose rows are ``wq``
    wide (the extra columns are dropped when copying out)."""
    n_batch, c_in = x.shape[0], x.shape[1]
    m_out, _, kh, kw = wt.shape
    oh, ow = y.shape[2], y.shape[3]
    n_phases, hq, wq = phases.shape
    pf = phases.reshape(n_phases * hq * wq)
    mg = m_out // group
    span = (oh - 1) * wq + ow
    taps = kh * kw
    for n in range(n_batch):
        for c in range(c_in):
            _phase_split(x[n, c], phases, sh, sw, ph, pw)
            for m in range(c * mg, (c + 1) * mg):
                _tap_passes(pf, wt[m, 0].reshape(taps), offsets, acc, span)
                out = y[n, m]
                for oy in range(oh):
                    dst = out[oy]
                    a = acc[oy * wq:oy * wq + ow]
                    for k in range(ow):
                        dst[k] = a[k]


@jit(fastmath=True)
def _conv_direct_stacked(x, wt, y, tall, acc, offsets, group, hp, ph, pw):
    """``_conv_direct`` with unit strides for small planes: per input channel the padded planes of all the images
    are stacked into ``tall`` ([images * hp, wp]), and each tap is one pass over all of them (the rows between
    two images' outputs are computed and dropped). A 7x7 plane alone is a 61-element pass per six taps, where the
    loops' set-up costs more than the arithmetic (MobileNetV2's 960-channel 7x7 layers: 1 GFMA/s)."""
    n_batch, c_in = x.shape[0], x.shape[1]
    m_out, _, kh, kw = wt.shape
    oh, ow = y.shape[2], y.shape[3]
    wp = tall.shape[1]
    pf = tall.reshape(tall.shape[0] * wp)
    mg = m_out // group
    span = ((n_batch - 1) * hp + oh - 1) * wp + ow
    h, w = x.shape[2], x.shape[3]
    for k in range(pf.shape[0]):      # the pads are the same cells for every channel: zeroed once
        pf[k] = 0
    for c in range(c_in):
        for n in range(n_batch):
            src = x[n, c]
            for r in range(h):
                dst = tall[n * hp + ph + r, pw:pw + w]
                row = src[r]
                for k in range(w):
                    dst[k] = row[k]
        for m in range(c * mg, (c + 1) * mg):
            _tap_passes(pf, wt[m, 0].reshape(kh * kw), offsets, acc, span)
            for n in range(n_batch):
                out = y[n, m]
                for oy in range(oh):
                    dst = out[oy]
                    a = acc[(n * hp + oy) * wp:(n * hp + oy) * wp + ow]
                    for k in range(ow):
                        dst[k] = a[k]


def tap_offsets(kernel, strides, dilations, phase_shape) -> np.ndarray:
    """Where each tap (row-major over the kernel) starts in ``_conv_direct``'s flattened phases: its phase's
    plane, shifted by the whole phase rows and columns it lies below and right of the window's corner."""
    (kh, kw), (sh, sw), (dh, dw), (hq, wq) = kernel, strides, dilations, phase_shape
    i, j = np.divmod(np.arange(kh * kw, dtype=np.int64), kw)
    return ((i * dh % sh) * sw + j * dw % sw) * (hq * wq) + (i * dh // sh) * wq + j * dw // sw


def _over_images(kernel, n: int, slots: int, args_of):
    """``(fn, args)`` running ``kernel(*args_of(lo, hi, slot))`` over the batch's images: one call, or one per
    slice of the batch at once on intra-op threads when the plan gave each of ``slots`` > 1 slices its own
    scratch (``ops.conv.image_slots``)."""
    if slots == 1:
        return kernel, args_of(0, n, 0)

    def work(slot, lo, hi):
        kernel(*args_of(lo, hi, slot))

    def run():
        parallel.split(n, work, 1, slots)
    run.kernel_calls = ((kernel, args_of(0, n, 0)),)     # a slice's types are the whole batch's
    return run, ()


def _then(*calls):
    """``(fn, args)`` running the ``(fn, args)`` pairs in order."""
    def run():
        for fn, args in calls:
            fn(*args)
    run.kernel_calls = calls
    return run, ()


def _add_bias(fn, args, y, bias):
    """``(fn, args)`` followed by y += bias: a Conv keeps its bias only when planning folds it (``plan.lower``
    splits it off into an element-wise Add otherwise)."""
    def run():
        fn(*args)
        np.add(y, bias, out=y)
    run.kernel_calls = ((fn, args),)
    return run, ()


def conv(ctx):
    """Launcher: ``run(X, W[, B], Y, *workspace)`` (workspace as ``ops.conv.conv_workspace`` declares), bound
    once per program (``kernels.bindable``): the views, the path and the kernel's arguments are fixed then, and
    a step calls the jitted kernel (direct path) or np.matmul (pointwise) with no Python in between."""
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

    def with_bias(fn, args, arrays):
        if not has_bias:
            return fn, args
        return _add_bias(fn, args, arrays[n_in].reshape(y4), arrays[2].reshape(bias_shape))

    if g.direct:
        stacked = stacked_planes(g)

        @bindable
        def bind_direct(*arrays):
            phases, acc = arrays[n_in + 1:n_in + 3]          # one of each per slice of the batch
            offsets = tap_offsets(win.kernel, win.strides, win.dilations, phases.shape[2:])
            x, wt, y = arrays[0].reshape(x4), arrays[1].reshape(w4), arrays[n_in].reshape(y4)
            if stacked:
                hp = g.in_hw[0] + win.pads_begin[0] + win.pads_end[0]      # (phases.shape[2] // n but for 0 images)
                offsets = tap_offsets(win.kernel, win.strides, win.dilations, (hp, phases.shape[3]))
                fn, args = _over_images(_conv_direct_stacked, n, phases.shape[0], lambda lo, hi, k: (
                    x[lo:hi], wt, y[lo:hi], phases[k, 0], acc[k], offsets, group, hp, ph, pw))
                return with_bias(fn, args, arrays)
            fn, args = _over_images(_conv_direct, n, phases.shape[0], lambda lo, hi, k: (
                x[lo:hi], wt, y[lo:hi], phases[k], acc[k], offsets, group, sh, sw, ph, pw))
            return with_bias(fn, args, arrays)
        return bind_direct

    ckk, ohw = g.ckk, g.ohw
    if group == 1:
        w_shape, cols_shape, y_shape = (m, ckk), (n, ckk, ohw), (n, m, ohw)
    else:   # grouped GEMM: W[g, Mg, Cg*kk] @ cols[n, g, Cg*kk, ohw] -> y[n, g, Mg, ohw]
        w_shape, y_shape = (group, mg, ckk // group), (n, group, mg, ohw)
        cols_shape = (n, group, ckk // group, ohw)

    if g.pointwise:
        @bindable
        def bind_pointwise(*arrays):          # np.matmul is a ufunc: the third argument is out
            return with_bias(*per_image(np.matmul, arrays[1].reshape(w_shape), arrays[0].reshape(cols_shape),
                                        arrays[n_in].reshape(y_shape)), arrays)
        return bind_pointwise

    if batch_gemm(g):
        @bindable
        def bind_batch(*arrays):
            cols, planes, rows = arrays[n_in + 1:n_in + 4]
            x = arrays[0].reshape(x4)
            im2col = _over_images(_im2col, n, planes.shape[0], lambda lo, hi, k: (
                x[lo:hi], cols[:, lo:hi], planes[k], kh, kw, sh, sw, dh, dw, ph, pw, oh, ow, True))
            gemm = split(np.matmul, arrays[1].reshape(m, ckk), cols.reshape(ckk, n * ohw),
                         rows.reshape(m, n * ohw))
            out = (np.copyto, (arrays[n_in].reshape(n, m, ohw), rows.swapaxes(0, 1)))
            return with_bias(*_then(im2col, gemm, out), arrays)
        return bind_batch

    @bindable
    def bind_gemm(*arrays):
        cols, planes = arrays[n_in + 1:n_in + 3]          # a padded plane per slice of the batch
        x = arrays[0].reshape(x4)
        if planes.shape[0] == 1:
            return with_bias(*in_turn([(_im2col, (x, cols, planes[0], kh, kw, sh, sw, dh, dw, ph, pw, oh, ow,
                                                  False)),
                                       (np.matmul, (arrays[1].reshape(w_shape), cols.reshape(cols_shape),
                                                    arrays[n_in].reshape(y_shape)))]), arrays)
        im2col = _over_images(_im2col, n, planes.shape[0], lambda lo, hi, k: (
            x[lo:hi], cols[lo:hi], planes[k], kh, kw, sh, sw, dh, dw, ph, pw, oh, ow, False))
        gemm = per_image(np.matmul, arrays[1].reshape(w_shape), cols.reshape(cols_shape),
                         arrays[n_in].reshape(y_shape))
        return with_bias(*_then(im2col, gemm), arrays)
    return bind_gemm


# --- ConvGrad ---------------------------------------------------------------------------------------------

@jit(inline="always")
def _crop_plane(xp, dst, ph, pw):
    """dst = the interior of the padded plane xp (``ph`` rows, ``pw`` columns of padding before it)."""
    h, w = dst.shape
    for y in range(h):
        src = xp[ph + y, pw:pw + w]
        row = dst[y]
        for k in range(w):
            row[k] = src[k]


U = np.uint64


@jit(inline="always")
def _col2im_into(cols, dx, xp, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow, rows_first):
    """The adjoint of ``_im2col``: dx[n, c, y, x] = sum of cols[n, (c*kh + i)*kw + j, oy*ow + ox] over the
    taps (i, j, oy, ox) that read x[n, c, y, x] (``rows_first``: cols[(c*kh + i)*kw + j, n, oy*ow + ox]). Each
    plane is accumulated in the zero-padded scratch ``xp``, whose interior is then copied out (the pads' share
    is dropped). Unsigned flat indices (``U``) spare Numba's negative-index check: 1.2-1.4x faster than adding
    into sliced rows here."""
    n_batch, c_in = dx.shape[0], dx.shape[1]
    hp, wp = xp.shape
    flat = xp.reshape(hp * wp)
    for n in range(n_batch):
        for c in range(c_in):
            for k in range(hp * wp):
                flat[k] = 0
            for i in range(kh):
                for j in range(kw):
                    r = (c * kh + i) * kw + j
                    row = cols[r, n] if rows_first else cols[n, r]
                    for oy in range(oh):
                        base = U((oy * sh + i * dh) * wp + j * dw)
                        src = U(oy * ow)
                        if sw == 1:
                            for k in range(ow):
                                flat[base + U(k)] += row[src + U(k)]
                        else:
                            for k in range(ow):
                                flat[base + U(k * sw)] += row[src + U(k)]
            _crop_plane(xp, dx[n, c], ph, pw)


@jit
def _col2im(cols, dx, xp, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow):
    """``_col2im_into`` from cols [N, C*kh*kw, OH*OW]."""
    _col2im_into(cols, dx, xp, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow, False)


@jit
def _col2im_rows(cols, dx, xp, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow):
    """``_col2im_into`` from cols [C*kh*kw, N, OH*OW], the layout of one GEMM over the batch."""
    _col2im_into(cols, dx, xp, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow, True)


@jit(fastmath=True)
def _conv_direct_grad(x, wt, dy, dx, dwt, xp, dxp, dyp, want_dx, want_dw, group, sh, sw, dh, dw, ph, pw):
    """ConvGrad with one input channel per group (c = m // (M / group)):
    dW[m, 0, i, j] = sum_{n, oy, ox} dY[n, m, oy, ox] * Xpad[n, c, oy*sh + i*dh, ox*sw + j*dw] and
    dXpad[n, c, oy*sh + i*dh, ox*sw + j*dw] += W[m, 0, i, j] * dY[n, m, oy, ox]. With unit strides dY's plane
    is first laid on rows ``wp`` wide (zeros past ``ow``) in ``dyp``, so each tap is one long dot product (dW)
    or multiply-add (dX) over the flattened padded planes, as in ``_conv_direct``."""
    n_batch, c_in = x.shape[0], x.shape[1]
    m_out, _, kh, kw = wt.shape
    oh, ow = dy.shape[2], dy.shape[3]
    hp, wp = xp.shape
    xpf = xp.reshape(hp * wp)
    dxpf = dxp.reshape(hp * wp)
    mg = m_out // group
    span = (oh - 1) * wp + ow
    zero = dy.dtype.type(0)
    if want_dw:
        for m in range(m_out):
            for i in range(kh):
                for j in range(kw):
                    dwt[m, 0, i, j] = 0
    for n in range(n_batch):
        for c in range(c_in):
            if want_dw:
                _pad_plane(x[n, c], xp, ph, pw)
            if want_dx:
                for k in range(hp * wp):
                    dxpf[k] = 0
            for m in range(c * mg, (c + 1) * mg):
                g = dy[n, m]
                if sh == 1 and sw == 1:
                    for oy in range(oh):
                        row = dyp[oy * wp:(oy + 1) * wp]
                        src = g[oy]
                        for k in range(ow):
                            row[k] = src[k]
                        for k in range(ow, wp):
                            row[k] = 0
                    for i in range(kh):
                        for j in range(kw):
                            shift = i * dh * wp + j * dw
                            if want_dw:
                                s = zero
                                xs = xpf[shift:shift + span]
                                for k in range(span):
                                    s += dyp[k] * xs[k]
                                dwt[m, 0, i, j] += s
                            if want_dx:
                                wv = wt[m, 0, i, j]
                                dst = dxpf[shift:shift + span]
                                for k in range(span):
                                    dst[k] += wv * dyp[k]
                else:
                    for i in range(kh):
                        for j in range(kw):
                            s = zero
                            wv = wt[m, 0, i, j]
                            for oy in range(oh):
                                r = oy * sh + i * dh
                                grow = g[oy]
                                if want_dw:
                                    xs = xp[r, j * dw:]
                                    for k in range(ow):
                                        s += grow[k] * xs[k * sw]
                                if want_dx:
                                    dst = dxp[r, j * dw:]
                                    for k in range(ow):
                                        dst[k * sw] += wv * grow[k]
                            if want_dw:
                                dwt[m, 0, i, j] += s
            if want_dx:
                _crop_plane(dxp, dx[n, c], ph, pw)


@jit(fastmath=True)
def _conv_direct_grad_stacked(x, wt, dy, dx, dwt, xp, dxp, dyp, want_dx, want_dw, group, hp, dh, dw, ph, pw,
                              c_lo, c_hi):
    """``_conv_direct_grad`` with unit strides for small planes (``_conv_direct_stacked``): per input channel the
    images' padded X planes are stacked in ``xp`` ([images * hp, wp]) and their dY planes in ``dyp`` on the same
    rows (zeros in the pads and between images), so each tap is one multiply-add (dX, into the stacked ``dxp``)
    over all of them, and a dot product per image (dW: the per-plane kernel's sums, in its order). Input channels
    ``c_lo`` to ``c_hi`` (and their groups' outputs) only: a thread's share, on its own scratch."""
    n_batch = x.shape[0]
    m_out, _, kh, kw = wt.shape
    oh, ow = dy.shape[2], dy.shape[3]
    h, w = x.shape[2], x.shape[3]
    wp = xp.shape[1]
    size = n_batch * hp * wp
    xpf = xp.reshape(xp.shape[0] * wp)
    dxpf = dxp.reshape(dxp.shape[0] * wp)
    mg = m_out // group
    span = ((n_batch - 1) * hp + oh - 1) * wp + ow
    one = (oh - 1) * wp + ow          # one image's share of the span
    zero = dy.dtype.type(0)
    for k in range(size):             # the pads are the same cells for every channel: zeroed once
        xpf[k] = 0
        dyp[k] = 0
    for c in range(c_lo, c_hi):
        if want_dw:
            for n in range(n_batch):
                plane = x[n, c]        # (names typed once each: the trimmed build's compiler will not unify)
                for r in range(h):
                    into = xp[n * hp + ph + r, pw:pw + w]
                    line = plane[r]
                    for k in range(w):
                        into[k] = line[k]
        if want_dx:
            for k in range(size):
                dxpf[k] = 0
        for m in range(c * mg, (c + 1) * mg):
            for n in range(n_batch):
                g = dy[n, m]
                for oy in range(oh):
                    row = dyp[(n * hp + oy) * wp:(n * hp + oy) * wp + ow]
                    src = g[oy]
                    for k in range(ow):
                        row[k] = src[k]
            for i in range(kh):
                for j in range(kw):
                    shift = i * dh * wp + j * dw
                    if want_dw:         # image by image, summed in image order: the per-plane kernel's bits
                        total = zero
                        for n in range(n_batch):
                            base = n * hp * wp
                            s = zero
                            xs = xpf[base + shift:base + shift + one]
                            gs = dyp[base:base + one]
                            for k in range(one):
                                s += gs[k] * xs[k]
                            total += s
                        dwt[m, 0, i, j] = total
                    if want_dx:
                        wv = wt[m, 0, i, j]
                        dst = dxpf[shift:shift + span]
                        for k in range(span):
                            dst[k] += wv * dyp[k]
        if want_dx:
            for n in range(n_batch):
                _crop_plane(dxp[n * hp:(n + 1) * hp], dx[n, c], ph, pw)


@jit(fastmath=True)
def _bias_grad(dy, db):
    """db[m] = sum of dy[n, m, :] over n (each row summed in the element type, rows in float64)."""
    n_batch, m_out, size = dy.shape
    zero = dy.dtype.type(0)
    for m in range(m_out):
        total = 0.0
        for n in range(n_batch):
            row = dy[n, m]
            s = zero
            for k in range(size):
                s += row[k]
            total += s
        db[m] = total


def _per_group(a, b, out) -> list[tuple]:
    """One 2-D product per group (``a[g] @ b[g] -> out[g]``) as ``(fn, args)``, in row blocks on intra-op
    threads when large: numpy's stacked matmul is up to 3x slower than its 2-D one when an operand is a
    transposed view."""
    return [split(np.matmul, a[k], b[k], out[k]) for k in range(a.shape[0])]


def conv_grad(ctx):
    """Launcher: ``run(dY, X, W, [dX, [dW, [dB]]], *workspace)`` (``ops.conv.conv_grad_workspace``); an output
    slot is None when its name is empty."""
    g = conv_geometry(ctx, 1, 2, None)
    want_dx, want_dw, want_db = conv_grad_outputs(ctx)
    n_out = len(ctx.node.outputs)
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
    y3 = (n, m, oh * ow)
    dtype = ctx.type(1).dtype

    if g.direct:
        none4 = np.zeros((1, 1, 1, 1), dtype)   # stands in for an output nobody wants (never touched)
        stacked = stacked_planes(g)
        hp = g.in_hw[0] + win.pads_begin[0] + win.pads_end[0]      # a padded plane's rows (also for 0 images)

        @bindable
        def bind_direct(*args):
            dy, x, w = args[0], args[1], args[2]
            xp, dxp, dyp = args[3 + n_out:]
            dx = args[3].reshape(x4) if want_dx else none4
            dwt = args[4].reshape(w4) if want_dw else none4
            call = (x.reshape(x4), w.reshape(w4), dy.reshape(y4), dx, dwt, xp, dxp, dyp, want_dx, want_dw,
                    group, sh, sw, dh, dw, ph, pw)
            grad = _conv_direct_grad, call
            listed = grad        # the kernel and arguments a first call compiles (compile_ahead)
            if stacked:      # a scratch plane set per thread (leading axis), each thread a block of channels
                def channels(slot, lo, hi):
                    return (*call[:5], xp[slot], dxp[slot], dyp[slot], want_dx, want_dw, group, hp,
                            dh, dw, ph, pw, lo, hi)
                listed = _conv_direct_grad_stacked, channels(0, 0, c)
                grad = listed if xp.shape[0] == 1 else (
                    parallel.split, (c, lambda slot, lo, hi: _conv_direct_grad_stacked(*channels(slot, lo, hi)), 1,
                                     xp.shape[0]))
            bias = (dy.reshape(y3), args[5]) if want_db else None

            def run():
                if want_dx or want_dw:
                    grad[0](*grad[1])
                if bias is not None:
                    _bias_grad(*bias)
            run.kernel_calls = ([listed] if want_dx or want_dw else []) + \
                ([(_bias_grad, bias)] if bias is not None else [])
            return run, ()
        return bind_direct

    pointwise = g.pointwise
    ckk, ohw = g.ckk, g.ohw
    cgkk = ckk // group
    cols_n = n * ohw                     # columns of the one GEMM over the batch
    window = (kh, kw, sh, sw, dh, dw, ph, pw, oh, ow)
    layout = conv_grad_layout(ctx)

    @bindable
    def bind(*args):
        dy, x, w = args[0], args[1], args[2]
        ws = dict(zip(layout, args[3 + n_out:]))
        # dY and X with the batch axis next to the pixels ([M, N*OH*OW]): views for one image, else copies
        dyt = dy.reshape(m, cols_n) if n == 1 else ws.get("dy_t")
        copies = [(dyt.reshape(m, n, ohw), dy.reshape(y3).swapaxes(0, 1))] if "dy_t" in ws else []
        weight = dx_call = im2col = col2im = bias = None
        # X's columns: X itself when pointwise (a view for one image; else X, then dX, batch axis moved in)
        xt = (x if n == 1 else ws.get("x_t")) if pointwise else ws.get("cols")
        back = []
        if pointwise and n > 1:
            if want_dw:
                copies.append((xt.reshape(c, n, ohw), x.reshape(n, c, ohw).swapaxes(0, 1)))
            if want_dx:
                back.append((args[3].reshape(n, c, ohw), xt.reshape(c, n, ohw).swapaxes(0, 1)))
        if want_dw:
            xt_g = xt.reshape(group, cgkk, cols_n).swapaxes(-1, -2)
            weight = _per_group(dyt.reshape(group, mg, cols_n), xt_g, args[4].reshape(group, mg, cgkk))
            if not pointwise:
                im2col = _over_images(_im2col, n, ws["plane"].shape[0], lambda lo, hi, k: (
                    x.reshape(x4)[lo:hi], ws["cols"].reshape(ckk, n, ohw)[:, lo:hi], ws["plane"][k], *window,
                    True))
        if want_dx:                      # W^T [dY over the batch]: dX's columns, [C*kh*kw, N*OH*OW]
            wt = w.reshape(group, mg, cgkk).swapaxes(-1, -2)
            dst = (args[3] if n == 1 else xt) if pointwise else ws["cols"]
            dx_call = _per_group(wt, dyt.reshape(group, mg, cols_n), dst.reshape(group, cgkk, cols_n))
            if not pointwise:
                col2im = _over_images(_col2im_rows, n, ws["plane"].shape[0], lambda lo, hi, k: (
                    ws["cols"].reshape(ckk, n, ohw)[:, lo:hi], args[3].reshape(x4)[lo:hi], ws["plane"][k],
                    *window))
        if want_db:
            bias = (dy.reshape(y3), args[5])

        def run():
            for dst, src in copies:
                np.copyto(dst, src)
            if weight is not None:
                if im2col is not None:
                    im2col[0](*im2col[1])
                for fn, gemm in weight:
                    fn(*gemm)
            if bias is not None:
                _bias_grad(*bias)
            if dx_call is not None:
                for fn, gemm in dx_call:
                    fn(*gemm)
                if col2im is not None:
                    col2im[0](*col2im[1])
                for dst, src in back:
                    np.copyto(dst, src)
        run.kernel_calls = [c for c in (im2col, (_bias_grad, bias) if bias is not None else None, col2im)
                            if c is not None] + (weight or []) + (dx_call or [])
        return run, ()
    return bind


# --- ConvTranspose ----------------------------------------------------------------------------------------

def conv_transpose(ctx):
    """Launcher: ``run(X, W[, B], Y, *workspace)`` (``ops.conv.conv_transpose_workspace``). Y = col2im(W^T X)
    (+ B): ConvGrad's dX of the Conv from Y to X, X in place of that Conv's output gradient."""
    g = conv_transpose_geometry(ctx).conv
    win = g.window
    kh, kw = win.kernel
    sh, sw = win.strides
    dh, dw = win.dilations
    ph, pw = win.pads_begin
    oh, ow = win.out
    n, c, m, group = g.n, g.c, g.m, g.group
    cg, mg = c // group, m // group
    y4 = (n, c) + g.in_hw          # ConvTranspose's output: the Conv's input
    w4 = (m, cg, kh, kw)
    x4 = (n, m, oh, ow)            # ConvTranspose's input: the Conv's output
    n_in = len(ctx.node.inputs)
    has_bias = ctx.has_input(2)
    bias_shape = (1, c, 1, 1)

    if g.direct:
        def run_direct(*args):
            y = args[n_in].reshape(y4)
            plane, xrow = args[n_in + 1], args[n_in + 2]
            # dW is not wanted: the Conv-input slot is only read for its shape, and one plane serves both
            _conv_direct_grad(y, args[1].reshape(w4), args[0].reshape(x4), y, y, plane, plane, xrow,
                              True, False, group, sh, sw, dh, dw, ph, pw)
            if has_bias:
                np.add(y, args[2].reshape(bias_shape), out=y)
        return run_direct

    pointwise = g.pointwise
    ckk, ohw = g.ckk, g.ohw
    cgkk = ckk // group
    w_g, cols_g, x_g = (group, mg, cgkk), (n, group, cgkk, ohw), (n, group, mg, ohw)

    def run(*args):
        y = args[n_in]
        wt = args[1].reshape(w_g).swapaxes(-1, -2)
        if pointwise:
            np.matmul(wt, args[0].reshape(x_g), out=y.reshape(cols_g))
        else:
            cols = args[n_in + 1]
            np.matmul(wt, args[0].reshape(x_g), out=cols.reshape(cols_g))   # per image: W^T X[n]
            _col2im(cols, y.reshape(y4), args[n_in + 2], kh, kw, sh, sw, dh, dw, ph, pw, oh, ow)
        if has_bias:
            y = y.reshape(y4)
            np.add(y, args[2].reshape(bias_shape), out=y)
    return run


def col2im(ctx):
    """Launcher: ``run(X, image_shape, block_shape, Y)``. The image cell each (block cell, position) lands on,
    or -1 in the pads, is tabulated once from the geometry."""
    image, block, strides, dilations, pads, _, steps = col2im_geometry(ctx)
    cell = np.stack(np.meshgrid(*[np.arange(b) for b in block], indexing="ij"), -1).reshape(-1, 1, len(block))
    pos = np.stack(np.meshgrid(*[np.arange(s) for s in steps], indexing="ij"), -1).reshape(1, -1, len(block))
    coord = pos * np.array(strides) - np.array(pads) + cell * np.array(dilations)       # [cells, L, dims]
    inside = np.all((coord >= 0) & (coord < np.array(image)), axis=-1)
    table = np.where(inside, np.ravel_multi_index(tuple(np.clip(coord, 0, np.array(image) - 1).T), image).T, -1)
    n, c = ctx.shape(0)[0], ctx.shape(0)[1] // table.shape[0]
    hw = int(np.prod(image, dtype=np.int64))

    def run(x, _image, _block, y):
        _col2im_table(x.reshape(n, c, table.shape[0], table.shape[1]), table, y.reshape(n, c, hw))
    return run


@jit
def _col2im_table(x, table, y):
    """y = 0, then y[n, c, table[b, l]] += x[n, c, b, l] where the table is not -1."""
    y[:] = 0
    for i in range(x.shape[0]):
        for c in range(x.shape[1]):
            for b in range(table.shape[0]):
                for p in range(table.shape[1]):
                    t = table[b, p]
                    if t >= 0:
                        y[i, c, t] += x[i, c, b, p]
