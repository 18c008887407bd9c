"""Stage 2: rewrite compound ops into a core op plus element-wise epilogues the fuser can merge.

- ``Gemm(A, B, C)`` -> ``FusedMatMul(A, B)`` then ``Add(acc, beta * C)``
- ``Conv(X, W, B)`` -> ``Conv(X, W)`` then ``Add(acc, B viewed as [M, 1, ...])``, ConvTranspose alike
- ``BatchNormalization`` in inference mode -> its per-channel factor, then ``(X - mean) * a + B`` element-wise,
  fused with what surrounds it (the convolution's bias, the activation)
- ``Dropout`` in inference mode (or with ratio 0) -> a view of its input, with an all-true mask
- ``Transpose`` of the last two dims read only by GEMMs (``MatMul``, ``FusedMatMul``) -> gone, each reader a
  ``FusedMatMul`` with its transA/transB flag flipped: BLAS reads the operand transposed in place instead of
  a copy being made first (attention's ``Q @ K^T`` and its gradients)
- ``Sum``/``Max``/``Min``/``Mean`` of more than ``MAX_FUSED_INPUTS`` inputs -> a chain of bounded pieces, each
  combining the previous piece with the next inputs in order (so the same operations in the same order: the
  same result), then ``Div`` by the count for ``Mean``. One node with 1500 inputs would be one generated
  kernel with 1500 arguments, which Numba compiles for minutes.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..ir import Node, TensorType
from ..ir.dtypes import FLOATS
from ..ops import OP_TABLE, NodeContext
from ..ops.normalization import bn_training_mode
from .fusion import MAX_FUSED_INPUTS
from .specialize import Bound, Specialized, fold


class _Emitter:
    def __init__(self, spec: Specialized):
        self.spec = spec
        self.nodes: list[Bound] = []

    def const(self, name: str, value: np.ndarray) -> str:
        self.spec.consts[name] = value
        self.spec.types[name] = TensorType(value.dtype, value.shape)
        return name

    def emit(self, src: Node, op_type: str, inputs: list[str], outputs: list[str], out_types: list[TensorType],
             attrs=None, domain: str = "", opset: int = 1):
        op = OP_TABLE[(domain, op_type)]
        node = Node(op_type, inputs, outputs, attrs or {}, f"{src.name}/{op_type}", domain)
        node.attrs = op.checked_attrs(node)
        in_types = [self.spec.types[i] if i else None for i in inputs]
        ctx = NodeContext(node, op, opset, in_types, [self.spec.consts.get(i) if i else None for i in inputs],
                          list(out_types))
        if all(c is not None for i, c in enumerate(ctx.consts) if i < len(inputs) and inputs[i]):
            for name, value in zip(outputs, fold(op, ctx)):
                self.const(name, value)
            return
        for name, t in zip(outputs, out_types):
            self.spec.types[name] = t
        self.nodes.append(Bound(op, ctx))


def _gemm(e: _Emitter, b: Bound) -> bool:
    ctx, node = b.ctx, b.node
    y = node.outputs[0]
    acc = y if not ctx.has_input(2) else f"{y}/acc"
    attrs = {"transA": ctx.attr("transA"), "transB": ctx.attr("transB"), "alpha": ctx.attr("alpha")}
    e.emit(node, "FusedMatMul", node.inputs[:2], [acc], [ctx.out(0)], attrs, "com.microsoft")
    if ctx.has_input(2):
        c = node.inputs[2]
        beta = ctx.attr("beta")
        if beta != 1.0:
            beta_name = e.const(f"{y}/beta", np.array(beta, ctx.type(2).dtype))
            e.emit(node, "Mul", [c, beta_name], [f"{y}/beta_c"], [ctx.type(2)])
            c = f"{y}/beta_c"
        e.emit(node, "Add", [acc, c], [y], [ctx.out(0)], opset=14)
    return True


def _conv(e: _Emitter, b: Bound) -> bool:
    ctx, node = b.ctx, b.node
    if not ctx.has_input(2):
        return False
    y = node.outputs[0]
    out = ctx.out(0)
    e.emit(node, node.op_type, node.inputs[:2], [f"{y}/acc"], [out], dict(node.attrs), opset=ctx.opset)
    bias_shape = (out.shape[1],) + (1,) * (len(out.shape) - 2)
    shape = e.const(f"{y}/bias_shape", np.array(bias_shape, np.int64))
    e.emit(node, "Reshape", [node.inputs[2], shape], [f"{y}/bias"], [TensorType(ctx.type(2).dtype, bias_shape)])
    e.emit(node, "Add", [f"{y}/acc", f"{y}/bias"], [y], [out], opset=14)
    return True


def _channel_view(e: _Emitter, b: Bound, name: str, tag: str) -> str:
    """``name`` ([C]) viewed as [C, 1, ...] so it broadcasts over X's [N, C, ...]."""
    rank, c = len(b.ctx.type(0).shape), b.ctx.type(0).shape[1]
    if rank == 2:
        return name
    view = (c,) + (1,) * (rank - 2)
    y = b.node.outputs[0]
    shape = e.const(f"{y}/{tag}_shape", np.array(view, np.int64))
    e.emit(b.node, "Reshape", [name, shape], [f"{y}/{tag}_view"], [TensorType(e.spec.types[name].dtype, view)])
    return f"{y}/{tag}_view"


