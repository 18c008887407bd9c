"""Shape and data-movement ops: views (Reshape, Flatten, Squeeze, Unsqueeze, Identity), copies (Transpose,
Concat, Split, Slice, Gather, Expand, Pad, Cast), shape arithmetic folded when planning (Constant, Shape, Size,
ConstantOfShape), and training-mode Dropout."""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from ..ir.dtypes import to_numpy
from .base import ANY, NodeContext, OpDef, broadcast_shapes, normalize_axis

INDEX = (np.dtype(np.int32), np.dtype(np.int64))


def _t(ctx: NodeContext, shape, i: int = 0) -> TensorType:
    return TensorType(ctx.type(i).dtype, tuple(int(d) for d in shape))


# --- views --------------------------------------------------------------------------------------------------

def reshape_target(ctx: NodeContext) -> tuple[int, ...]:
    src = ctx.shape(0)
    want = [int(d) for d in ctx.const(1, "shape").reshape(-1)]
    allowzero = ctx.attr("allowzero", 0)
    out = [src[i] if d == 0 and not allowzero else d for i, d in enumerate(want)]
    if out.count(-1) > 1:
        raise ctx.error(f"shape {want} has more than one -1")
    known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
    total = int(np.prod(src, dtype=np.int64))
    if -1 in out:
        if known == 0 or total % known:
            raise ctx.error(f"cannot reshape {src} to {want}")
        out[out.index(-1)] = total // known
    if int(np.prod(out, dtype=np.int64)) != total:
        raise ctx.error(f"cannot reshape {src} ({total} elements) to {want}")
    return tuple(out)


def _reshape(ctx):
    return [_t(ctx, reshape_target(ctx))]


def _flatten(ctx):
    shape = ctx.shape(0)
    axis = normalize_axis(ctx, ctx.attr("axis", 1), len(shape) + 1) if shape else 0
    return [_t(ctx, (int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64))))]


def _squeeze(ctx):
    shape = ctx.shape(0)
    axes = ctx.axes(1)
    if axes is None:
        return [_t(ctx, [d for d in shape if d != 1])]
    axes = {normalize_axis(ctx, a, len(shape)) for a in axes}
    for a in axes:
        if shape[a] != 1:
            raise ctx.error(f"cannot squeeze axis {a} of size {shape[a]}")
    return [_t(ctx, [d for i, d in enumerate(shape) if i not in axes])]


def _unsqueeze(ctx):
    shape = list(ctx.shape(0))
    axes = ctx.axes(1)
    if axes is None:
        raise ctx.error("axes are required")
    rank = len(shape) + len(axes)
    for a in sorted(normalize_axis(ctx, a, rank) for a in axes):
        shape.insert(a, 1)
    return [_t(ctx, shape)]


def _identity(ctx):
    return [ctx.type(0)]


# --- folded when planning ----------------------------------------------------------------------------------

def _constant_value(ctx) -> np.ndarray:
    attrs = ctx.node.attrs
    for key, make in (("value", np.asarray), ("value_float", lambda v: np.array(v, np.float32)),
                      ("value_floats", lambda v: np.array(v, np.float32)),
                      ("value_int", lambda v: np.array(v, np.int64)),
                      ("value_ints", lambda v: np.array(v, np.int64))):
        if attrs.get(key) is not None:
            return make(attrs[key])
    raise ctx.error("Constant needs one of value, value_float(s), value_int(s)")


def _shape_range(ctx):
    rank = len(ctx.shape(0))
    start, end = ctx.attr("start", 0), ctx.attr("end", rank)
    return slice(max(0, min(rank, start + rank if start < 0 else start)), max(0, min(rank, end + rank if end < 0 else end)))


def _constant_of_shape_value(ctx):
    value = ctx.attr("value", np.zeros(1, np.float32))
    return np.asarray(value).reshape(-1)[0:1]


