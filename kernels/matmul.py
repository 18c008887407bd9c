"""GEMM (and Det) through numpy's BLAS/LAPACK with ``out=`` (2.5-9x faster than hand loops, NUMBA_NOTES §4).

An N-D operand times a 2-D one is one GEMM over the flattened leading dims: numpy's matmul would make one BLAS
call per leading index (32 calls of [8, 64] @ [64, 192] for the transformer's input projection, 2-4x slower).
Arena arrays are C-contiguous, so the flattening is a view.

Tiny GEMMs (2-D, alpha 1, not both transposed) run as Numba loops instead: there numpy's fixed cost per call
(ufunc dispatch, BLAS setup: ~1.5-2 us) is most of the time, and a loop over L1-resident operands costs less (the
digits MLP's 32x64 @ 64x32, the mlp's last layer). Each loop walks contiguous rows and reuses every load over a
block of y (a @ b^T: dot products of rows, 2 rows x 4 columns of y at a time, inner dimension k; op(a) @ b: 4 rows
of y each adding 2 rows of b per pass, inner dimension n). Both stop at m*n*k = ``SMALL_GEMM`` / ``SMALL_AXPY``,
where BLAS (~80 GFLOP/s here) plus its fixed cost caught up with the loops (~45) in alternating measurements on
an AMD EPYC (Zen 3, AVX2). Sums run in another order than BLAS's, within the same rounding error.
"""
import numpy as np

from . import bindable, direct
from ._gemm_threads import split
from ._jit import jit

SMALL_GEMM = 5 << 14      # m*n*k at or below which a @ b^T runs as a Numba loop (the mlp's 64x128 @ 128x10)
SMALL_AXPY = 5 << 14      # ... and op(a) @ b


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
        small = _small_gemm(a, b, y, trans_a, trans_b) if alpha == 1.0 else None
        if small is not None:
            return small
        args = (a.swapaxes(-1, -2) if trans_a and a.ndim >= 2 else a,
                b.swapaxes(-1, -2) if trans_b and b.ndim >= 2 else b, y)
        if alpha == 1.0:
            return split(np.matmul, *args)                       # ufunc: the third is out
        return split(_scaled_matmul, *args, y.dtype.type(alpha))
    return bind


def gemm_bias(ctx):
    """FusedMatMul then ``+ bias`` (a row of y's column count), one call (plan.fusion's EPILOGUES)."""
    return _with_epilogue(ctx, False)


def gemm_bias_relu(ctx):
    """... then ReLU as the generated loops clamp (NaN stays NaN)."""
    return _with_epilogue(ctx, True)


def _with_epilogue(ctx, relu: bool):
    core = fused_matmul(ctx).bind

    @bindable
    def bind(a, b, bias, y):
        bias = bias.reshape(-1)
        fn, args = core(a, b, y)
        zero = y.dtype.type(0)
        if fn is _gemm_nt:
            return _gemm_nt_bias, args[:3] + (bias, relu, zero, False)
        rows = y.reshape(-1, bias.shape[0])     # keep (K = 0): the loop only adds the bias to what y holds
        return _then(fn, args, _gemm_nt_bias, (np.empty((rows.shape[0], 0), y.dtype),
                                               np.empty((bias.shape[0], 0), y.dtype), rows, bias, relu, zero, True))
    return bind


def gemm_column_sums(ctx):
    """FusedMatMul (transA) and the column sums of its first operand as stored (the ReduceSum over axis 0 that
    is a Gemm's bias gradient), one call (plan.fusion's SIBLINGS): the small op(a)^T @ b loop sums a's rows
    first (the ReduceSum kernel's order, rows in turn), which leaves a in L1 for the GEMM."""
    core = fused_matmul(ctx).bind

    @bindable
    def bind(a, b, y, sums):
        sums = sums.reshape(-1)
        fn, args = core(a, b, y)
        if fn is _gemm_tn:
            return _gemm_tn_sums, args + (sums,)
        return _then(fn, args, _gemm_tn_sums, (a, np.empty((a.shape[0], 0), a.dtype),     # N = 0: only the sums
                                               np.empty((sums.shape[0], 0), a.dtype), sums))
    return bind


