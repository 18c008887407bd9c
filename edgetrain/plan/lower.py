"""Stage 2: rewrite compound ops into a core op plus element-wise epilogues the fuser can merge.

- ``Gemm(A, B, C)`` -> ``FusedMatMul(A, B)`` then ``Add(acc, beta * C)``
- ``Conv(X, W, B)`` -> ``Conv(X, W)`` then ``Add(acc, B viewed as [M, 1, ...])``, ConvTranspose alike
- ``BatchNormalization`` in inference mode -> its per-channel factor, then ``(X - mean) * a + B`` element-wise,
  fused with what surrounds it (the convolution's bias, the activation)
- ``MaxPool`` of int8/uint8 -> Cast to float32, MaxPool, Cast back (exact: the kernels pool floats)
- ``Pow`` of floats by a constant exponent 2 or 1 -> ``Mul(X, X)`` or a view of X: the same numbers without a
  libm ``pow`` per element, which does not vectorize (the MSE loss squares, its gradient is ``2 * Pow(d, 1)``)
- ``Dropout`` in inference mode (or with ratio 0) -> a view of its input, with an all-true mask
- ``Transpose`` of the last two dims read only by GEMMs (``MatMul``, ``FusedMatMul``) -> gone, each reader a
  ``FusedMatMul`` with its transA/transB flag flipped: BLAS reads the operand transposed in place instead of
  a copy being made first (attention's ``Q @ K^T`` and its gradients)
- ``Transpose`` of the last two dims of a GEMM result read by nothing else -> gone, the GEMM writing it with
  its operands swapped, ``(op(A) op(B))^T = op(B)^T op(A)^T`` (the weight gradients of torch's ``Linear``)
- other ``Transpose``s read only by GEMMs, or of a GEMM result read by nothing else, that keep the data's last
  dim among the last two (attention's heads split and merged) -> gone, the GEMM an ai.edgetrain
  ``PermutedMatMul`` reading and writing them as strided views
- ``Sum``/``Max``/``Min``/``Mean`` of more than ``MAX_FUSED_INPUTS`` inputs -> a chain of bounded pieces, each
  combining the previous piece with the next inputs in order (so the same operations in the same order: the
  same result), then ``Div`` by the count for ``Mean``. One node with 1500 inputs would be one generated
  kernel with 1500 arguments, which Numba compiles for minutes.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..ir import Node, TensorType
from ..ir.dtypes import FLOATS, to_onnx
from ..ops import OP_TABLE, NodeContext
from ..ops.conv import CONV_ATTRS
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


def _cast_like(e: _Emitter, b: Bound) -> bool:
    """CastLike(x, like) is Cast(x, to=like's element type), known once types are."""
    ctx, node = b.ctx, b.node
    e.emit(node, "Cast", [node.inputs[0]], [node.outputs[0]], [ctx.out(0)],
           {"to": to_onnx(ctx.out(0).dtype), "saturate": ctx.attr("saturate")}, opset=19)
    return True


def _max_pool_8bit(e: _Emitter, b: Bound) -> bool:
    """MaxPool of int8/uint8 (opset 12) runs in float32, which holds every 8-bit value exactly."""
    ctx, node = b.ctx, b.node
    dtype = ctx.type(0).dtype
    if dtype.kind not in "iu":
        return False
    x, y, f32 = node.inputs[0], node.outputs[0], np.dtype(np.float32)
    e.emit(node, "Cast", [x], [f"{y}/x_float"], [TensorType(f32, ctx.shape(0))], {"to": to_onnx(f32)}, opset=19)
    e.emit(node, "MaxPool", [f"{y}/x_float"], [f"{y}/float", *node.outputs[1:]],
           [TensorType(f32, ctx.out(0).shape), *ctx.out_types[1:]], dict(node.attrs), opset=ctx.opset)
    e.emit(node, "Cast", [f"{y}/float"], [y], [ctx.out(0)], {"to": to_onnx(dtype)}, opset=19)
    return True


def _pow_by_small_integer(e: _Emitter, b: Bound) -> bool:
    """Pow(X, 2) -> Mul(X, X) and Pow(X, 1) -> Identity(X) for a constant scalar exponent: x * x and pow(x, 2)
    are both the correctly rounded square (onnxruntime's Pow computes x * x for exponent 2 too)."""
    ctx, node = b.ctx, b.node
    p = ctx.consts[1]
    if (p is None or p.size != 1 or ctx.type(0).dtype not in FLOATS or ctx.out(0).shape != ctx.shape(0)
            or float(p.reshape(-1)[0]) not in (1.0, 2.0)):
        return False
    x, y = node.inputs[0], node.outputs[0]
    if float(p.reshape(-1)[0]) == 1.0:
        e.emit(node, "Identity", [x], [y], [ctx.out(0)])
    else:
        e.emit(node, "Mul", [x, x], [y], [ctx.out(0)], opset=14)
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


def _readers(spec: Specialized) -> dict[str, list[tuple[Bound, int]]]:
    """Value name -> the (node, input position) pairs that read it."""
    readers = defaultdict(list)
    for b in spec.nodes:
        for i, name in enumerate(b.node.inputs):
            if name:
                readers[name].append((b, i))
    return readers


def foldable_transposes(spec: Specialized) -> dict[str, str]:
    """Float transposes of the last two dims whose every reader is a GEMM operand: output -> transposed input."""
    readers = _readers(spec)
    folded = {}
    for b in spec.nodes:
        y = b.node.outputs[0]
        if (b.op.key == ("", "Transpose") and b.ctx.type(0).dtype in FLOATS and y not in spec.output_names
                and readers[y] and _swaps_last_two(b) and all(_reads_plainly(r, i) for r, i in readers[y])):
            folded[y] = b.node.inputs[0]
    return folded


def transposed_results(spec: Specialized, folded: dict[str, str]) -> dict[str, str]:
    """GEMM results read only by a float transpose of their last two dims (torch's Linear weight gradients,
    ``Transpose(A^T dY)``): GEMM output -> the transpose's output, which the GEMM then writes itself, as
    ``(op(A) op(B))^T = op(B)^T op(A)^T``. Operands of one rank only: an N-D A times a 2-D B is one flattened
    GEMM (``kernels.matmul``), which the swapped form would split into one call per batch index."""
    readers = _readers(spec)
    gemms = {b.node.outputs[0]: b for b in spec.nodes if _reads_plainly(b, 0) and _reads_plainly(b, 1)}
    results = {}
    for b in spec.nodes:
        x, y = b.node.inputs[0], b.node.outputs[0]
        g = gemms.get(x)
        if (b.op.key == ("", "Transpose") and y not in folded and g is not None and x not in spec.output_names
                and len(readers[x]) == 1 and b.ctx.type(0).dtype in FLOATS and _swaps_last_two(b)
                and len(g.ctx.type(0).shape) == len(g.ctx.type(1).shape)):
            results[x] = y
    return results


def _same_rank(b: Bound) -> bool:
    return len(b.ctx.type(0).shape) == len(b.ctx.type(1).shape)


def _perm_of(b: Bound) -> tuple[int, ...]:
    rank = len(b.ctx.type(0).shape)
    perm = b.ctx.attr("perm")
    return tuple(range(rank))[::-1] if perm is None else tuple(int(p) for p in perm)


def permuted_views(spec: Specialized, folded: dict[str, str]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Other float transposes whose every reader is a GEMM operand (of operands of one rank: attention's heads
    split, ``[N, T, H, D] -> [N, H, T, D]``): output -> (input, perm). The GEMM reads the input through the
    transposed view, which BLAS takes as it is when the input's last dim stays one of the last two (its rows
    then have a unit stride and a leading dimension of at least a row)."""
    readers = _readers(spec)
    views = {}
    for b in spec.nodes:
        y = b.node.outputs[0]
        if b.op.key != ("", "Transpose") or y in folded or y in spec.output_names or not readers[y]:
            continue
        perm, last = _perm_of(b), len(b.ctx.type(0).shape) - 1
        if (b.ctx.type(0).dtype in FLOATS and last >= 1 and last in perm[-2:]
                and all(_reads_plainly(r, i) and _same_rank(r) for r, i in readers[y])):
            views[y] = (b.node.inputs[0], perm)
    return views


def permuted_results(spec: Specialized, results: dict[str, str]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """GEMM results (operands of one rank) read only by another float transpose that keeps one of their last
    two dims last (attention's heads merged back, ``[N, H, T, D] -> [N, T, H, D]``): GEMM output -> (the
    transpose's output, perm). The GEMM writes through the inverse view of the transpose's output."""
    readers = _readers(spec)
    gemms = {b.node.outputs[0]: b for b in spec.nodes
             if _reads_plainly(b, 0) and _reads_plainly(b, 1) and _same_rank(b)}
    out = {}
    for b in spec.nodes:
        x, y = b.node.inputs[0], b.node.outputs[0]
        if (b.op.key == ("", "Transpose") and x in gemms and x not in results and x not in spec.output_names
                and len(readers[x]) == 1 and b.ctx.type(0).dtype in FLOATS):
            perm = _perm_of(b)
            if perm[-1] >= len(perm) - 2:
                out[x] = (y, perm)
    return out


def _compose(first: tuple[int, ...], then: tuple[int, ...]) -> tuple[int, ...]:
    """The perm of ``transpose(transpose(x, first), then)``."""
    return tuple(first[t] for t in then)


def _permuted_gemm(e: _Emitter, b: Bound, folded: dict[str, str], views: dict, results: dict[str, str],
                   permuted: dict) -> None:
    """``b`` as an ai.edgetrain PermutedMatMul: each operand the transposed view of what its transpose reads,
    composed with the GEMM's own transA/transB, and its result written through the inverse view of its
    transpose's output."""
    ctx, node = b.ctx, b.node
    fused = b.op.key == ("com.microsoft", "FusedMatMul")
    inputs, perms = [], []
    for i, flag in enumerate(("transA", "transB")):
        x, rank = node.inputs[i], len(ctx.type(i).shape)
        swap = tuple(range(rank - 2)) + (rank - 1, rank - 2)
        perm = tuple(range(rank))
        if x in folded:
            x, perm = folded[x], swap
        elif x in views:
            x, perm = views[x]
        if fused and ctx.attr(flag):
            perm = _compose(perm, swap)
        inputs.append(x)
        perms.append(perm)
    y, rank = node.outputs[0], len(ctx.out(0).shape)
    perm_y = tuple(range(rank))
    if y in results:
        y, perm_y = results[y], tuple(range(rank - 2)) + (rank - 1, rank - 2)
    elif y in permuted:
        y, perm_y = permuted[y]
    attrs = {"alpha": ctx.attr("alpha") if fused else 1.0, "permA": perms[0], "permB": perms[1],
             "permY": perm_y}
    e.emit(node, "PermutedMatMul", inputs, [y], [e.spec.types[y]], attrs, "ai.edgetrain")


def _gemm_reading(e: _Emitter, b: Bound, folded: dict[str, str], results: dict[str, str]) -> None:
    """``b`` as a FusedMatMul that reads the folded transposes' inputs (its flags flipped) and, where its
    result is transposed, writes the transpose's output with its operands swapped."""
    ctx, node = b.ctx, b.node
    fused = b.op.key == ("com.microsoft", "FusedMatMul")
    attrs = {"transA": ctx.attr("transA"), "transB": ctx.attr("transB"), "alpha": ctx.attr("alpha")} if fused \
        else {"transA": 0, "transB": 0, "alpha": 1.0}
    for i, flag in enumerate(("transA", "transB")):
        if node.inputs[i] in folded:
            attrs[flag] = 1 - attrs[flag]
    inputs = [folded.get(x, x) for x in node.inputs[:2]]
    y, out = node.outputs[0], ctx.out(0)
    if y in results:
        inputs = inputs[::-1]
        attrs["transA"], attrs["transB"] = 1 - attrs["transB"], 1 - attrs["transA"]
        y, out = results[y], e.spec.types[results[y]]
    e.emit(node, "FusedMatMul", inputs, [y], [out], attrs, "com.microsoft")


# --- onnxruntime's training vocabulary (edgetrain.ops.ort_training) ----------------------------------------

def _reduced_to(e: _Emitter, src: Node, x: str, x_type: TensorType, shape: tuple, name: str) -> None:
    """``name`` = ``x`` summed over the axes ``shape`` was broadcast along (leading ones dropped): the gradient
    of an input of that shape."""
    out = tuple(x_type.shape)
    lead = len(out) - len(shape)
    axes = [d for d in range(len(out)) if d < lead or (shape[d - lead] == 1 and out[d] != 1)]
    if not axes:
        e.emit(src, "Identity", [x], [name], [x_type])
        return
    axes_name = e.const(f"{name}/axes", np.array(axes, np.int64))
    kept = tuple(1 if d in axes else n for d, n in enumerate(out))
    summed = name if not lead else f"{name}/summed"
    e.emit(src, "ReduceSum", [x, axes_name], [summed], [TensorType(x_type.dtype, kept)], {"keepdims": 1}, opset=13)
    if lead:
        e.emit(src, "Reshape", [summed, e.const(f"{name}/shape", np.array(shape, np.int64))], [name],
               [TensorType(x_type.dtype, tuple(shape))])


def _concat_training(e: _Emitter, b: Bound) -> bool:
    """A Concat; the lengths output is a constant already (``OpDef.known_outputs``)."""
    node = b.node
    e.emit(node, "Concat", list(node.inputs), [node.outputs[0]], [b.ctx.out(0)], {"axis": b.ctx.attr("axis")})
    return True


def _div_grad(e: _Emitter, b: Bound) -> bool:
    """dA = dY / B, dB = -(dY / B) (A / B), each summed to its input's shape."""
    ctx, node = b.ctx, b.node
    dy, a, bb = node.inputs
    full = ctx.type(0)
    outs = list(node.outputs) + [""] * (2 - len(node.outputs))
    base = f"{outs[0] or outs[1]}/div_grad"
    e.emit(node, "Div", [dy, bb], [f"{base}/q"], [full], opset=14)
    if outs[0]:
        _reduced_to(e, node, f"{base}/q", full, ctx.type(1).shape, outs[0])
    if outs[1]:
        e.emit(node, "Div", [a, bb], [f"{base}/ratio"], [full], opset=14)
        e.emit(node, "Mul", [f"{base}/q", f"{base}/ratio"], [f"{base}/prod"], [full], opset=14)
        e.emit(node, "Neg", [f"{base}/prod"], [f"{base}/neg"], [full])
        _reduced_to(e, node, f"{base}/neg", full, ctx.type(2).shape, outs[1])
    return True


def _sln_stats(e: _Emitter, b: Bound, x: str, x_type: TensorType, name: str) -> tuple[str, list[int]]:
    """inv_std_var = 1 / sqrt(mean(x^2 over the normalized axes) + epsilon), in X's element type."""
    ctx, node = b.ctx, b.node
    axis = ctx.attr("axis") % len(x_type.shape)
    axes = list(range(axis, len(x_type.shape)))
    stat = TensorType(x_type.dtype, x_type.shape[:axis] + (1,) * len(axes))
    e.emit(node, "Mul", [x, x], [f"{name}/sq"], [x_type], opset=14)
    e.emit(node, "ReduceMean", [f"{name}/sq", e.const(f"{name}/axes", np.array(axes, np.int64))], [f"{name}/ms"],
           [stat], {"keepdims": 1}, opset=18)
    eps = e.const(f"{name}/eps", np.array(ctx.attr("epsilon"), x_type.dtype))
    e.emit(node, "Add", [f"{name}/ms", eps], [f"{name}/var"], [stat], opset=14)
    e.emit(node, "Sqrt", [f"{name}/var"], [f"{name}/std"], [stat])
    e.emit(node, "Reciprocal", [f"{name}/std"], [name], [stat])
    return name, axes


def _typed_stat(e: _Emitter, src: Node, stat: str, t: TensorType, want: TensorType, out: str) -> None:
    if t.dtype == want.dtype:
        e.emit(src, "Identity", [stat], [out], [want])
    else:
        from ..ir.dtypes import to_onnx
        e.emit(src, "Cast", [stat], [out], [want], {"to": to_onnx(want.dtype)})


def _simplified_layer_norm(e: _Emitter, b: Bound) -> bool:
    ctx, node = b.ctx, b.node
    x_type, y = ctx.type(0), node.outputs[0]
    inv, _ = _sln_stats(e, b, node.inputs[0], x_type, f"{y}/inv_std_var")
    e.emit(node, "Mul", [node.inputs[0], inv], [f"{y}/normalized"], [x_type], opset=14)
    e.emit(node, "Mul", [f"{y}/normalized", node.inputs[1]], [y], [x_type], opset=14)
    if len(node.outputs) > 1 and node.outputs[1]:
        stat = e.spec.types[inv]
        _typed_stat(e, node, inv, stat, ctx.out(1), node.outputs[1])
    return True


def _simplified_layer_norm_grad(e: _Emitter, b: Bound) -> bool:
    """x^ = X r, g = dY scale: dX = r (g - x^ mean(g x^)), dScale = sum over the leading axes of dY x^."""
    ctx, node = b.ctx, b.node
    dy, x, scale, inv = node.inputs
    x_type = ctx.type(1)
    outs = list(node.outputs) + [""] * (2 - len(node.outputs))
    name = f"{outs[0] or outs[1]}/sln_grad"
    axis = ctx.attr("axis") % len(x_type.shape)
    stat = TensorType(x_type.dtype, x_type.shape[:axis] + (1,) * (len(x_type.shape) - axis))
    if ctx.type(3).dtype != x_type.dtype:
        from ..ir.dtypes import to_onnx
        e.emit(node, "Cast", [inv], [f"{name}/r"], [stat], {"to": to_onnx(x_type.dtype)})
        inv = f"{name}/r"
    e.emit(node, "Mul", [x, inv], [f"{name}/xhat"], [x_type], opset=14)
    xhat = f"{name}/xhat"
    if outs[0]:
        e.emit(node, "Mul", [dy, scale], [f"{name}/g"], [x_type], opset=14)
        e.emit(node, "Mul", [f"{name}/g", xhat], [f"{name}/gx"], [x_type], opset=14)
        axes = e.const(f"{name}/axes", np.array(range(axis, len(x_type.shape)), np.int64))
        e.emit(node, "ReduceMean", [f"{name}/gx", axes], [f"{name}/m"], [stat], {"keepdims": 1}, opset=18)
        e.emit(node, "Mul", [xhat, f"{name}/m"], [f"{name}/xm"], [x_type], opset=14)
        e.emit(node, "Sub", [f"{name}/g", f"{name}/xm"], [f"{name}/c"], [x_type], opset=14)
        e.emit(node, "Mul", [f"{name}/c", inv], [outs[0]], [x_type], opset=14)
    if outs[1]:
        e.emit(node, "Mul", [dy, xhat], [f"{name}/dyx"], [x_type], opset=14)
        lead = e.const(f"{name}/lead", np.array(range(axis), np.int64))
        if axis:
            e.emit(node, "ReduceSum", [f"{name}/dyx", lead], [outs[1]], [ctx.out(1)], {"keepdims": 0}, opset=13)
        else:
            e.emit(node, "Identity", [f"{name}/dyx"], [outs[1]], [ctx.out(1)])
    return True


def _conv_transpose_grad(e: _Emitter, b: Bound) -> bool:
    """As ConvTranspose's gradient rule: with C the Conv whose adjoint it is, dX = C(dY; W), dW = ConvGrad(X, dY,
    W)'s dW, dB = ReduceSum(dY) over N and space."""
    from ..ops.conv import CONV_TRANSPOSE, conv_transpose_geometry
    ctx, node = b.ctx, b.node
    dy, x, w = node.inputs
    outs = list(node.outputs) + [""] * (3 - len(node.outputs))
    probe = NodeContext(Node("ConvTranspose", [x, w], ["y"], dict(node.attrs), node.name), CONV_TRANSPOSE,
                        11, [ctx.type(1), ctx.type(2)], [None, None])
    attrs = conv_transpose_geometry(probe).conv_attrs()
    if outs[0]:
        e.emit(node, "Conv", [dy, w], [outs[0]], [ctx.out(0)], dict(attrs), opset=11)
    if outs[1]:
        e.emit(node, "ConvGrad", [x, dy, w], ["", outs[1]], [ctx.type(1), ctx.out(1)], dict(attrs),
               "com.microsoft")
    if outs[2]:
        axes = [0] + list(range(2, len(ctx.type(0).shape)))
        e.emit(node, "ReduceSum", [dy, e.const(f"{outs[2]}/axes", np.array(axes, np.int64))], [outs[2]],
               [ctx.out(2)], {"keepdims": 0}, opset=13)
    return True


def _sce_internal(e: _Emitter, b: Bound) -> bool:
    """SoftmaxCrossEntropyLoss(Grad) with ignore_index as the attribute (``ops.ort_training.sce_core``)."""
    from ..ops.ort_training import sce_core
    ignore, weight = (3, 2) if b.op.op_type == "SoftmaxCrossEntropyLossInternal" else (4, 3)
    core = sce_core(b.ctx, ignore, weight)
    e.emit(b.node, core.op.op_type, list(core.node.inputs), list(core.node.outputs), list(b.ctx.out_types),
           dict(core.node.attrs), core.op.domain, opset=13)
    return True


def _activation(e: _Emitter, b: Bound, x: str) -> None:
    """output 0 = the fused activation of ``x`` (``ops.ort_training.activation``)."""
    from ..ops.ort_training import activation
    name, attrs, bounds = activation(b.ctx)
    t = b.ctx.out(0)
    inputs = [x] + [e.const(f"{b.node.outputs[0]}/clip{k}", np.array(v, t.dtype)) for k, v in enumerate(bounds)]
    e.emit(b.node, name, inputs, [b.node.outputs[0]], [t], attrs, opset=17)


def _fused(core_type: str, n_inputs: int, attr_names):
    """FusedGemm / FusedConv: the core op's own lowering into ``<y>/core``, (+ Z,) then the activation."""
    def rule(e: _Emitter, b: Bound) -> bool:
        from ..ops.ort_training import core_context
        core = core_context(b.ctx, core_type, n_inputs, attr_names)
        y = b.node.outputs[0]
        core.node.outputs = [f"{y}/core"]
        core.out_types = [b.ctx.out(0)]
        if not RULES[("", core_type)](e, Bound(core.op, core)):
            e.emit(b.node, core_type, list(core.node.inputs), [f"{y}/core"], [b.ctx.out(0)], dict(core.node.attrs),
                   opset=core.opset)
        x = f"{y}/core"
        if core_type == "Conv" and b.ctx.has_input(3):
            e.emit(b.node, "Add", [x, b.node.inputs[3]], [f"{y}/z"], [b.ctx.out(0)], opset=14)
            x = f"{y}/z"
        _activation(e, b, x)
        return True
    return rule


# One table of lowering rules, keyed by (domain, op): a rule emits the lowered nodes and returns True, or
# returns False to keep the node as it is.
RULES = {("", "Gemm"): _gemm, ("", "Conv"): _conv, ("", "ConvTranspose"): _conv, ("", "Dropout"): _dropout,
         ("", "BatchNormalization"): _batch_norm_inference, ("", "CastLike"): _cast_like,
         ("", "MaxPool"): _max_pool_8bit, ("", "Pow"): _pow_by_small_integer,
         ("", "Sum"): _variadic, ("", "Mean"): _variadic, ("", "Max"): _variadic, ("", "Min"): _variadic,
         ("", "SimplifiedLayerNormalization"): _simplified_layer_norm,
         ("", "RMSNormalization"): _simplified_layer_norm,
         ("com.microsoft", "ConcatTraining"): _concat_training, ("com.microsoft", "DivGrad"): _div_grad,
         ("com.microsoft", "SimplifiedLayerNormalizationGrad"): _simplified_layer_norm_grad,
         ("com.microsoft", "ConvTransposeGrad"): _conv_transpose_grad,
         ("com.microsoft", "SoftmaxCrossEntropyLossInternal"): _sce_internal,
         ("com.microsoft", "SoftmaxCrossEntropyLossInternalGrad"): _sce_internal,
         ("com.microsoft", "FusedGemm"): _fused("Gemm", 3, ("alpha", "beta", "transA", "transB")),
         ("com.microsoft", "FusedConv"): _fused("Conv", 3, tuple(CONV_ATTRS))}


def lower(spec: Specialized) -> Specialized:
    e = _Emitter(spec)
    folded = foldable_transposes(spec)
    results = transposed_results(spec, folded)
    views = permuted_views(spec, folded)
    permuted = permuted_results(spec, results)
    gone = set(folded) | set(results.values()) | set(views) | {y for y, _ in permuted.values()}
    for b in spec.nodes:
        if b.op.key == ("", "Transpose") and b.node.outputs[0] in gone:
            continue
        operands, y = b.node.inputs[:2], b.node.outputs[0]
        if b.op.key in GEMMS and (any(x in views for x in operands) or y in permuted):
            _permuted_gemm(e, b, folded, views, results, permuted)
            continue
        if b.op.key in GEMMS and (any(x in folded for x in operands) or y in results):
            _gemm_reading(e, b, folded, results)
            continue
        rule = RULES.get(b.op.key)
        if rule is None or not rule(e, b):
            e.nodes.append(b)
    spec.nodes = e.nodes
    return spec