OPS_FOLD = (
    OpDef("Constant", lambda ctx: [TensorType(_constant_value(ctx).dtype, _constant_value(ctx).shape)],
          kind="fold", fold=lambda ctx: _constant_value(ctx), dtypes=ANY, type_input=None),
    OpDef("ConstantOfShape", lambda ctx: [TensorType(_constant_of_shape_value(ctx).dtype,
                                                     tuple(int(d) for d in ctx.const(0, "shape").reshape(-1)))],
          since=9, kind="fold", dtypes=(np.dtype(np.int64),),
          fold=lambda ctx, shape: np.full(tuple(int(d) for d in shape), _constant_of_shape_value(ctx)[0])),
    OpDef("Shape", lambda ctx: [TensorType(np.int64, (len(range(*_shape_range(ctx).indices(len(ctx.shape(0))))),))],
          since=15, kind="fold", dtypes=ANY,
          fold=lambda ctx, x: np.array(ctx.shape(0)[_shape_range(ctx)], np.int64)),
    OpDef("Size", lambda ctx: [TensorType(np.int64, ())], kind="fold", dtypes=ANY,
          fold=lambda ctx, x: np.array(ctx.type(0).size, np.int64)),
)


# --- copies ------------------------------------------------------------------------------------------------

def _cast(ctx):
    return [TensorType(to_numpy(ctx.attr("to"), f"{ctx.node} attribute 'to'"), ctx.shape(0))]


def _concat(ctx):
    shapes = [ctx.shape(i) for i in range(len(ctx.node.inputs)) if ctx.has_input(i)]
    axis = normalize_axis(ctx, ctx.attr("axis"), len(shapes[0]))
    for s in shapes:
        if len(s) != len(shapes[0]) or any(a != b for d, (a, b) in enumerate(zip(s, shapes[0])) if d != axis):
            raise ctx.error(f"shapes {shapes} differ outside axis {axis}")
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    return [_t(ctx, out)]


def _expand(ctx):
    target = tuple(int(d) for d in ctx.const(1, "shape").reshape(-1))
    return [_t(ctx, broadcast_shapes(ctx, ctx.shape(0), target))]


def _gather(ctx):
    data, idx = ctx.shape(0), ctx.shape(1)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(data))
    if ctx.type(1).dtype not in INDEX:
        raise ctx.error("indices must be int32 or int64")
    return [_t(ctx, data[:axis] + idx + data[axis + 1:])]


def slice_spec(ctx: NodeContext) -> tuple[slice, ...]:
    """Python slices for Slice's starts/ends/axes/steps, clamped as the ONNX spec says."""
    shape = ctx.shape(0)
    starts = ctx.const(1, "starts").reshape(-1)
    ends = ctx.const(2, "ends").reshape(-1)
    axes = ctx.const(3, "axes", None)
    axes = range(len(starts)) if axes is None else [normalize_axis(ctx, int(a), len(shape)) for a in axes.reshape(-1)]
    steps = ctx.const(4, "steps", None)
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps.reshape(-1)]
    spec = [slice(None)] * len(shape)
    for a, s, e, st in zip(axes, starts, ends, steps):
        if st == 0:
            raise ctx.error("Slice steps must be nonzero")
        dim = shape[a]
        s, e = int(max(min(s, 2**62), -2**62)), int(max(min(e, 2**62), -2**62))
        s = s + dim if s < 0 else s
        e = e + dim if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
        else:
            s, e = min(max(s, -1), dim - 1), min(max(e, -1), dim - 1)
        spec[a] = slice(s, e if e >= 0 else None, st)
    return tuple(spec)


def _slice(ctx):
    shape = ctx.shape(0)
    return [_t(ctx, [len(range(*sl.indices(d))) for sl, d in zip(slice_spec(ctx), shape)])]