def _batch_norm_inference(e: _Emitter, b: Bound) -> bool:
    """Inference BatchNormalization -> per-channel ``a = scale / sqrt(var + eps)`` (C elements), then
    ``Y = (X - mean) * a + B`` as element-wise ops, which the fuser merges with the convolution's bias before
    and the activation (Relu, Clip as ReLU6, ...) after: one pass over the activations instead of three."""
    ctx, node = b.ctx, b.node
    dtype = ctx.type(0).dtype
    if (bn_training_mode(ctx) or any(node.outputs[1:]) or dtype not in FLOATS
            or any(ctx.type(i).dtype != dtype for i in range(1, 5))):
        return False
    y = node.outputs[0]
    stat = TensorType(dtype, (ctx.type(0).shape[1],))
    eps = e.const(f"{y}/epsilon", np.array(ctx.attr("epsilon"), dtype))
    e.emit(node, "Add", [node.inputs[4], eps], [f"{y}/var_eps"], [stat], opset=14)
    e.emit(node, "Sqrt", [f"{y}/var_eps"], [f"{y}/std"], [stat], opset=13)
    e.emit(node, "Div", [node.inputs[1], f"{y}/std"], [f"{y}/a"], [stat], opset=14)
    mean, a, bias = (_channel_view(e, b, name, tag) for name, tag in
                     ((node.inputs[3], "mean"), (f"{y}/a", "a"), (node.inputs[2], "B")))
    e.emit(node, "Sub", [node.inputs[0], mean], [f"{y}/centered"], [ctx.out(0)], opset=14)
    e.emit(node, "Mul", [f"{y}/centered", a], [f"{y}/scaled"], [ctx.out(0)], opset=14)
    e.emit(node, "Add", [f"{y}/scaled", bias], [y], [ctx.out(0)], opset=14)
    return True


def _dropout(e: _Emitter, b: Bound) -> bool:
    ctx, node = b.ctx, b.node
    training = bool(ctx.const(2, "training_mode", np.array(False)).reshape(()))
    ratio = float(ctx.const(1, "ratio", np.array(0.5)).reshape(())) if ctx.has_input(1) else 0.5
    if training and ratio != 0.0:
        return False
    e.emit(node, "Identity", [node.inputs[0]], [node.outputs[0]], [ctx.out(0)])
    if len(node.outputs) > 1 and node.outputs[1]:
        # a view of one element: the mask's bytes are counted with the plan's constants, not spent here
        e.const(node.outputs[1], np.broadcast_to(np.ones((), np.bool_), ctx.out(1).shape))
    return True


