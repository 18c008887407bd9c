"""Reductions. When the reduced axes form one block (ignoring dims of size 1), X is viewed as
``[outer, red, inner]`` and a fused kernel reduces it in memory order (2-3x faster than numpy's reduce with
``out=``); other axis sets go through numpy ufuncs with ``out=`` into the keepdims view of the output.

Sums accumulate in the output's element type, in vector lanes (float32 rows) or along ``red`` (inner > 1).
Max/min propagate NaN, as numpy does; over no elements they give -inf/+inf (or the integer type's limits).
"""
from __future__ import annotations

import numpy as np

from edgetrain.ops.base import axis_view
from edgetrain.ops.reduce import (
    arg_axis,
    block_view,
    cumprod_grad_axis,
    cumsum_axis,
    reduce_axes,
    reduced_shape,
    topk_geometry,
)

from . import bindable
from ._jit import jit

SUM, MAX, MIN, PROD = 0, 1, 2, 3


def reduce_sum(ctx):
    return _launcher(ctx, SUM)


def reduce_mean(ctx):
    """Sum, then divide by the number of reduced elements."""
    return _launcher(ctx, SUM, mean=True)


def reduce_max(ctx):
    return _launcher(ctx, MAX)


def reduce_min(ctx):
    return _launcher(ctx, MIN)


def reduce_prod(ctx):
    return _launcher(ctx, PROD)


def _identity_element(op: int, dtype: np.dtype):
    if op == SUM:
        return dtype.type(0)
    if op == PROD:
        return dtype.type(1)
    low = op == MAX
    if dtype.kind == "b":       # max of booleans is any (starts False), min is all (starts True)
        return dtype.type(not low)
    if dtype.kind == "f":
        return dtype.type(-np.inf if low else np.inf)
    info = np.iinfo(dtype)
    return dtype.type(info.min if low else info.max)


_UFUNCS = {SUM: np.add, MAX: np.maximum, MIN: np.minimum, PROD: np.multiply}


def _launcher(ctx, op: int, mean: bool = False):
    axes = reduce_axes(ctx)
    n_in = len(ctx.node.inputs)
    if axes is None:
        def run_copy(*args):
            np.copyto(args[n_in], args[0])
        return run_copy
    t = ctx.type(0)
    init = _identity_element(op, t.dtype)
    count = int(np.prod([t.shape[a] for a in axes], dtype=np.int64))
    if mean and count == 0:
        def run_empty_mean(*args):
            args[n_in].fill(np.nan)
        return run_empty_mean
    scale = t.dtype.type(count if mean else 1)
    view = block_view(t.shape, axes)
    if view is not None:
        outer, red, inner = view

        @bindable
        def bind(*args):
            return _reduce_block, (args[0].reshape(outer, red, inner), args[n_in].reshape(outer, inner), op, init,
                                   mean, scale)
        return bind

    keep_shape = reduced_shape(ctx, keepdims=True)
    ufunc = _UFUNCS[op]

    def run_numpy(*args):
        y = args[n_in].reshape(keep_shape)
        ufunc.reduce(args[0], axis=axes, out=y, keepdims=True, initial=init)
        if mean:
            np.divide(y, scale, out=y)
    return run_numpy


@jit(fastmath=True)
def _reduce_block(x, y, op, init, mean, count):
    """y[o, i] = op over r of x[o, r, i] (op: 0 sum, 1 max, 2 min, 3 product), divided by ``count`` if
    ``mean``."""
    outer, red, inner = x.shape
    if inner == 1:
        for o in range(outer):
            a = init
            if op == 0:
                for r in range(red):
                    a += x[o, r, 0]
            elif op == 3:
                for r in range(red):
                    a *= x[o, r, 0]
            elif op == 1:
                for r in range(red):
                    v = x[o, r, 0]
                    a = v if (v > a or v != v) else a
            else:
                for r in range(red):
                    v = x[o, r, 0]
                    a = v if (v < a or v != v) else a
            y[o, 0] = a / count if mean else a
        return
    for o in range(outer):
        for i in range(inner):
            y[o, i] = init
        for r in range(red):
            if op == 0:
                for i in range(inner):
                    y[o, i] += x[o, r, i]
            elif op == 3:
                for i in range(inner):
                    y[o, i] *= x[o, r, i]
            elif op == 1:
                for i in range(inner):
                    v = x[o, r, i]
                    y[o, i] = v if (v > y[o, i] or v != v) else y[o, i]
            else:
                for i in range(inner):
                    v = x[o, r, i]
                    y[o, i] = v if (v < y[o, i] or v != v) else y[o, i]
        if mean:
            for i in range(inner):
                y[o, i] /= count


def reduce_l1(ctx):
    return _transformed_launcher(ctx, ABS)


def reduce_l2(ctx):
    return _transformed_launcher(ctx, SQUARE, root=True)


