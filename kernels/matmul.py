"""GEMM (and Det) through numpy's BLAS/LAPACK with ``out=`` (2.5-9x faster than hand loops, NUMBA_NOTES §4); no Numba here.

An N-D operand times a 2-D one is one GEMM over the flattened leading dims: numpy's matmul would make one BLAS
call per leading index (32 calls of [8, 64] @ [64, 192] for the transformer's input projection, 2-4x slower).
Arena arrays are C-contiguous, so the flattening is a view.
"""
import numpy as np

from . import bindable
from ._gemm_threads import split


def _flattens(ctx, trans_a: int = 0) -> bool:
    a, b = ctx.shape(0), ctx.shape(1)
    return not trans_a and len(a) > 2 and len(b) == 2


def _rows(shape) -> int:
    """Rows of an N-D operand flattened to 2-D (explicit: ``reshape(-1, 0)`` is ambiguous when K = 0)."""
    return int(np.prod(shape[:-1], dtype=np.int64))


def matmul(ctx):
    if _flattens(ctx):
        rows, k, n = _rows(ctx.shape(0)), ctx.shape(0)[-1], ctx.shape(1)[-1]

        @bindable
        def bind_flat(a, b, y):
            return split(np.matmul, a.reshape(rows, k), b, y.reshape(rows, n))     # ufunc: the third is out
        return bind_flat

    @bindable
    def bind(a, b, y):
        return split(np.matmul, a, b, y)
    return bind


def fused_matmul(ctx):
    trans_a, trans_b = ctx.attr("transA"), ctx.attr("transB")
    alpha = ctx.attr("alpha")
    flatten = _flattens(ctx, trans_a)
    rows, k = _rows(ctx.shape(0)), ctx.shape(0)[-1]

    @bindable
    def bind(a, b, y):
        # transA / transB swap the last two dims; a 1-D operand has nothing to swap (as the shape rule says)
        if flatten:
            a, y = a.reshape(rows, k), y.reshape(rows, y.shape[-1])
        args = (a.swapaxes(-1, -2) if trans_a and a.ndim >= 2 else a,
                b.swapaxes(-1, -2) if trans_b and b.ndim >= 2 else b, y)
        if alpha == 1.0:
            return split(np.matmul, *args)                       # ufunc: the third is out
        return split(_scaled_matmul, *args, y.dtype.type(alpha))
    return bind


def permuted_matmul(ctx):
    """The transposes are numpy views: BLAS takes each matrix of a view whose last two dims have a unit
    stride and a row stride of at least a row (plan.lower makes sure of it) as it is, with its leading dim."""
    rank_a, rank_b, rank_y = len(ctx.shape(0)), len(ctx.shape(1)), len(ctx.out(0).shape)
    pa = tuple(ctx.attr("permA")) or tuple(range(rank_a))
    pb = tuple(ctx.attr("permB")) or tuple(range(rank_b))
    py = tuple(int(i) for i in np.argsort(tuple(ctx.attr("permY")) or tuple(range(rank_y))))
    alpha = ctx.attr("alpha")

    @bindable
    def bind(a, b, y):
        args = (a.transpose(pa), b.transpose(pb), y.transpose(py))
        if alpha == 1.0:
            return np.matmul, args
        return _scaled_matmul, args + (y.dtype.type(alpha),)
    return bind


def _scaled_matmul(a, b, y, alpha):
    np.matmul(a, b, out=y)
    np.multiply(y, alpha, out=y)


def det(ctx):
    m = ctx.shape(0)[-1]

    def run(x, y):
        y[...] = np.linalg.det(x.reshape((-1, m, m))).reshape(y.shape)
    return run


def _adjugate_t(a: np.ndarray, d: float) -> np.ndarray:
    """adj(a)^T, the cofactor matrix: det(a) a^-T where a is well conditioned, else cofactors from minors (a
    singular a has an adjugate but no inverse)."""
    m = a.shape[0]
    if m == 1:
        return np.ones_like(a)
    if d != 0 and np.isfinite(d) and np.linalg.cond(a) < 1e8:
        return d * np.linalg.inv(a).T
    cof = np.empty_like(a)
    for i in range(m):
        for j in range(m):
            minor = np.delete(np.delete(a, i, 0), j, 1)
            cof[i, j] = (-1) ** (i + j) * np.linalg.det(minor)
    return cof


def det_grad(ctx):
    m = ctx.shape(1)[-1]

    def run(dy, x, y, dx):
        xs, ds, gs, out = x.reshape(-1, m, m), y.reshape(-1), dy.reshape(-1), dx.reshape(-1, m, m)
        for k in range(xs.shape[0]):
            out[k] = gs[k] * _adjugate_t(xs[k].astype(np.float64), float(ds[k]))
    return run
