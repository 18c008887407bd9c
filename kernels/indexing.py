"""GatherND, GatherNDGrad and ScatterND: a jitted pass turns the index tuples into checked slice offsets (in
the planned workspace); the slices then move by np.take(out=) or a jitted accumulate."""
from __future__ import annotations

import numpy as np

from edgetrain.ops.indexing import REDUCTIONS, gather_nd_grad_shape, nd_geometry

from ._jit import jit


@jit
def _accumulate(src, rows, dst, code):
    """dst[rows[t]] op= src[t] (code: 1 add, 2 mul, 3 max, 4 min)."""
    n, width = src.shape
    for t in range(n):
        row = dst[rows[t]]
        s = src[t]
        for i in range(width):
            if code == 1:
                row[i] += s[i]
            elif code == 2:
                row[i] *= s[i]
            elif code == 3:
                row[i] = max(row[i], s[i])
            else:
                row[i] = min(row[i], s[i])


def _rows(ctx, data, batch_dims=0):
    g = nd_geometry(ctx, data, 1, batch_dims)
    dims = np.array(g.dims, np.int64)
    k = len(g.dims)
    allowed = f"an index within data's dims {list(g.dims)} (negative ones count back)"

    def rows(idx, out):
        if out.shape[0] != g.batch * g.tuples:
            raise AssertionError("offsets workspace does not match the geometry")
        bad = _offsets_per_batch(idx.reshape(g.batch * g.tuples, k), dims, g.cells, g.tuples, out)
        if bad >= 0:
            raise ctx.bad_value(1, idx, bad, allowed)
        return out
    return g, rows


@jit
def _offsets_per_batch(idx, dims, cells, per_batch, out):
    """out[t] = the row of data's [batch * cells, slice] view that index tuple t (of batch entry
    t // per_batch) addresses; returns the flat position in idx of the first index out of range, or -1."""
    n, k = idx.shape
    for t in range(n):
        cell = 0
        for j in range(k):
            v = idx[t, j]
            if v < 0:
                v += dims[j]
            if v < 0 or v >= dims[j]:
                return t * k + j
            cell = cell * dims[j] + v
        out[t] = (t // per_batch) * cells + cell
    return -1


def gather_nd(ctx):
    data = ctx.shape(0)
    g, rows = _rows(ctx, data, ctx.attr("batch_dims"))
    table = (g.batch * g.cells, g.slice)

    def run(x, idx, y, offsets):
        np.take(x.reshape(table), rows(idx, offsets), axis=0, out=y.reshape(-1, g.slice))
    return run


def gather_nd_grad(ctx):
    shape = gather_nd_grad_shape(ctx)
    g, rows = _rows(ctx, shape, ctx.attr("batch_dims"))
    table = (g.batch * g.cells, g.slice)

    def run(_shape, idx, dy, dx, offsets):
        dx.fill(0)
        _accumulate(dy.reshape(-1, g.slice), rows(idx, offsets), dx.reshape(table), 1)
    return run


def scatter_nd(ctx):
    data = ctx.shape(0)
    g, rows = _rows(ctx, data)
    table = (g.cells, g.slice)
    code = REDUCTIONS.index(ctx.attr("reduction"))

    def run(x, idx, updates, y, offsets):
        np.copyto(y, x)
        r = rows(idx, offsets)
        if code == 0:
            y.reshape(table)[r] = updates.reshape(-1, g.slice)
        else:
            _accumulate(updates.reshape(-1, g.slice), r, y.reshape(table), code)
    return run
