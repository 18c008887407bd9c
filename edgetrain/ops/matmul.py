"""Gemm, MatMul and com.microsoft FusedMatMul. Gemm is lowered to FusedMatMul + an element-wise epilogue."""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from ..ir.dtypes import FLOATS
from .attrs import Flag, Float, Ints
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
    if ctx.attr("transBatchA") or ctx.attr("transBatchB"):
        raise ctx.error("transBatchA/transBatchB are not supported")
    a = _swap_last(ctx.shape(0), ctx.attr("transA"))
    b = _swap_last(ctx.shape(1), ctx.attr("transB"))
    return [TensorType(_same_dtype(ctx, 0, 1), matmul_shape(ctx, a, b))]


def _perm(ctx: NodeContext, name: str, rank: int) -> tuple[int, ...]:
    """Attribute ``name`` as a permutation of ``rank`` axes (empty: the identity)."""
    perm = tuple(ctx.attr(name)) or tuple(range(rank))
    if sorted(perm) != list(range(rank)):
        raise ctx.error(f"{name} {list(perm)} is not a permutation of {rank} axes")
    return perm


def _permuted_matmul(ctx: NodeContext):
    a, b = ctx.shape(0), ctx.shape(1)
    if len(a) < 2 or len(b) < 2:
        raise ctx.error("PermutedMatMul operands must have rank >= 2")
    pa, pb = _perm(ctx, "permA", len(a)), _perm(ctx, "permB", len(b))
    r = matmul_shape(ctx, tuple(a[p] for p in pa), tuple(b[p] for p in pb))
    return [TensorType(_same_dtype(ctx, 0, 1), tuple(r[p] for p in _perm(ctx, "permY", len(r))))]


def _gemm(ctx: NodeContext):
    a, b = ctx.shape(0), ctx.shape(1)
    if len(a) != 2 or len(b) != 2:
        raise ctx.error("Gemm takes 2-D A and B")
    m, k = a[::-1] if ctx.attr("transA") else a
    k2, n = b[::-1] if ctx.attr("transB") else b
    if k != k2:
        raise ctx.error(f"inner dimensions differ: {k} vs {k2}")
    if ctx.has_input(2):
        if broadcast_shapes(ctx, ctx.shape(2), (m, n)) != (m, n):
            raise ctx.error(f"C of shape {ctx.shape(2)} does not broadcast to ({m}, {n})")
    return [TensorType(_same_dtype(ctx, 0, 1), (m, n))]


def _fold_gemm(ctx, a, b, c=None):
    a = a.T if ctx.attr("transA") else a
    b = b.T if ctx.attr("transB") else b
    y = ctx.attr("alpha") * (a @ b)
    return y + ctx.attr("beta") * c if c is not None else y


# --- gradient rules ---------------------------------------------------------------------------------------

def _gemm_vjp(g, dys):
    """Y = alpha op(A) op(B) + beta C, emitted as onnxruntime does: Gemm with beta 0, ReduceSum for C."""
    dy, ta, tb, alpha = dys[0], g.attr("transA"), g.attr("transB"), g.attr("alpha")
    a, b = g.x(0), g.x(1)
    dx = [None, None, None]
    if g.needs[0]:
        dx[0] = (g.emit("Gemm", [dy, b], {"transA": 0, "transB": 1 - tb, "alpha": alpha, "beta": 0.0}) if not ta
                 else g.emit("Gemm", [b, dy], {"transA": tb, "transB": 1, "alpha": alpha, "beta": 0.0}))
    if g.needs[1]:
        dx[1] = (g.emit("Gemm", [a, dy], {"transA": 1 - ta, "transB": 0, "alpha": alpha, "beta": 0.0}) if not tb
                 else g.emit("Gemm", [dy, a], {"transA": 1, "transB": ta, "alpha": alpha, "beta": 0.0}))
    if len(g.node.inputs) > 2 and g.node.inputs[2] and g.needs[2]:
        dc = g.unbroadcast(dy, 2)
        beta = g.attr("beta")
        dx[2] = dc if beta == 1.0 else g.emit("Mul", [dc, g.const(beta, g.in_types[2].dtype, "beta")])
    return dx


