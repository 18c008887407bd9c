"""GridSample and GridSampleGrad: per output point, ``_taps`` lists the input pixels read (flat index, -1 for a
padding zero) with their weights and the weights' derivatives by the two grid coordinates; the forward pass
sums weight * X over the taps, the backward pass scatters dY with the same weights (dX) and contracts the
derivatives with X (dgrid). Grid coordinates come from data: every tap index is range-checked before it is
used, and a non-finite coordinate reads padding zeros."""
from __future__ import annotations

import math

import numpy as np

from edgetrain.ops.sampling import codes, geometry

from ._jit import jit

CUBIC_A = -0.75   # the cubic convolution constant ONNX and torch use


@jit(inline="always")
def _unnormalize(g, size, align):
    """grid value in [-1, 1] -> pixel coordinate, and d coordinate / d g."""
    if align:
        return (g + 1.0) * 0.5 * (size - 1), 0.5 * (size - 1)
    return ((g + 1.0) * size - 1.0) * 0.5, 0.5 * size


@jit(inline="always")
def _reflect(c, twice_low, twice_high):
    """Reflect c into [twice_low / 2, twice_high / 2] as a mirror; returns (c', d c' / d c)."""
    if twice_low == twice_high:
        return 0.0, 0.0
    low = twice_low * 0.5
    span = (twice_high - twice_low) * 0.5
    c = c - low
    sign = 1.0
    if c < 0:
        sign = -1.0
        c = -c
    extra = np.fmod(c, span)
    if int(math.floor(c / span)) % 2 == 0:
        return extra + low, sign
    return span - extra + low, -sign


@jit(inline="always")
def _pad(c, size, pad, align):
    """border / reflection padding of a coordinate (zeros: unchanged); returns (c', d c' / d c)."""
    if pad == 0:
        return c, 1.0
    d = 1.0
    if pad == 2:
        if align:
            c, d = _reflect(c, 0.0, 2.0 * (size - 1))
        else:
            c, d = _reflect(c, -1.0, 2.0 * size - 1.0)
    if c <= 0:
        return 0.0, 0.0
    if c >= size - 1:
        return float(size - 1), 0.0
    return c, d


@jit(inline="always")
def _index(c, size):
    """The pixel at integral coordinate c, or -1 outside [0, size) (NaN included)."""
    if c >= 0 and c < size:
        return int(c)
    return -1


@jit(inline="always")
def _cubic(t, k):
    """Weight of cubic tap k (0..3, at floor - 1 + k) at fraction t, and its derivative by t."""
    a = CUBIC_A
    if k == 0 or k == 3:
        s = t + 1.0 if k == 0 else 2.0 - t
        w = ((a * s - 5.0 * a) * s + 8.0 * a) * s - 4.0 * a
        dw = (3.0 * a * s - 10.0 * a) * s + 8.0 * a
    else:
        s = t if k == 1 else 1.0 - t
        w = ((a + 2.0) * s - (a + 3.0)) * s * s + 1.0
        dw = (3.0 * (a + 2.0) * s - 2.0 * (a + 3.0)) * s
    return w, (dw if k <= 1 else -dw)