def _then(fn, args, after, after_args):
    """``(run, ())``: ``fn(*args)``, then ``after(*after_args)``, called direct from its second run. ``after`` is
    the small loop with an empty operand, so the same kernel signature on either path: a trimmed build that
    recorded one batch size runs the others."""
    chosen = [after]

    def run():
        fn(*args)
        chosen[0](*after_args)
        if chosen[0] is after:
            chosen[0] = direct(after, after_args)
    run.kernel_calls = ((fn, args), (after, after_args))
    return run, ()


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
            return split(np.matmul, *args)
        return split(_scaled_matmul, *args, y.dtype.type(alpha))
    return bind


def _small_gemm(a, b, y, trans_a: int, trans_b: int):
    """``(loop, args)`` for y = op(a) @ op(b) as a Numba loop when it is tiny (a, b as stored, C-contiguous,
    2-D, one float type, y apart from both), else None: BLAS."""
    if not (a.ndim == b.ndim == y.ndim == 2) or (trans_a and trans_b):
        return None
    m, n = y.shape
    limit = SMALL_GEMM if trans_b else SMALL_AXPY
    if m * n * a.shape[1 - trans_a] > limit or not a.dtype == b.dtype == y.dtype:
        return None
    if a.dtype not in (np.float32, np.float64) or not (a.flags.c_contiguous and b.flags.c_contiguous
                                                        and y.flags.c_contiguous and y.flags.writeable):
        return None
    if np.may_share_memory(y, a) or np.may_share_memory(y, b):
        return None
    if trans_b:
        return _gemm_nt, (a, b, y, y.dtype.type(0))
    return (_gemm_tn if trans_a else _gemm_nn), (a, b, y)


@jit(fastmath=True, inline="always")
def _add_rows(a, b, y):
    """y = a @ b; a [m, k] (any layout: _gemm_tn passes a transposed view), b [k, n]: rows of y four at a time,
    each pass over a row adding two rows of b (y[i] += a[i, p] b[p] + a[i, p + 1] b[p + 1]), so each row of b
    is loaded once per four rows of y and each row of y once per two of b (the loops are load/store bound)."""
    m, n = y.shape
    k = b.shape[0]
    i = 0
    while i < m:
        rows = 4 if i + 4 <= m else 1
        for r in range(i, i + rows):
            for j in range(n):
                y[r, j] = 0.0
        p = 0
        while p + 2 <= k:
            if rows == 4:
                c00, c01 = a[i, p], a[i, p + 1]
                c10, c11 = a[i + 1, p], a[i + 1, p + 1]
                c20, c21 = a[i + 2, p], a[i + 2, p + 1]
                c30, c31 = a[i + 3, p], a[i + 3, p + 1]
                for j in range(n):
                    b0, b1 = b[p, j], b[p + 1, j]
                    y[i, j] += c00 * b0 + c01 * b1
                    y[i + 1, j] += c10 * b0 + c11 * b1
                    y[i + 2, j] += c20 * b0 + c21 * b1
                    y[i + 3, j] += c30 * b0 + c31 * b1
            else:
                c00, c01 = a[i, p], a[i, p + 1]
                for j in range(n):
                    y[i, j] += c00 * b[p, j] + c01 * b[p + 1, j]
            p += 2
        if p < k:
            for r in range(i, i + rows):
                c = a[r, p]
                for j in range(n):
                    y[r, j] += c * b[p, j]
        i += rows


@jit(fastmath=True)
def _gemm_nn(a, b, y):
    """y = a @ b; a [m, k], b [k, n]."""
    _add_rows(a, b, y)