def _matmul_vjp(g, dys):
    """dA = dY B^T, dB = A^T dY (batched), each summed over the batch dims its operand was broadcast along."""
    a, b = g.in_types[0].shape, g.in_types[1].shape
    if len(a) < 2 or len(b) < 2:
        raise g.error("MatMul gradients of 1-D operands are not supported")
    dy, out = dys[0], g.out_types[0].shape
    dx = [None, None]
    if g.needs[0]:
        da = g.emit("FusedMatMul", [dy, g.x(1)], {"transB": 1}, "com.microsoft")
        dx[0] = g.unbroadcast(da, 0, out[:-2] + a[-2:])
    if g.needs[1]:
        if len(b) == 2 and len(a) > 2:   # a Linear layer over a batch: fold the batch into the GEMM's K
            a2 = g.emit("Reshape", [g.x(0), g.const([-1, a[-1]], "int64", "shape")])
            dy2 = g.emit("Reshape", [dy, g.const([-1, out[-1]], "int64", "shape")])
            dx[1] = g.emit("FusedMatMul", [a2, dy2], {"transA": 1}, "com.microsoft")
        else:
            db = g.emit("FusedMatMul", [g.x(0), dy], {"transA": 1}, "com.microsoft")
            dx[1] = g.unbroadcast(db, 1, out[:-2] + b[-2:])
    return dx


def det_shape(ctx: NodeContext, i: int = 0) -> tuple[int, ...]:
    """Input ``i``'s [..., M, M], checked square."""
    shape = tuple(ctx.shape(i))
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise ctx.error(f"input must be [..., M, M] (square matrices), got shape {list(shape)}")
    return shape


def _det(ctx: NodeContext):
    return [TensorType(ctx.type(0).dtype, det_shape(ctx)[:-2])]


def _det_vjp(g, dys):
    """d det(X) / dX = adj(X)^T (= det(X) X^-T where X is invertible): ai.edgetrain DetGrad(dY, X, Y)."""
    from .softmax import EDGETRAIN
    return [g.emit("DetGrad", [dys[0], g.x(0), g.y()], domain=EDGETRAIN)]


def _det_grad(ctx: NodeContext):
    shape = det_shape(ctx, 1)
    if tuple(ctx.shape(0)) != shape[:-2] or tuple(ctx.shape(2)) != shape[:-2]:
        raise ctx.error(f"dY and Y must have shape {list(shape[:-2])} (X's without the matrix dims)")
    return [ctx.type(1)]


OPS = (
    OpDef("Det", _det, since=22, kernel="matmul.det", vjp=_det_vjp,
          doc="numpy's LAPACK determinant; gradient ai.edgetrain DetGrad (adjugate, also where X is singular)"),
    OpDef("DetGrad", _det_grad, domain="ai.edgetrain", since=1, kernel="matmul.det_grad",
          doc="inputs dY, X, Y: dX = dY * adj(X)^T (edgetrain's own: onnxruntime has no Det gradient)"),
    OpDef("FusedMatMul", _fused_matmul, domain="com.microsoft", since=1, kernel="matmul.fused_matmul",
          attrs={"alpha": Float(1.0), "transA": Flag(0), "transB": Flag(0), "transBatchA": Flag(0),
                 "transBatchB": Flag(0)},
          doc="alpha * op(A) @ op(B), op = optional transpose of the last two dims"),
    OpDef("Gemm", _gemm, kind="lowered", fold=_fold_gemm, vjp=_gemm_vjp,
          attrs={"alpha": Float(1.0), "beta": Float(1.0), "transA": Flag(0), "transB": Flag(0)},
          doc="lowered to FusedMatMul + Add"),
    OpDef("MatMul", _matmul, kernel="matmul.matmul", dtypes=MATMUL_DTYPES, vjp=_matmul_vjp),
    OpDef("PermutedMatMul", _permuted_matmul, domain="ai.edgetrain", since=1, kernel="matmul.permuted_matmul",
          attrs={"alpha": Float(1.0), "permA": Ints(()), "permB": Ints(()), "permY": Ints(())},
          doc="made by the planner only (plan.lower): Y = Transpose(alpha * Transpose(A, permA) @ "
              "Transpose(B, permB), permY), the transposes as strided views BLAS reads and writes in place"),
)