def reduce_sum_square(ctx):
    return _transformed_launcher(ctx, SQUARE)


def reduce_log_sum_exp(ctx):
    return _transformed_launcher(ctx, LOG_SUM_EXP)


ABS, SQUARE, LOG_SUM_EXP = 0, 1, 2


def _transformed_launcher(ctx, op: int, root: bool = False):
    """Sums of |x| or x^2 (square-rooted for L2), or log(sum(exp(x))) (stable: around the max), over the axes:
    a Numba loop over the [outer, red, inner] view when the axes form one block, else numpy through the
    planned workspace (``ops.reduce.transformed_workspace``) holding the transformed input."""
    axes = reduce_axes(ctx)
    n_in = len(ctx.node.inputs)
    t = ctx.type(0)
    if axes is None:                       # noop_with_empty_axes: the input, unchanged, as the spec says
        def run_copy(*args):
            np.copyto(args[n_in], args[0])
        return run_copy
    view = block_view(t.shape, axes)
    if view is not None:
        outer, red, inner = view

        def run(*args):
            _reduce_transformed(args[0].reshape(outer, red, inner), args[n_in].reshape(outer, inner), op, root)
        return run
    keep_shape = reduced_shape(ctx, keepdims=True)

    def run_numpy(*args):
        x, y, scratch = args[0], args[n_in].reshape(keep_shape), args[n_in + 1]
        if op == LOG_SUM_EXP:               # around the max (held in the second workspace), as the loop does
            big = args[n_in + 2].reshape(keep_shape)
            np.maximum.reduce(x, axis=axes, out=big, keepdims=True, initial=-np.inf)
            np.subtract(x, big, out=scratch)
            np.exp(scratch, out=scratch)
            np.add.reduce(scratch, axis=axes, out=y, keepdims=True)
            np.log(y, out=y)
            np.add(y, big, out=y)
            return
        (np.abs if op == ABS else np.square)(x, out=scratch)
        np.add.reduce(scratch, axis=axes, out=y, keepdims=True)
        if root:
            np.sqrt(y, out=y)
    return run_numpy


@jit(fastmath=True)
def _reduce_transformed(x, y, op, root):
    """y[o, i] = sum over r of |x| (op 0) or x^2 (op 1; sqrt'ed when ``root``), or log sum exp (op 2)."""
    outer, red, inner = x.shape
    for o in range(outer):
        for i in range(inner):
            if op == 2:
                m = -np.inf
                for r in range(red):
                    v = x[o, r, i]
                    m = v if (v > m or v != v) else m
                s = 0.0
                if m == m and m != -np.inf and m != np.inf:
                    for r in range(red):
                        s += np.exp(x[o, r, i] - m)
                    y[o, i] = m + np.log(s)
                else:                      # NaN, or every term -inf (log 0) or one +inf: the max says it
                    y[o, i] = m
            else:
                s = 0.0
                for r in range(red):
                    v = x[o, r, i]
                    s += abs(v) if op == 0 else v * v
                y[o, i] = np.sqrt(s) if root else s


def reduce_all_l2(ctx):
    n_in = len(ctx.node.inputs)

    def run(*args):
        total = 0.0
        for x in args[:n_in]:
            if x is not None:
                total += _sum_of_squares(x.reshape(-1))
        args[n_in][...] = np.sqrt(total)
    return run


@jit(fastmath=True)
def _sum_of_squares(x):
    s = 0.0
    for v in x:
        s += np.float64(v) * v
    return s


def _scan_launcher(kernel):
    """CumSum / CumProd: the kernel over the (outer, axis, inner) view of x and y."""
    def launcher(ctx):
        outer, n, inner = axis_view(ctx, cumsum_axis(ctx))
        exclusive, reverse = bool(ctx.attr("exclusive")), bool(ctx.attr("reverse"))

        def run(x, _axis, y):
            kernel(x.reshape(outer, n, inner), y.reshape(outer, n, inner), exclusive, reverse)
        return run
    return launcher


@jit
def _cumsum(x, y, exclusive, reverse):
    """y[o, k, i] = sum of x[o, :k(+1), i] (``reverse``: of x[o, k(+1):, i]); ``exclusive`` leaves x[o, k, i] out."""
    outer, n, inner = x.shape
    for o in range(outer):
        for i in range(inner):
            acc = x.dtype.type(0) if n == 0 else x[o, 0, i] - x[o, 0, i]
            for r in range(n):
                k = n - 1 - r if reverse else r
                if exclusive:
                    y[o, k, i] = acc
                    acc += x[o, k, i]
                else:
                    acc += x[o, k, i]
                    y[o, k, i] = acc