@jit(fastmath=True)
def _gemm_tn(a, b, y):
    """y = a^T @ b; a [k, m], b [k, n]."""
    _add_rows(a.T, b, y)


@jit(fastmath=True)
def _gemm_tn_sums(a, b, y, sums):
    """_gemm_tn, and sums[i] = a[0, i] + a[1, i] + ... (rows in turn, the ReduceSum kernel's order; a is in L1
    for the GEMM after this pass)."""
    m = y.shape[0]
    for i in range(m):
        sums[i] = 0.0
    for p in range(a.shape[0]):
        for i in range(m):
            sums[i] += a[p, i]
    _add_rows(a.T, b, y)


@jit(fastmath=True, inline="always")
def _dot_rows(a, b, y, i, rows, zero):
    """Rows i to i + rows (1 or 2) of y = a @ b^T; a [m, k], b [n, k]: dot products of rows, four columns of y
    at a time (each row of b read once per two rows of y, each row of a once per four columns); sums in a's type,
    from ``zero`` of it."""
    n = y.shape[1]
    k = a.shape[1]
    j = 0
    while j + 4 <= n:
        s0 = s1 = s2 = s3 = zero
        if rows == 2:
            t0 = t1 = t2 = t3 = zero
            for p in range(k):
                ap, aq = a[i, p], a[i + 1, p]
                b0, b1, b2, b3 = b[j, p], b[j + 1, p], b[j + 2, p], b[j + 3, p]
                s0 += ap * b0
                s1 += ap * b1
                s2 += ap * b2
                s3 += ap * b3
                t0 += aq * b0
                t1 += aq * b1
                t2 += aq * b2
                t3 += aq * b3
            y[i + 1, j] = t0
            y[i + 1, j + 1] = t1
            y[i + 1, j + 2] = t2
            y[i + 1, j + 3] = t3
        else:
            for p in range(k):
                ap = a[i, p]
                s0 += ap * b[j, p]
                s1 += ap * b[j + 1, p]
                s2 += ap * b[j + 2, p]
                s3 += ap * b[j + 3, p]
        y[i, j] = s0
        y[i, j + 1] = s1
        y[i, j + 2] = s2
        y[i, j + 3] = s3
        j += 4
    for jj in range(j, n):
        for r in range(i, i + rows):
            s = zero
            for p in range(k):
                s += a[r, p] * b[jj, p]
            y[r, jj] = s


@jit(fastmath=True)
def _gemm_nt(a, b, y, zero):
    """y = a @ b^T; a [m, k], b [n, k] (_dot_rows, two rows at a time)."""
    m = y.shape[0]
    i = 0
    while i < m:
        rows = 2 if i + 2 <= m else 1
        _dot_rows(a, b, y, i, rows, zero)
        i += rows


@jit(fastmath=True)
def _gemm_nt_bias(a, b, y, bias, relu, zero, keep):
    """_gemm_nt storing ``sum + bias[j]`` (then ReLU'd with ``relu``, as the generated Relu: NaN stays NaN); each
    sum in y's type first, as the GEMM's own store rounds it, so the bits are the unfolded steps'. ``keep``: y
    holds the sums already (a GEMM computed elsewhere; a and b are empty) and only gets the bias."""
    m, n = y.shape
    i = 0
    while i < m:
        rows = 2 if i + 2 <= m else 1
        if not keep:
            _dot_rows(a, b, y, i, rows, zero)
        for r in range(i, i + rows):      # the rows just stored, still in L1
            for j in range(n):
                v = y[r, j] + bias[j]
                y[r, j] = (zero if v < 0 else v) if relu else v
        i += rows


def _scaled_matmul(a, b, y, alpha):
    np.matmul(a, b, out=y)
    np.multiply(y, alpha, out=y)


_scaled_matmul.alpha_argument = True       # _gemm_threads may run it as one sgemm with this alpha


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
