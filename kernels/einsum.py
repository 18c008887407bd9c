"""Einsum: two operands as one batched np.matmul (BLAS) between permuted copies in the planned workspace; one
operand as numpy's einsum. No Numba: the work is the GEMM."""
import numpy as np

from edgetrain.ops.einsum import einsum_spec, product


def einsum(ctx):
    spec = einsum_spec(ctx)
    if len(spec.operands) == 1:
        equation = spec.equation

        def run_one(a, y):
            np.einsum(equation, a, out=y)
        return run_one

    p = product(ctx, spec)
    identity = [perm == tuple(range(len(perm))) for perm in (p.perm_a, p.perm_b, p.perm_out)]
    a_shape, b_shape = ctx.shape(0), ctx.shape(1)
    nb = len(p.batch)

    def size(letters):
        return int(np.prod([spec.sizes[c] for c in letters], dtype=np.int64))

    # [batch..., rows, cols] with each operand's own batch sizes (1 where it broadcasts)
    a3 = tuple(a_shape[k] for k in p.perm_a[:nb]) + (size(p.left), size(p.contract))
    b3 = tuple(b_shape[k] for k in p.perm_b[:nb]) + (size(p.contract), size(p.right))
    prod3 = spec.shape(p.batch) + (size(p.left), size(p.right))
    prod_full = spec.shape(p.batch + p.left + p.right)

    def run(a, b, y, *ws):
        k = 0
        if not identity[0]:
            np.copyto(ws[k], a.transpose(p.perm_a))
            a, k = ws[k], k + 1
        if not identity[1]:
            np.copyto(ws[k], b.transpose(p.perm_b))
            b, k = ws[k], k + 1
        target = y if identity[2] else ws[k]
        np.matmul(a.reshape(a3), b.reshape(b3), out=target.reshape(prod3))
        if not identity[2]:
            np.copyto(y, target.reshape(prod_full).transpose(p.perm_out))
    return run