def _variadic(e: _Emitter, b: Bound) -> bool:
    ctx, node = b.ctx, b.node
    if len(node.inputs) <= MAX_FUSED_INPUTS:
        return False
    y, dtype = node.outputs[0], ctx.out(0).dtype
    op = "Sum" if node.op_type == "Mean" else node.op_type
    take, rest, piece = node.inputs[:MAX_FUSED_INPUTS], node.inputs[MAX_FUSED_INPUTS:], 0
    while True:
        out = y if not rest and node.op_type != "Mean" else f"{y}/piece{piece}"
        shape = np.broadcast_shapes(*(e.spec.types[i].shape for i in take))
        e.emit(node, op, take, [out], [TensorType(dtype, shape)], opset=ctx.opset)
        if not rest:
            break
        take, rest, piece = [out, *rest[:MAX_FUSED_INPUTS - 1]], rest[MAX_FUSED_INPUTS - 1:], piece + 1
    if node.op_type == "Mean":
        count = e.const(f"{y}/count", np.array(len(node.inputs), dtype))
        e.emit(node, "Div", [out, count], [y], [ctx.out(0)], opset=14)
    return True


GEMMS = (("", "MatMul"), ("com.microsoft", "FusedMatMul"))


def _swaps_last_two(b: Bound) -> bool:
    rank = len(b.ctx.type(0).shape)
    perm = b.ctx.attr("perm")
    perm = list(range(rank))[::-1] if perm is None else [int(p) for p in perm]
    return rank >= 2 and perm == list(range(rank - 2)) + [rank - 1, rank - 2]


def _reads_plainly(b: Bound, i: int) -> bool:
    """``b`` reads its input ``i`` as a GEMM operand that a transA/transB flag can transpose."""
    if b.op.key not in GEMMS or i > 1 or len(b.ctx.type(1 - i).shape) < 2:
        return False
    return b.op.key[0] == "" or not (b.ctx.attr("transBatchA") or b.ctx.attr("transBatchB"))


def foldable_transposes(spec: Specialized) -> dict[str, str]:
    """Float transposes of the last two dims whose every reader is a GEMM operand: output -> transposed input."""
    readers = defaultdict(list)
    for b in spec.nodes:
        for i, name in enumerate(b.node.inputs):
            if name:
                readers[name].append((b, i))
    folded = {}
    for b in spec.nodes:
        y = b.node.outputs[0]
        if (b.op.key == ("", "Transpose") and b.ctx.type(0).dtype in FLOATS and y not in spec.output_names
                and readers[y] and _swaps_last_two(b) and all(_reads_plainly(r, i) for r, i in readers[y])):
            folded[y] = b.node.inputs[0]
    return folded


def _gemm_reading(e: _Emitter, b: Bound, folded: dict[str, str]) -> None:
    ctx, node = b.ctx, b.node
    fused = b.op.key == ("com.microsoft", "FusedMatMul")
    attrs = {"transA": ctx.attr("transA"), "transB": ctx.attr("transB"), "alpha": ctx.attr("alpha")} if fused \
        else {"transA": 0, "transB": 0, "alpha": 1.0}
    for i, flag in enumerate(("transA", "transB")):
        if node.inputs[i] in folded:
            attrs[flag] = 1 - attrs[flag]
    inputs = [folded.get(x, x) for x in node.inputs[:2]]
    e.emit(node, "FusedMatMul", inputs, list(node.outputs), [ctx.out(0)], attrs, "com.microsoft")


RULES = {("", "Gemm"): _gemm, ("", "Conv"): _conv, ("", "ConvTranspose"): _conv, ("", "Dropout"): _dropout,
         ("", "BatchNormalization"): _batch_norm_inference,
         ("", "Sum"): _variadic, ("", "Mean"): _variadic, ("", "Max"): _variadic, ("", "Min"): _variadic}


def lower(spec: Specialized) -> Specialized:
    e = _Emitter(spec)
    folded = foldable_transposes(spec)
    for b in spec.nodes:
        if b.op.key == ("", "Transpose") and b.node.outputs[0] in folded:
            continue
        if b.op.key in GEMMS and any(x in folded for x in b.node.inputs[:2]):
            _gemm_reading(e, b, folded)
            continue
        rule = RULES.get(b.op.key)
        if rule is None or not rule(e, b):
            e.nodes.append(b)
    spec.nodes = e.nodes
    return spec