@jit
def _cumprod(x, y, exclusive, reverse):
    """y[o, k, i] = product of x[o, :k(+1), i] (``reverse``: of x[o, k(+1):, i]); ``exclusive`` leaves x[o, k, i]
    out."""
    outer, n, inner = x.shape
    for o in range(outer):
        for i in range(inner):
            acc = x.dtype.type(1)
            for r in range(n):
                k = n - 1 - r if reverse else r
                if exclusive:
                    y[o, k, i] = acc
                    acc *= x[o, k, i]
                else:
                    acc *= x[o, k, i]
                    y[o, k, i] = acc


cumsum = _scan_launcher(_cumsum)
cumprod = _scan_launcher(_cumprod)


def cumprod_grad(ctx):
    axis = cumprod_grad_axis(ctx)
    shape = ctx.shape(1)
    outer, n, inner = (int(np.prod(shape[:axis], dtype=np.int64)), int(shape[axis]),
                       int(np.prod(shape[axis + 1:], dtype=np.int64)))
    exclusive, reverse = bool(ctx.attr("exclusive")), bool(ctx.attr("reverse"))

    def run(dy, x, _axis, dx):
        view = (outer, n, inner)
        _cumprod_grad(dy.reshape(view), x.reshape(view), dx.reshape(view), exclusive, reverse)
    return run


@jit
def _cumprod_grad(dy, x, dx, exclusive, reverse):
    """Along the scan order k = 0..n-1: dx_k = P_k * S_k with P_k the product of the x before k and S_k the sum
    over the outputs j holding x_k of dy_j * (product of x strictly after k up to j); S_k = dy_k + x_(k+1) S_(k+1)
    (inclusive) or dy_(k+1) + x_(k+1) S_(k+1) (exclusive), from the end back."""
    outer, n, inner = x.shape
    for o in range(outer):
        for i in range(inner):
            s = dy.dtype.type(0)
            for r in range(n):        # backward over the scan order: dx holds S_k for now
                k = r if reverse else n - 1 - r
                nxt = k - 1 if reverse else k + 1
                if exclusive:
                    s = dy[o, nxt, i] + x[o, nxt, i] * s if r > 0 else dy.dtype.type(0)
                else:
                    s = dy[o, k, i] + (x[o, nxt, i] * s if r > 0 else dy.dtype.type(0))
                dx[o, k, i] = s
            p = dy.dtype.type(1)
            for r in range(n):        # forward: times the exclusive prefix product
                k = n - 1 - r if reverse else r
                dx[o, k, i] *= p
                p *= x[o, k, i]


def arg_max(ctx):
    return _arg_launcher(ctx, True)


def arg_min(ctx):
    return _arg_launcher(ctx, False)


def _arg_launcher(ctx, largest: bool):
    outer, n, inner = axis_view(ctx, arg_axis(ctx))
    last = bool(ctx.attr("select_last_index"))

    def run(x, y):
        _arg_extreme(x.reshape(outer, n, inner), y.reshape(outer, inner), largest, last)
    return run


@jit
def _arg_extreme(x, y, largest, last):
    """y[o, i] = the index along n of the largest (smallest) x[o, :, i]: the first one, or the last one on ties
    (``last``); a NaN wins (the first NaN), as numpy's argmax/argmin."""
    outer, n, inner = x.shape
    for o in range(outer):
        for i in range(inner):
            best, v = 0, x[o, 0, i]
            if v == v:
                for r in range(1, n):
                    c = x[o, r, i]
                    if c != c:
                        best = r
                        break
                    if (c > v if largest else c < v) or (last and c == v):
                        best, v = r, c
            y[o, i] = best


def topk(ctx):
    """The k largest (smallest) along the axis, sorted, ties by lower index: an insertion into the k output
    slots per column, O(n k) without allocating."""
    axis, k = topk_geometry(ctx)
    outer, n, inner = axis_view(ctx, axis)
    largest = bool(ctx.attr("largest"))

    def run(x, _k, values, indices):
        _topk(x.reshape(outer, n, inner), values.reshape(outer, k, inner), indices.reshape(outer, k, inner), largest)
    return run


@jit
def _topk(x, values, indices, largest):
    outer, n, inner = x.shape
    k = values.shape[1]
    for o in range(outer):
        for i in range(inner):
            count = 0
            for r in range(n):
                v = x[o, r, i]
                # v goes before slot p when strictly better; NaN counts as the largest value, as numpy sorts it
                p = count
                while p > 0:
                    w = values[o, p - 1, i]
                    if largest:
                        better = (v != v and w == w) or v > w
                    else:
                        better = (w != w and v == v) or v < w
                    if not better:
                        break
                    p -= 1
                if p >= k:
                    continue
                last = min(count, k - 1)
                for q in range(last, p, -1):
                    values[o, q, i] = values[o, q - 1, i]
                    indices[o, q, i] = indices[o, q - 1, i]
                values[o, p, i] = v
                indices[o, p, i] = r
                if count < k:
                    count += 1