@jit
def _taps(gx, gy, h, w, mode, pad, align, idx, wt, dwx, dwy):
    """Fill the taps of the point at grid (gx, gy); return how many (4 linear, 1 nearest, 16 cubic)."""
    x, sx = _unnormalize(np.float64(gx), w, align)    # float64 whatever the tensors' type
    y, sy = _unnormalize(np.float64(gy), h, align)
    if mode == 2:
        fx, fy = math.floor(x), math.floor(y)
        tx, ty = x - fx, y - fy
        for j in range(4):
            cy, dcy = _cubic(ty, j)
            py, _ = _pad(fy - 1.0 + j, h, pad, align)
            row = _index(py, h)
            for i in range(4):
                cx, dcx = _cubic(tx, i)
                px, _ = _pad(fx - 1.0 + i, w, pad, align)
                col = _index(px, w)
                t = 4 * j + i
                idx[t] = row * w + col if row >= 0 and col >= 0 else -1
                wt[t] = cx * cy
                dwx[t] = dcx * cy * sx
                dwy[t] = cx * dcy * sy
        return 16
    x, mx = _pad(x, w, pad, align)
    y, my = _pad(y, h, pad, align)
    if mode == 1:
        row, col = _index(np.rint(y), h), _index(np.rint(x), w)
        idx[0] = row * w + col if row >= 0 and col >= 0 else -1
        wt[0] = 1.0
        dwx[0] = 0.0
        dwy[0] = 0.0
        return 1
    fx, fy = math.floor(x), math.floor(y)
    tx, ty = x - fx, y - fy
    sx *= mx
    sy *= my
    for j in range(2):
        row = _index(fy + j, h)
        wy = ty if j else 1.0 - ty
        for i in range(2):
            col = _index(fx + i, w)
            wx = tx if i else 1.0 - tx
            t = 2 * j + i
            idx[t] = row * w + col if row >= 0 and col >= 0 else -1
            wt[t] = wx * wy
            dwx[t] = (1.0 if i else -1.0) * wy * sx
            dwy[t] = (1.0 if j else -1.0) * wx * sy
    return 4


@jit
def _backward(dy, x, grid, dx, dgrid, mode, pad, align, h, w):
    """dx [N, C, H*W] += weights * dy; dgrid [N, P, 2] = sum over c, taps of dy * d weight * x."""
    n_, c_, _ = x.shape
    idx = np.empty(16, np.int64)
    wt, dwx, dwy = np.empty(16), np.empty(16), np.empty(16)
    dx[:] = 0
    for n in range(n_):
        for p in range(grid.shape[1]):
            k = _taps(grid[n, p, 0], grid[n, p, 1], h, w, mode, pad, align, idx, wt, dwx, dwy)
            gx = 0.0
            gy = 0.0
            for c in range(c_):
                g = dy[n, c, p]
                for t in range(k):
                    if idx[t] >= 0:
                        v = x[n, c, idx[t]]
                        dx[n, c, idx[t]] += wt[t] * g
                        gx += dwx[t] * g * v
                        gy += dwy[t] * g * v
            dgrid[n, p, 0] = gx
            dgrid[n, p, 1] = gy


def grid_sample(ctx):
    (n, c, h, w), (_, ho, wo, _) = geometry(ctx)
    mode, pad, align = codes(ctx)

    def run(x, grid, y):
        _forward(x.reshape(n, c, h * w), grid.reshape(n, ho * wo, 2), y.reshape(n, c, ho * wo), mode, pad, align,
                  h, w)
    return run


@jit
def _forward(x, grid, y, mode, pad, align, h, w):
    """x [N, C, H*W], grid [N, P, 2], y [N, C, P]."""
    n_, c_, _ = x.shape
    idx = np.empty(16, np.int64)
    wt, dwx, dwy = np.empty(16), np.empty(16), np.empty(16)
    for n in range(n_):
        for p in range(grid.shape[1]):
            k = _taps(grid[n, p, 0], grid[n, p, 1], h, w, mode, pad, align, idx, wt, dwx, dwy)
            for c in range(c_):
                acc = 0.0
                for t in range(k):
                    if idx[t] >= 0:
                        acc += wt[t] * x[n, c, idx[t]]
                y[n, c, p] = acc


def grid_sample_grad(ctx):
    (n, c, h, w), (_, ho, wo, _) = geometry(ctx, 1, 2)
    mode, pad, align = codes(ctx)

    def run(dy, x, grid, dx, dgrid):
        _backward(dy.reshape(n, c, ho * wo), x.reshape(n, c, h * w), grid.reshape(n, ho * wo, 2),
                  dx.reshape(n, c, h * w), dgrid.reshape(n, ho * wo, 2), mode, pad, align, h, w)
    return run
