"""Gemm, MatMul and com.microsoft FusedMatMul. Gemm is lowered to FusedMatMul + an element-wise epilogue."""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from ..ir.dtypes import FLOATS
from .base import NodeContext, OpDef, broadcast_shapes

MATMUL_DTYPES = FLOATS + (np.dtype(np.int32), np.dtype(np.int64))


def matmul_shape(ctx: NodeContext, a: tuple, b: tuple) -> tuple:
    """numpy.matmul's shape rule (1-D operands promoted and the added dim dropped)."""
    if not a or not b:
        raise ctx.error("MatMul operands must have rank >= 1")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ctx.error(f"inner dimensions differ: {a2[-1]} vs {b2[-2]}")
    batch = broadcast_shapes(ctx, a2[:-2], b2[:-2])
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _same_dtype(ctx: NodeContext, *idx):
    dtypes = {ctx.type(i).dtype for i in idx}
    if len(dtypes) > 1:
        raise ctx.error("inputs must share one element type")
    return dtypes.pop()


def _matmul(ctx: NodeContext):
    return [TensorType(_same_dtype(ctx, 0, 1), matmul_shape(ctx, ctx.shape(0), ctx.shape(1)))]


def _swap_last(shape: tuple, flag) -> tuple:
    return shape[:-2] + (shape[-1], shape[-2]) if flag and len(shape) >= 2 else shape


def _fused_matmul(ctx: NodeContext):
    if ctx.attr("transBatchA", 0) or ctx.attr("transBatchB", 0):
        raise ctx.error("transBatchA/transBatchB are not supported")
    a = _swap_last(ctx.shape(0), ctx.attr("transA", 0))
    b = _swap_last(ctx.shape(1), ctx.attr("transB", 0))
    return [TensorType(_same_dtype(ctx, 0, 1), matmul_shape(ctx, a, b))]


def _gemm(ctx: NodeContext):
    a, b = ctx.shape(0), ctx.shape(1)
    if len(a) != 2 or len(b) != 2:
        raise ctx.error("Gemm takes 2-D A and B")
    m, k = a[::-1] if ctx.attr("transA", 0) else a
    k2, n = b[::-1] if ctx.attr("transB", 0) else b
    if k != k2:
        raise ctx.error(f"inner dimensions differ: {k} vs {k2}")
    if ctx.has_input(2):
        if broadcast_shapes(ctx, ctx.shape(2), (m, n)) != (m, n):
            raise ctx.error(f"C of shape {ctx.shape(2)} does not broadcast to ({m}, {n})")
    return [TensorType(_same_dtype(ctx, 0, 1), (m, n))]


def _fold_gemm(ctx, a, b, c=None):
    a = a.T if ctx.attr("transA", 0) else a
    b = b.T if ctx.attr("transB", 0) else b
    y = ctx.attr("alpha", 1.0) * (a @ b)
    return y + ctx.attr("beta", 1.0) * c if c is not None else y


OPS = (
    OpDef("FusedMatMul", _fused_matmul, domain="com.microsoft", since=1, kernel="matmul.fused_matmul",
          doc="alpha * op(A) @ op(B), op = optional transpose of the last two dims"),
    OpDef("Gemm", _gemm, kind="lowered", fold=_fold_gemm, doc="lowered to FusedMatMul + Add"),
    OpDef("MatMul", _matmul, kernel="matmul.matmul", dtypes=MATMUL_DTYPES),
)