def split_sizes(ctx: NodeContext) -> list[int]:
    shape = ctx.shape(0)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(shape))
    n = len(ctx.node.outputs)
    split = ctx.node.attrs.get("split")
    if split is None and ctx.has_input(1):
        split = ctx.const(1, "split").reshape(-1)
    if split is not None:
        split = [int(s) for s in split]
        if sum(split) != shape[axis] or len(split) != n:
            raise ctx.error(f"split {split} does not cover axis {axis} of size {shape[axis]} in {n} outputs")
        return split
    n = ctx.attr("num_outputs", n)
    chunk = -(-shape[axis] // n)
    return [min(chunk, shape[axis] - i * chunk) for i in range(n)]


def _split(ctx):
    shape = ctx.shape(0)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(shape))
    return [_t(ctx, shape[:axis] + (s,) + shape[axis + 1:]) for s in split_sizes(ctx)]


def transpose_perm(ctx) -> tuple[int, ...]:
    rank = len(ctx.shape(0))
    perm = ctx.attr("perm", tuple(range(rank))[::-1])
    if sorted(perm) != list(range(rank)):
        raise ctx.error(f"perm {perm} is not a permutation of {rank} axes")
    return tuple(perm)


def _transpose(ctx):
    shape = ctx.shape(0)
    return [_t(ctx, [shape[p] for p in transpose_perm(ctx)])]


def pad_widths(ctx: NodeContext) -> list[tuple[int, int]]:
    rank = len(ctx.shape(0))
    pads = [int(p) for p in (ctx.node.attrs["pads"] if "pads" in ctx.node.attrs else ctx.const(1, "pads").reshape(-1))]
    axes = ctx.axes(3)
    axes = list(range(rank)) if axes is None else [normalize_axis(ctx, a, rank) for a in axes]
    if len(pads) != 2 * len(axes):
        raise ctx.error(f"pads {pads} must have 2 entries per padded axis ({len(axes)})")
    widths = [(0, 0)] * rank
    for k, a in enumerate(axes):
        widths[a] = (pads[k], pads[k + len(axes)])
    return widths


def _pad(ctx):
    if ctx.attr("mode", "constant") not in ("constant", "reflect", "edge", "wrap"):
        raise ctx.error(f"pad mode '{ctx.attr('mode')}' is not supported")
    return [_t(ctx, [d + a + b for d, (a, b) in zip(ctx.shape(0), pad_widths(ctx))])]


def _dropout(ctx):
    return [ctx.type(0), TensorType(np.bool_, ctx.shape(0))]


OPS = OPS_FOLD + (
    OpDef("Cast", _cast, since=19, kernel="tensor.cast", dtypes=ANY),
    OpDef("Concat", _concat, kernel="tensor.concat", dtypes=ANY),
    OpDef("Dropout", _dropout, kernel="tensor.dropout", workspace=lambda ctx: [TensorType(np.float32, ctx.shape(0))],
          doc="training mode with ratio > 0; inference mode is lowered to a view"),
    OpDef("Expand", _expand, kernel="tensor.expand", dtypes=ANY),
    OpDef("Flatten", _flatten, kind="alias", dtypes=ANY),
    OpDef("Gather", _gather, kernel="tensor.gather", dtypes=ANY),
    OpDef("Identity", _identity, since=19, kind="alias", dtypes=ANY),
    OpDef("Pad", _pad, since=19, kernel="tensor.pad", dtypes=ANY),
    OpDef("Reshape", _reshape, since=19, kind="alias", dtypes=ANY),
    OpDef("Slice", _slice, kernel="tensor.slice", dtypes=ANY),
    OpDef("Split", _split, since=18, kernel="tensor.split", dtypes=ANY),
    OpDef("Squeeze", _squeeze, kind="alias", dtypes=ANY),
    OpDef("Transpose", _transpose, kernel="tensor.transpose", dtypes=ANY),
    OpDef("Unsqueeze", _unsqueeze, kind="alias", dtypes=ANY),
)
