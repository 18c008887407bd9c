"""Shape and data-movement ops: views (Reshape, Flatten, Squeeze, Unsqueeze, Identity), copies (Transpose,
Concat, Split, Slice, Gather, Expand, Pad, Cast, Resize), shape arithmetic folded when planning (Constant,
Shape, Size, ConstantOfShape), and training-mode Dropout; with their gradient rules and onnxruntime's
com.microsoft gradient ops (GatherGrad, SliceGrad, DropoutGrad, ResizeGrad)."""
from __future__ import annotations

import numpy as np

from ..ir import Node, TensorType
from ..ir.dtypes import to_numpy, to_onnx
from .attrs import REQUIRED, Flag, Float, Floats, Int, Ints, String, Tensor
from .base import ALL_NUMERIC, ANY, NUMERIC, NodeContext, OpDef, broadcast_shapes, normalize_axis

INDEX = (np.dtype(np.int32), np.dtype(np.int64))


def _t(ctx: NodeContext, shape, i: int = 0) -> TensorType:
    return TensorType(ctx.type(i).dtype, tuple(int(d) for d in shape))


# --- views --------------------------------------------------------------------------------------------------

def reshape_target(ctx: NodeContext) -> tuple[int, ...]:
    src = ctx.shape(0)
    want = [int(d) for d in ctx.const(1, "shape").reshape(-1)]
    allowzero = ctx.attr("allowzero")
    if any(d < -1 for d in want):
        raise ctx.error(f"shape {want} has a negative entry other than -1")
    if not allowzero and any(d == 0 and i >= len(src) for i, d in enumerate(want)):
        raise ctx.error(f"shape {want} copies (0) a dim beyond the input's rank {len(src)}")
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
    rank = len(shape)
    axis = ctx.attr("axis")
    if not -rank <= axis <= rank:         # axis may equal rank (output [N, 1]); negative counts from the back
        raise ctx.error(f"axis {axis} is out of range [-{rank}, {rank}]")
    axis = axis + rank if axis < 0 else axis
    return [_t(ctx, (int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64))))]


def _squeeze(ctx):
    shape = ctx.shape(0)
    axes = ctx.axes(1)
    if axes is None:
        return [_t(ctx, [d for d in shape if d != 1])]
    norm = [normalize_axis(ctx, a, len(shape)) for a in axes]
    if len(set(norm)) != len(norm):
        raise ctx.error(f"axes {list(axes)} repeat an axis")
    axes = set(norm)
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
    norm = sorted(normalize_axis(ctx, a, rank) for a in axes)
    if len(set(norm)) != len(norm):
        raise ctx.error(f"axes {list(axes)} repeat an axis")
    for a in norm:
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
    start, end = ctx.attr("start"), ctx.attr("end")
    end = rank if end is None else end
    return slice(max(0, min(rank, start + rank if start < 0 else start)), max(0, min(rank, end + rank if end < 0 else end)))


def _constant_of_shape_value(ctx):
    value = ctx.attr("value")
    value = np.zeros(1, np.float32) if value is None else value
    return np.asarray(value).reshape(-1)[0:1]


OPS_FOLD = (
    OpDef("Constant", lambda ctx: [TensorType(_constant_value(ctx).dtype, _constant_value(ctx).shape)],
          kind="fold", fold=lambda ctx: _constant_value(ctx), dtypes=ANY, type_input=None,
          attrs={"value": Tensor(), "value_float": Float(), "value_floats": Floats(), "value_int": Int(),
                 "value_ints": Ints()}),
    OpDef("ConstantOfShape", lambda ctx: [TensorType(_constant_of_shape_value(ctx).dtype,
                                                     tuple(int(d) for d in ctx.const(0, "shape").reshape(-1)))],
          since=9, kind="fold", dtypes=(np.dtype(np.int64),), attrs={"value": Tensor()},
          fold=lambda ctx, shape: np.full(tuple(int(d) for d in shape), _constant_of_shape_value(ctx)[0])),
    OpDef("Shape", lambda ctx: [TensorType(np.int64, (len(range(*_shape_range(ctx).indices(len(ctx.shape(0))))),))],
          since=15, kind="fold", dtypes=ANY, attrs={"end": Int(), "start": Int(0)},
          fold=lambda ctx, x: np.array(ctx.shape(0)[_shape_range(ctx)], np.int64)),
    OpDef("Size", lambda ctx: [TensorType(np.int64, ())], kind="fold", dtypes=ANY,
          fold=lambda ctx, x: np.array(ctx.type(0).size, np.int64)),
    OpDef("EyeLike", lambda ctx: [_eye_like_type(ctx)], since=22, kind="fold", dtypes=ANY,
          attrs={"dtype": Int(), "k": Int(0)},
          fold=lambda ctx, x: np.eye(*_eye_like_type(ctx).shape, k=ctx.attr("k"), dtype=_eye_like_type(ctx).dtype)),
)


def _eye_like_type(ctx) -> TensorType:
    """EyeLike depends on its input's shape only (so it folds): a 2-D output of the ``dtype`` attribute's type,
    else the input's."""
    shape = tuple(ctx.shape(0))
    if len(shape) != 2:
        raise ctx.error(f"input must be 2-D, got shape {list(shape)}")
    code = ctx.attr("dtype")
    return TensorType(ctx.type(0).dtype if code is None else to_numpy(code, f"{ctx.node} attribute dtype"), shape)


# --- copies ------------------------------------------------------------------------------------------------

def _cast(ctx):
    return [TensorType(to_numpy(ctx.attr("to"), f"{ctx.node} attribute 'to'"), ctx.shape(0))]


def _cast_workspace(ctx):
    """A Cast to a carried type (float16, float8, ...) whose result is held in float32 (plan/widen.py) rounds
    through a copy of that type."""
    to = to_numpy(ctx.attr("to"), f"{ctx.node} attribute 'to'")
    return [TensorType(to, ctx.shape(0))] if ctx.out(0).dtype != to else []


def _cast_like(ctx):
    return [TensorType(ctx.type(1).dtype, ctx.shape(0))]


def _cast_like_vjp(g, dys):
    return _cast_vjp(g, dys) + [None]


def _concat(ctx):
    present = [i for i in range(len(ctx.node.inputs)) if ctx.has_input(i)]
    if not present:
        raise ctx.error("needs at least one input")
    shapes = [ctx.shape(i) for i in present]
    if len({ctx.type(i).dtype for i in present}) > 1:
        raise ctx.error("inputs must share one element type")
    if not shapes[0]:
        raise ctx.error("cannot concatenate scalars (rank 0)")
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
    if not data:
        raise ctx.error("data must have rank >= 1")
    axis = normalize_axis(ctx, ctx.attr("axis"), len(data))
    if ctx.type(1).dtype not in INDEX:
        raise ctx.error("indices must be int32 or int64")
    return [_t(ctx, data[:axis] + idx + data[axis + 1:])]


def gather_elements_axis(ctx: NodeContext, data: tuple, idx: int = 1) -> int:
    """GatherElements' axis, with indices of data's rank and no larger than data off the axis."""
    indices = ctx.shape(idx)
    if not data or len(indices) != len(data):
        raise ctx.error(f"indices {indices} must have the rank of data {data} (>= 1)")
    if ctx.type(idx).dtype not in INDEX:
        raise ctx.error("indices must be int32 or int64")
    axis = normalize_axis(ctx, ctx.attr("axis"), len(data))
    if any(i > d for k, (i, d) in enumerate(zip(indices, data)) if k != axis):
        raise ctx.error(f"indices {indices} are larger than data {data} off axis {axis}")
    return axis


def _gather_elements(ctx):
    gather_elements_axis(ctx, ctx.shape(0))
    return [_t(ctx, ctx.shape(1))]


def _gather_elements_vjp(g, dys):
    """onnxruntime's GatherElementsGrad(dY, Shape(data), indices): zeros, dY added at the gathered places."""
    dx = g.emit("GatherElementsGrad", [dys[0], g.shape_of(g.x(0)), g.x(1)], {"axis": g.attr("axis")}, MS)
    return [dx, None]


def _gather_elements_grad(ctx):
    shape = tuple(int(d) for d in ctx.const(1, "shape").reshape(-1))
    gather_elements_axis(ctx, shape, idx=2)
    _grad_of(ctx, 0, TensorType(ctx.type(0).dtype, ctx.shape(2)), "GatherElements output")
    return [TensorType(ctx.type(0).dtype, shape)]


SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")


def scatter_reduction(ctx) -> str:
    """ScatterElements' reduction; Scatter (opsets 9-10, ScatterElements under its first name) has none."""
    return "none" if ctx.node.op_type == "Scatter" else ctx.attr("reduction")


def _scatter_elements(ctx):
    data = ctx.shape(0)
    gather_elements_axis(ctx, data)
    if ctx.shape(2) != ctx.shape(1) or ctx.type(2).dtype != ctx.type(0).dtype:
        raise ctx.error(f"updates {ctx.type(2)} must have the indices' shape {ctx.shape(1)} and data's element type")
    return [ctx.type(0)]


def _scatter_elements_vjp(g, dys):
    """reduction none: d data = dY where nothing was written (ScatterElements of zeros), d updates = dY gathered
    at the indices; add: d data = dY, d updates the same gather. mul/max/min: no gradient rule."""
    reduction = scatter_reduction(g)
    if reduction not in ("none", "add"):
        raise g.error(f"ScatterElements with reduction '{reduction}' has no gradient rule (none, add)")
    dx = dys[0]
    if reduction == "none" and g.needs[0]:
        zeros = g.emit("ConstantOfShape", [g.shape_of(g.x(2))], {"value": np.zeros(1, g.in_types[2].dtype)})
        dx = g.emit("ScatterElements", [dys[0], g.x(1), zeros], {"axis": g.attr("axis")})
    dupdates = g.emit("GatherElements", [dys[0], g.x(1)], {"axis": g.attr("axis")}) if g.needs[2] else None
    return [dx if g.needs[0] else None, None, dupdates]


def slice_spec(ctx: NodeContext) -> tuple[slice, ...]:
    """Python slices for Slice's starts/ends/axes/steps, clamped as the ONNX spec says."""
    shape = ctx.shape(0)
    starts = [int(v) for v in ctx.const(1, "starts").reshape(-1)]
    ends = [int(v) for v in ctx.const(2, "ends").reshape(-1)]
    axes = ctx.const(3, "axes", None)
    axes = list(range(len(starts))) if axes is None else [normalize_axis(ctx, int(a), len(shape))
                                                          for a in axes.reshape(-1)]
    steps = ctx.const(4, "steps", None)
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps.reshape(-1)]
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.error(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} must have one entry "
                        "per sliced axis")
    if len(set(axes)) != len(axes):
        raise ctx.error(f"axes {axes} repeat an axis")
    spec = [slice(None)] * len(shape)
    for a, s, e, st in zip(axes, starts, ends, steps):
        if st == 0:
            raise ctx.error("Slice steps must be nonzero")
        dim = shape[a]
        s, e = max(min(s, 2**62), -2**62), max(min(e, 2**62), -2**62)
        s = s + dim if s < 0 else s
        e = e + dim if e < 0 else e
        if st > 0:      # clamp starts and ends to [0, dim]
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
        else:           # starts to [0, dim - 1], ends to [-1, dim - 1]; -1 means "through index 0"
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
            if s < 0:   # dim == 0: nothing to take
                s, e = 0, 0
        spec[a] = slice(s, e if e >= 0 else None, st)
    return tuple(spec)


def _slice(ctx):
    shape = ctx.shape(0)
    return [_t(ctx, [len(range(*sl.indices(d))) for sl, d in zip(slice_spec(ctx), shape)])]


def split_sizes(ctx: NodeContext) -> list[int]:
    shape = ctx.shape(0)
    axis = normalize_axis(ctx, ctx.attr("axis"), len(shape))
    n = len(ctx.node.outputs)
    split = ctx.attr("split")
    if split is None and ctx.has_input(1):
        split = ctx.const(1, "split").reshape(-1)
    if split is not None:
        split = [int(s) for s in split]
        if sum(split) != shape[axis] or len(split) != n or min(split, default=0) < 0:
            raise ctx.error(f"split {split} does not cover axis {axis} of size {shape[axis]} in {n} outputs")
        return split
    num = ctx.attr("num_outputs")
    if num is not None and int(num) != n:
        raise ctx.error(f"num_outputs {num} differs from the node's {n} outputs")
    if n < 1:
        raise ctx.error("needs at least one output")
    chunk = -(-shape[axis] // n)     # ceil: every chunk but the last has this size, the last may be smaller
    sizes = [min(chunk, shape[axis] - i * chunk) for i in range(n)]
    if min(sizes) < 0:
        raise ctx.error(f"axis {axis} of size {shape[axis]} cannot be split into {n} parts")
    return sizes


def _split(ctx):
    shape = ctx.shape(0)
    axis = normalize_axis(ctx, ctx.attr("axis"), len(shape))
    return [_t(ctx, shape[:axis] + (s,) + shape[axis + 1:]) for s in split_sizes(ctx)]


def transpose_perm(ctx) -> tuple[int, ...]:
    rank = len(ctx.shape(0))
    perm = ctx.attr("perm")
    perm = tuple(range(rank))[::-1] if perm is None else perm
    if sorted(perm) != list(range(rank)):
        raise ctx.error(f"perm {perm} is not a permutation of {rank} axes")
    return tuple(perm)


def _transpose(ctx):
    shape = ctx.shape(0)
    return [_t(ctx, [shape[p] for p in transpose_perm(ctx)])]


def pad_widths(ctx: NodeContext) -> list[tuple[int, int]]:
    rank = len(ctx.shape(0))
    pads = ctx.attr("pads")
    pads = [int(p) for p in (pads if pads is not None else ctx.const(1, "pads").reshape(-1))]
    axes = ctx.axes(3)
    axes = list(range(rank)) if axes is None else [normalize_axis(ctx, a, rank) for a in axes]
    if len(set(axes)) != len(axes):
        raise ctx.error(f"axes {axes} repeat an axis")
    if len(pads) != 2 * len(axes):
        raise ctx.error(f"pads {pads} must have 2 entries per padded axis ({len(axes)})")
    widths = [(0, 0)] * rank
    for k, a in enumerate(axes):
        widths[a] = (pads[k], pads[k + len(axes)])
    return widths


def _pad(ctx):
    mode = ctx.attr("mode")
    if mode == "constant" and ctx.has_input(2):
        value = ctx.const(2, "constant_value")
        if value.size > 1:
            raise ctx.error(f"constant_value must be a scalar, got shape {value.shape}")
    widths = pad_widths(ctx)
    out = [d + a + b for d, (a, b) in zip(ctx.shape(0), widths)]
    if min(out, default=0) < 0:
        raise ctx.error(f"pads {widths} crop more than the input's shape {ctx.shape(0)}")
    if mode != "constant":
        for d, (a, b) in zip(ctx.shape(0), widths):
            kept = d - max(0, -a) - max(0, -b)
            if (a > 0 or b > 0) and kept < (2 if mode == "reflect" else 1):
                raise ctx.error(f"{mode} padding of {max(a, 0)}, {max(b, 0)} needs at least "
                                f"{2 if mode == 'reflect' else 1} element(s) along the axis, got {kept}")
    return [_t(ctx, out)]


# --- Resize -----------------------------------------------------------------------------------------------

RESIZE_COORDINATES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                      "asymmetric")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
RESIZE_RANK = 4     # the kernels work on [N, C, H, W] (lower ranks get leading 1s)
RESIZE_DTYPES = ALL_NUMERIC + (np.dtype(np.uint8), np.dtype(np.int8))


def resize_geometry(ctx: NodeContext) -> tuple[list[np.float32], list[int]]:
    """Per axis of X: the scale and the output size (ONNX Resize: scales or sizes, optional axes).

    Arithmetic is float32, as onnxruntime does it: the scales are float32 tensors, and with float64 some
    products land just below an integer (0.7f * 10 = 6.99999988), flipping a floor.
    """
    f32 = np.float32
    shape = ctx.shape(0)
    rank = len(shape)
    axes = ctx.attr("axes")
    axes = list(range(rank)) if axes is None else [normalize_axis(ctx, int(a), rank) for a in axes]
    if len(set(axes)) != len(axes):
        raise ctx.error(f"axes {axes} repeat an axis")
    scales = ctx.const(2, "scales", None)
    sizes = ctx.const(3, "sizes", None)
    scales = None if scales is None or scales.size == 0 else [float(v) for v in scales.reshape(-1)]
    sizes = None if sizes is None or sizes.size == 0 else [int(v) for v in sizes.reshape(-1)]
    if (scales is None) == (sizes is None):
        raise ctx.error("exactly one of 'scales' and 'sizes' must be given")
    given = scales if scales is not None else sizes
    if len(given) != len(axes):
        what = "scales" if scales is not None else "sizes"
        raise ctx.error(f"{what} {given} must have one entry per resized axis ({len(axes)})")
    scale = [f32(1.0)] * rank
    out = list(shape)
    if scales is not None:
        for a, s in zip(axes, scales):
            if not s > 0:
                raise ctx.error(f"scales {scales} must be positive")
            scale[a] = f32(s)
            out[a] = int(np.floor(scale[a] * f32(shape[a])))
        return scale, out
    if min(sizes) < 0 or any(shape[a] == 0 for a in axes):
        raise ctx.error(f"sizes {sizes} must be >= 0 and the resized axes of X non-empty")
    for a, n in zip(axes, sizes):
        scale[a], out[a] = f32(n) / f32(shape[a]), n
    policy = ctx.attr("keep_aspect_ratio_policy")
    if policy != "stretch":
        if policy not in ("not_larger", "not_smaller"):
            raise ctx.error(f"keep_aspect_ratio_policy '{policy}' is not one of stretch, not_larger, "
                            "not_smaller")
        common = (min if policy == "not_larger" else max)(scale[a] for a in axes)
        for a in axes:
            scale[a], out[a] = common, int(np.floor(common * f32(shape[a]) + f32(0.5)))
    return scale, out


def _resize_source(mode: str, scale: np.float32, n_in: int, n_out: int) -> np.ndarray:
    """Source coordinate of every output index along one axis (float32 as in onnxruntime, not clamped)."""
    f32 = np.float32
    y = np.arange(n_out, dtype=f32)
    half = f32(0.5)
    if mode == "asymmetric":
        return y / scale
    if mode == "align_corners":
        return y * f32(n_in - 1) / f32(n_out - 1) if n_out > 1 else np.zeros(n_out, f32)
    if mode == "pytorch_half_pixel":
        return (y + half) / scale - half if n_out > 1 else np.zeros(n_out, f32)
    if mode == "half_pixel_symmetric":
        adjustment = f32(n_out) / (scale * f32(n_in))
        offset = f32(n_in) / f32(2) * (f32(1) - adjustment)
        return offset + (y + half) / scale - half
    return (y + half) / scale - half         # half_pixel


def resize_tables(ctx: NodeContext):
    """Per axis of the [N, C, H, W]-padded X: (lo, hi, weight of hi), so that an output index ``i`` reads
    ``(1 - w[i]) * X[lo[i]] + w[i] * X[hi[i]]``; nearest has ``lo == hi`` and ``w == 0``."""
    shape = ctx.shape(0)
    scale, out = resize_geometry(ctx)
    mode = ctx.attr("mode")
    coords = ctx.attr("coordinate_transformation_mode")
    nearest = ctx.attr("nearest_mode")
    pad = RESIZE_RANK - len(shape)
    tables = [(np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1))] * pad
    for n_in, n_out, s in zip(shape, out, scale):
        if n_out == n_in and np.isclose(s, 1.0):          # identity along this axis
            idx = np.arange(n_in, dtype=np.int64)
            tables.append((idx, idx, np.zeros(n_in)))
            continue
        x = _resize_source(coords, s, n_in, n_out)
        if mode == "nearest":     # x -/+ 0.5 is exact in float32 for any coordinate below 2**22
            half = np.float32(0.5)
            idx = {"round_prefer_floor": np.ceil(x - half), "round_prefer_ceil": np.floor(x + half),
                   "floor": np.floor(x), "ceil": np.ceil(x)}[nearest]
            idx = np.clip(idx, 0, n_in - 1).astype(np.int64)
            tables.append((idx, idx, np.zeros(n_out)))
        else:
            lo = np.floor(x)
            w = (x - lo).astype(np.float64)
            lo = lo.astype(np.int64)
            tables.append((np.clip(lo, 0, n_in - 1), np.clip(lo + 1, 0, n_in - 1), w))
    return tables


def _resize(ctx):
    shape = ctx.shape(0)
    mode = ctx.attr("mode")
    if mode not in ("nearest", "linear"):
        raise ctx.error(f"mode '{mode}' is not supported (nearest, linear)")
    coords = ctx.attr("coordinate_transformation_mode")
    if coords not in RESIZE_COORDINATES:
        raise ctx.error(f"coordinate_transformation_mode '{coords}' is not supported "
                        f"({', '.join(RESIZE_COORDINATES)})")
    if mode == "nearest" and ctx.attr("nearest_mode") not in NEAREST_MODES:
        raise ctx.error(f"nearest_mode '{ctx.attr('nearest_mode')}' is not one of {', '.join(NEAREST_MODES)}")
    if not 1 <= len(shape) <= RESIZE_RANK:
        raise ctx.error(f"X must have rank 1 to {RESIZE_RANK}, got {len(shape)}")
    scale, out = resize_geometry(ctx)
    if mode == "linear":
        if ctx.type(0).dtype.kind != "f":
            raise ctx.error("linear mode needs a float X")
        if ctx.attr("antialias") and min(scale) < 1:
            raise ctx.error("antialias when downsampling is not supported")
        pad = RESIZE_RANK - len(shape)
        moved = [a + pad for a, (n_in, n_out, s) in enumerate(zip(shape, out, scale))
                 if not (n_in == n_out and np.isclose(s, 1.0))]
        if any(a < RESIZE_RANK - 2 for a in moved):
            raise ctx.error(f"linear mode resizes at most the last two axes, scales {scale}")
    elif ctx.attr("antialias"):
        raise ctx.error("antialias applies to linear and cubic modes only")
    return [_t(ctx, out)]


def dropout_ratio(ctx: NodeContext) -> float:
    ratio = float(ctx.const(1, "ratio").reshape(())) if ctx.has_input(1) else 0.5
    if not 0.0 <= ratio < 1.0:
        raise ctx.error(f"ratio {ratio} must be in [0, 1)")
    return ratio


def _dropout(ctx):
    dropout_ratio(ctx)
    if ctx.has_input(2):
        ctx.const(2, "training_mode")
    return [ctx.type(0), TensorType(np.bool_, ctx.shape(0))][:max(1, len(ctx.node.outputs))]


# --- gradient rules ---------------------------------------------------------------------------------------

def _view_vjp(g, dys):
    """A view's gradient is the output gradient viewed with the input's shape."""
    return [g.emit("Reshape", [dys[0], g.shape_of(g.x(0))])] + [None] * (len(g.node.inputs) - 1)


def _transpose_vjp(g, dys):
    perm = g.attr("perm")
    perm = tuple(range(len(g.in_types[0].shape)))[::-1] if perm is None else perm
    return [g.emit("Transpose", [dys[0]], {"perm": tuple(int(p) for p in np.argsort(perm))})]


def _cast_vjp(g, dys):
    src = g.in_types[0].dtype
    if not np.issubdtype(src, np.floating):
        return [None]
    return [g.emit("Cast", [dys[0]], {"to": to_onnx(src)})]


MS = "com.microsoft"


def _has(g, i: int) -> bool:
    return i < len(g.node.inputs) and bool(g.node.inputs[i])


def _gather_vjp(g, dys):
    """onnxruntime's GatherGrad(Shape(data), indices, dY): zeros with dY's rows added at the indices."""
    dx = g.emit("GatherGrad", [g.shape_of(g.x(0)), g.x(1), dys[0]], {"axis": g.attr("axis")}, MS)
    return [dx, None]


def _slice_vjp(g, dys):
    """onnxruntime's SliceGrad(dY, Shape(data), starts, ends[, axes, steps]): zeros with dY in the slice."""
    dx = g.emit("SliceGrad", [dys[0], g.shape_of(g.x(0))] + list(g.node.inputs[1:]), {}, MS)
    return [dx] + [None] * (len(g.node.inputs) - 1)


def _concat_vjp(g, dys):
    """Split of dY along the axis at each input's size there (Shape/Slice of the inputs: folded when
    planning, so symbolic dims work); inputs that need no gradient get an omitted Split output."""
    inputs = g.node.inputs
    if len(inputs) == 1:
        return [dys[0]]
    axis = g.attr("axis") % len(g.out_types[0].shape)
    start, end = g.const([axis], np.int64, "axis"), g.const([axis + 1], np.int64, "axis_end")
    sizes = g.emit("Concat", [g.emit("Slice", [g.shape_of(x), start, end]) for x in inputs], {"axis": 0})
    outputs = [f"{g.node.name}_Grad/Split_dx{i}" if g.needs[i] else "" for i in range(len(inputs))]
    g.emit("Split", [dys[0], sizes], {"axis": axis}, outputs=outputs)
    return [o or None for o in outputs]


def split_input_gradient(g, dys) -> str:
    """A split's input gradient: Concat of the outputs' gradients; an output without one contributes zeros
    (ConstantOfShape of its Shape, folded when planning). Split and com.microsoft SplitTraining share it."""
    parts = []
    for k, (y, dy) in enumerate(zip(g.node.outputs, dys)):
        if dy is None:
            if not y:
                raise g.error(f"output {k} is omitted, so its shape for the gradient is unknown")
            dy = g.emit("ConstantOfShape", [g.shape_of(y)], {"value": np.zeros(1, g.in_types[0].dtype)})
        parts.append(dy)
    return parts[0] if len(parts) == 1 else g.emit("Concat", parts, {"axis": g.attr("axis")})


def _split_vjp(g, dys):
    return [split_input_gradient(g, dys)] + [None] * (len(g.node.inputs) - 1)


def _pad_vjp(g, dys):
    """Constant-mode Pad: dX is dY with the padding cut away (Slice) and, where pads were negative (a crop),
    zeros put back (Pad with the negated pads). The constant value is known when planning: no gradient."""
    mode = g.attr("mode")
    if mode != "constant":
        return _pad_index_vjp(g, dys, mode)
    dy, n_in = dys[0], len(g.node.inputs)
    rest = [None] * (n_in - 1)
    axes = g.x(3) if _has(g, 3) else ""
    if g.attr("pads") is not None:                     # before opset 11: pads is an attribute
        pads = np.array(g.attr("pads"), np.int64)
        dx = (_unpad(g, dy, pads, "") if pads.min(initial=0) >= 0
              else g.emit("Pad", [dy], {"mode": "constant", "pads": tuple(int(p) for p in -pads)}))
        return [dx] + rest
    pads = g.const_input(1)
    if pads is not None and pads.min(initial=0) >= 0:
        dx = _unpad(g, dy, pads.reshape(-1).astype(np.int64), axes)
    else:                                              # crops (or pads known only when planning): Pad(-pads)
        neg = g.const(-pads, np.int64, "neg_pads") if pads is not None else g.emit("Neg", [g.x(1)])
        dx = g.emit("Pad", [dy, neg, "", axes] if axes else [dy, neg])
    return [dx] + rest


def pad_source(n: int, begin: int, end: int, mode: str) -> np.ndarray:
    """The input position each output position of a reflect/edge/wrap Pad reads along one axis of size n."""
    i = np.arange(-begin, n + end, dtype=np.int64)
    if mode == "edge":
        return np.clip(i, 0, n - 1)
    if mode == "wrap":
        return i % n
    period = 2 * (n - 1)             # reflect: mirror about the first and last elements, repeatedly
    i = np.abs(i) % period if period else np.zeros_like(i)
    return np.where(i >= n, period - i, i)


def _pad_index_vjp(g, dys, mode: str):
    """reflect/edge/wrap: along each padded axis the Pad is a Gather of fixed positions (``pad_source``), so
    dX is onnxruntime's GatherGrad applied axis by axis from the last padding back to the first. The pads (and
    axes) must be known when planning, and the padded dims fixed."""
    consts = [None, g.const_input(1) if _has(g, 1) else None, None, g.const_input(3) if _has(g, 3) else None]
    if g.attr("pads") is None and consts[1] is None:
        raise g.error(f"{mode} Pad needs its pads known when planning to differentiate")
    probe = NodeContext(g.node, lookup_pad(), g.opset, list(g.in_types), consts)
    widths = pad_widths(probe)
    if any(b < 0 or e < 0 for b, e in widths):
        raise g.error(f"{mode} Pad with negative pads (crops) {widths} has no gradient rule")
    shape = list(g.in_types[0].shape)
    steps = []                       # (axis, source positions, shape before this axis is padded)
    for axis, (b, e) in enumerate(widths):
        if b or e:
            steps.append((axis, pad_source(shape[axis], b, e, mode), tuple(shape)))
            shape[axis] += b + e
    dx = dys[0]
    for axis, source, before in reversed(steps):
        shape_name, source_name = g.const(before, np.int64, "shape"), g.const(source, np.int64, "source")
        dx = g.emit("GatherGrad", [shape_name, source_name, dx], {"axis": axis}, MS)
    return [dx] + [None] * (len(g.node.inputs) - 1)


def lookup_pad() -> OpDef:
    return next(op for op in OPS if op.op_type == "Pad")


def _unpad(g, dy: str, pads: np.ndarray, axes: str) -> str:
    """Slice of dY dropping ``pads`` (all >= 0, [begins..., ends...]) along ``axes`` (all axes if "")."""
    n = len(pads) // 2
    begin, end = pads[:n], pads[n:]
    if not pads.any():
        return dy
    ends = np.where(end > 0, -end, np.iinfo(np.int64).max)
    inputs = [dy, g.const(begin, np.int64, "starts"), g.const(ends, np.int64, "ends")]
    return g.emit("Slice", inputs + ([axes] if axes else []))


def _dropout_vjp(g, dys):
    """onnxruntime's DropoutGrad(dY, mask, ratio, training_mode) = dY * mask / (1 - ratio); a Dropout known
    to drop nothing (ratio 0, or not in training mode) passes dY through."""
    rest = [None] * (len(g.node.inputs) - 1)
    ratio = g.const_input(1) if _has(g, 1) else np.array(0.5)
    training = g.const_input(2) if _has(g, 2) else np.array(False)
    if ((training is not None and not bool(np.asarray(training).reshape(())))
            or (ratio is not None and float(np.asarray(ratio).reshape(())) == 0.0)):
        return [dys[0]] + rest
    inputs = [dys[0], g.y(1)] + list(g.node.inputs[1:])
    return [g.emit("DropoutGrad", inputs, dict(g.node.attrs), MS)] + rest


def _resize_vjp(g, dys):
    """onnxruntime's ResizeGrad(dY, X, roi, scales) with Resize's attributes: every output element's
    gradient goes back to the input elements it was read (interpolated) from."""
    if _has(g, 3) and g.attr("keep_aspect_ratio_policy") != "stretch":
        raise g.error("Resize with sizes and keep_aspect_ratio_policy "
                      f"'{g.attr('keep_aspect_ratio_policy')}' has no gradient rule")
    inputs = [dys[0], g.x(0)] + [g.node.inputs[i] if _has(g, i) else "" for i in (1, 2)]
    while inputs[-1] == "":
        inputs.pop()
    return [g.emit("ResizeGrad", inputs, dict(g.node.attrs), MS)] + [None] * (len(g.node.inputs) - 1)


# --- gradient ops (com.microsoft, as onnxruntime training defines them) --------------------------------------

def _forward_view(ctx: NodeContext, x_type: TensorType, slots) -> NodeContext:
    """The forward op's context as seen from its gradient op: input 0 typed ``x_type``, then the gradient
    node's inputs ``slots`` (the forward's other inputs), so the forward's helpers apply; errors still
    name the gradient node."""
    node = ctx.node
    picked = [i if ctx.has_input(i) else None for i in slots]
    inputs = [node.inputs[0]] + [node.inputs[i] if i is not None else "" for i in picked]
    types = [x_type] + [ctx.in_types[i] if i is not None else None for i in picked]
    consts = [None] + [ctx.consts[i] if i is not None else None for i in picked]
    view = Node(node.op_type, inputs, list(node.outputs), dict(node.attrs), node.name, node.domain)
    return NodeContext(view, ctx.op, ctx.opset, types, consts, list(ctx.out_types))


def _grad_of(ctx: NodeContext, dy: int, want: TensorType, what: str):
    if tuple(ctx.shape(dy)) != tuple(want.shape) or ctx.type(dy).dtype != want.dtype:
        raise ctx.error(f"dY {ctx.type(dy)} does not match the {what} {want}")


def _gather_grad(ctx):
    shape = tuple(int(d) for d in ctx.const(0, "shape").reshape(-1))
    if not shape:
        raise ctx.error("the data shape must have rank >= 1")
    if ctx.type(1).dtype not in INDEX:
        raise ctx.error("indices must be int32 or int64")
    axis = normalize_axis(ctx, ctx.attr("axis"), len(shape))
    dy = ctx.type(2)
    _grad_of(ctx, 2, TensorType(dy.dtype, shape[:axis] + tuple(ctx.shape(1)) + shape[axis + 1:]), "Gather output")
    return [TensorType(dy.dtype, shape)]


def slice_grad_view(ctx: NodeContext) -> NodeContext:
    """SliceGrad(dY, shape, starts, ends[, axes, steps]) seen as the Slice it differentiates."""
    shape = tuple(int(d) for d in ctx.const(1, "shape").reshape(-1))
    return _forward_view(ctx, TensorType(ctx.type(0).dtype, shape), (2, 3, 4, 5))


def _slice_grad(ctx):
    fwd = slice_grad_view(ctx)
    _grad_of(ctx, 0, _slice(fwd)[0], "Slice output")
    return [fwd.type(0)]


def dropout_grad_scale(ctx: NodeContext) -> float | None:
    """DropoutGrad's factor 1 / (1 - ratio), or None when the Dropout dropped nothing (dX = dY): ratio 0,
    or training_mode false or absent (ratio defaults to 0.5, as in onnxruntime)."""
    ratio = float(ctx.const(2, "ratio").reshape(())) if ctx.has_input(2) else 0.5
    if not 0.0 <= ratio < 1.0:
        raise ctx.error(f"ratio {ratio} must be in [0, 1)")
    training = bool(np.asarray(ctx.const(3, "training_mode", np.array(False))).reshape(()))
    return 1.0 / (1.0 - ratio) if training and ratio != 0.0 else None


def _dropout_grad(ctx):
    dy, mask = ctx.type(0), ctx.type(1)
    if mask.dtype != np.bool_ or tuple(mask.shape) != tuple(dy.shape):
        raise ctx.error(f"mask {mask} must be bool shaped like dY {dy}")
    dropout_grad_scale(ctx)
    return [dy]


def resize_grad_view(ctx: NodeContext) -> NodeContext:
    """ResizeGrad(dY, X[, roi, scales]) seen as the Resize it differentiates; without scales, the sizes
    are dY's (as onnxruntime reads them)."""
    x, dy = ctx.type(1), ctx.type(0)
    fwd = _forward_view(ctx, x, (2, 3))
    scales = ctx.const(3, "scales", None)
    if scales is None or scales.size == 0:
        if ctx.attr("keep_aspect_ratio_policy") != "stretch":
            raise ctx.error("without scales, keep_aspect_ratio_policy must be 'stretch'")
        rank = len(x.shape)
        axes = ctx.attr("axes")
        axes = range(rank) if axes is None else [normalize_axis(ctx, int(a), rank) for a in axes]
        if len(dy.shape) != rank:
            raise ctx.error(f"dY {dy} and X {x} differ in rank")
        sizes = np.array([dy.shape[a] for a in axes], np.int64)
        fwd.node.inputs.append(f"{ctx.node.name}/sizes")
        fwd.in_types.append(TensorType(np.int64, sizes.shape))
        fwd.consts.append(sizes)
    return fwd


def _resize_grad(ctx):
    fwd = resize_grad_view(ctx)
    _grad_of(ctx, 0, _resize(fwd)[0], "Resize output")
    return [ctx.type(1)]


def _dropout_eval_form(node, opset):
    """Eval models run Dropout in inference mode: the training_mode input is cleared (left empty, as ORT leaves
    it: scripts check ``not node.input[2]``)."""
    inputs = list(node.inputs[:2]) + ([""] if len(node.inputs) > 2 else [])
    return type(node)(node.op_type, inputs, list(node.outputs), dict(node.attrs), node.name, node.domain)


# --- Range, Trilu, Tile ---------------------------------------------------------------------------------------

RANGE_DTYPES = tuple(np.dtype(t) for t in (np.float32, np.float64, np.int16, np.int32, np.int64))


def range_length(ctx: NodeContext) -> int:
    """ONNX Range: max(ceil((limit - start) / delta), 0) elements; the inputs must be known when planning (a
    model's arange over a sequence length computed from shapes folds to one)."""
    if len({ctx.type(i).dtype for i in range(3)}) > 1 or any(ctx.shape(i) != () for i in range(3)):
        raise ctx.error("start, limit and delta must be scalars of one element type")
    start, limit, delta = (ctx.const(i, what).item() for i, what in enumerate(("start", "limit", "delta")))
    if delta == 0:
        raise ctx.error("delta must not be 0")
    if not all(np.isfinite([start, limit, delta])):
        raise ctx.error(f"start {start}, limit {limit} and delta {delta} must be finite")
    if ctx.type(0).dtype.kind in "iu":
        return max(-((start - limit) // delta), 0)      # exact ceiling division in integers
    return max(int(np.ceil((limit - start) / delta)), 0)


def _range_fold(ctx, start, limit, delta):
    dtype = ctx.type(0).dtype
    return (start + np.arange(range_length(ctx), dtype=dtype) * delta).astype(dtype)


def trilu_mask(ctx: NodeContext) -> np.ndarray:
    """The [M, N] bool mask of the kept elements: j - i >= k (upper) or j - i <= k (lower)."""
    shape = ctx.shape(0)
    if len(shape) < 2:
        raise ctx.error(f"input must have rank >= 2, got shape {shape}")
    k = ctx.const(1, "k") if ctx.has_input(1) else np.zeros((), np.int64)
    if k.size != 1 or k.dtype != np.int64:
        raise ctx.error(f"k must be one int64, got {ctx.type(1)}")
    k = int(k.reshape(()))
    offset = np.arange(shape[-1])[None, :] - np.arange(shape[-2])[:, None]
    return offset >= k if ctx.attr("upper") else offset <= k


def _trilu(ctx):
    trilu_mask(ctx)
    return [ctx.type(0)]


def _trilu_vjp(g, dys):
    """Trilu is linear: dX = Trilu(dY) with the same k and upper."""
    inputs = [dys[0]] + ([g.x(1)] if _has(g, 1) else [])
    return [g.emit("Trilu", inputs, {"upper": g.attr("upper")}), None]


def one_hot_geometry(ctx: NodeContext) -> tuple[int, int, int, int]:
    """(outer, depth, inner, axis): the output viewed as [outer, depth, inner] around the new axis."""
    shape = tuple(ctx.shape(0))
    depth = ctx.const(1, "depth").reshape(-1)
    if depth.size != 1 or not np.isfinite(depth[0]) or int(depth[0]) < 1:
        raise ctx.error(f"depth must be one positive number, got {depth.tolist()}")
    if tuple(ctx.shape(2)) != (2,):
        raise ctx.error(f"values must be [off_value, on_value] (shape [2]), got {list(ctx.shape(2))}")
    if ctx.type(2).dtype not in ANY or ctx.type(2).dtype == np.float16:     # a jitted fill: Numba has no float16
        raise ctx.error(f"element type '{ctx.type(2).dtype}' of values is not supported by OneHot")
    axis = normalize_axis(ctx, ctx.attr("axis"), len(shape) + 1)
    return (int(np.prod(shape[:axis], dtype=np.int64)), int(depth[0]),
            int(np.prod(shape[axis:], dtype=np.int64)), axis)


def _one_hot(ctx):
    outer, depth, inner, axis = one_hot_geometry(ctx)
    shape = tuple(ctx.shape(0))
    return [TensorType(ctx.type(2).dtype, shape[:axis] + (depth,) + shape[axis:])]


def reverse_sequence_axes(ctx: NodeContext) -> tuple[int, int]:
    """(time_axis, batch_axis), checked: one is 0, the other 1; sequence_lens is int64 [batch]."""
    shape = tuple(ctx.shape(0))
    t, b = ctx.attr("time_axis"), ctx.attr("batch_axis")
    if len(shape) < 2 or {t, b} != {0, 1}:
        raise ctx.error(f"time_axis {t} and batch_axis {b} must be 0 and 1 (either way) of an input of rank >= 2, "
                        f"got shape {list(shape)}")
    lens = ctx.type(1)
    if lens.dtype != np.int64 or tuple(lens.shape) != (shape[b],):
        raise ctx.error(f"sequence_lens must be int64 [{shape[b]}] (one length per batch entry), got {lens}")
    return t, b


def _reverse_sequence(ctx):
    reverse_sequence_axes(ctx)
    return [ctx.type(0)]


def _reverse_sequence_vjp(g, dys):
    """A permutation that is its own inverse: dX = ReverseSequence(dY) with the same lengths."""
    attrs = {"time_axis": g.attr("time_axis"), "batch_axis": g.attr("batch_axis")}
    return [g.emit("ReverseSequence", [dys[0], g.x(1)], attrs), None]


def tile_repeats(ctx: NodeContext) -> tuple[int, ...]:
    shape = ctx.shape(0)
    reps = tuple(int(r) for r in ctx.const(1, "repeats").reshape(-1))
    if len(reps) != len(shape) or min(reps, default=0) < 0:
        raise ctx.error(f"repeats {list(reps)} must be {len(shape)} non-negative counts, one per axis of {shape}")
    return reps


def _tile(ctx):
    return [_t(ctx, [d * r for d, r in zip(ctx.shape(0), tile_repeats(ctx))])]


def _tile_vjp(g, dys):
    """dX = sum over the copies: dY viewed as [r0, d0, r1, d1, ...], summed over the r axes."""
    reps = [int(r) for r in g.const_input(1).reshape(-1)] if g.const_input(1) is not None else None
    if reps is None:
        raise g.error("repeats must be a constant to differentiate")
    shape = g.shape_of(g.x(0))
    parts = []
    for axis, r in enumerate(reps):
        parts.append(g.const([r], np.int64, "repeat"))
        parts.append(g.emit("Slice", [shape, g.const([axis], np.int64, "start"), g.const([axis + 1], np.int64, "end")]))
    split = g.emit("Reshape", [dys[0], g.emit("Concat", parts, {"axis": 0})])
    axes = g.const(list(range(0, 2 * len(reps), 2)), np.int64, "axes")
    return [g.emit("ReduceSum", [split, axes], {"keepdims": 0}), None]


# --- attribute schemas (ONNX's, for opsets 13 and later; older attribute forms where edgetrain reads them) -----

AXES_ATTR = {"axes": Ints()}      # Squeeze/Unsqueeze before opset 13 (later: an input)
RESIZE_ATTRS = {
    "antialias": Flag(0), "axes": Ints(),
    "coordinate_transformation_mode": String("half_pixel", RESIZE_COORDINATES + ("tf_crop_and_resize",)),
    "cubic_coeff_a": Float(-0.75), "exclude_outside": Flag(0), "extrapolation_value": Float(0.0),
    "keep_aspect_ratio_policy": String("stretch", ("stretch", "not_larger", "not_smaller")),
    "mode": String("nearest", ("nearest", "linear", "cubic")), "nearest_mode": String("round_prefer_floor", NEAREST_MODES),
}
DROPOUT_ATTRS = {"seed": Int()}


OPS = OPS_FOLD + (
    OpDef("Cast", _cast, since=19, kernel="tensor.cast", dtypes=ANY, vjp=_cast_vjp, workspace=_cast_workspace,
          attrs={"saturate": Flag(1), "to": Int(REQUIRED)}),
    OpDef("CastLike", _cast_like, since=19, kind="lowered", fold=lambda ctx, x, like: x.astype(ctx.type(1).dtype),
          type_inputs=(1,),
          dtypes=ANY, vjp=_cast_like_vjp, attrs={"saturate": Flag(1)},
          doc="lowered to Cast to the element type of input 1 (plan/lower.py)"),
    OpDef("Concat", _concat, kernel="tensor.concat", dtypes=ANY, vjp=_concat_vjp, attrs={"axis": Int(REQUIRED)}),
    OpDef("Dropout", _dropout, kernel="tensor.dropout", deterministic=False, attrs=DROPOUT_ATTRS,
          workspace=lambda ctx: [TensorType(np.float32, ctx.shape(0))], vjp=_dropout_vjp, grad_outputs=2,
          eval_form=_dropout_eval_form,
          doc="training mode with ratio > 0; inference mode is lowered to a view"),
    OpDef("DropoutGrad", _dropout_grad, domain=MS, since=1, kernel="tensor.dropout_grad", attrs=DROPOUT_ATTRS,
          doc="inputs dY, mask[, ratio, training_mode]: dX = dY * mask / (1 - ratio) in training mode, else dY"),
    OpDef("Expand", _expand, kernel="tensor.expand", dtypes=ANY, vjp=lambda g, dys: [g.unbroadcast(dys[0], 0), None]),
    OpDef("Flatten", _flatten, kind="alias", dtypes=ANY, vjp=_view_vjp, attrs={"axis": Int(1)}),
    OpDef("Gather", _gather, kernel="tensor.gather", dtypes=ANY, vjp=_gather_vjp, attrs={"axis": Int(0)}),
    OpDef("GatherElements", _gather_elements, since=13, kernel="tensor.gather_elements", dtypes=ANY,
          vjp=_gather_elements_vjp, attrs={"axis": Int(0)}),
    OpDef("GatherElementsGrad", _gather_elements_grad, domain=MS, since=1, kernel="tensor.gather_elements_grad",
          attrs={"axis": Int(0)}, doc="inputs dY, shape, indices: zeros of shape, dY added where GatherElements read"),
    OpDef("GatherGrad", _gather_grad, domain=MS, since=1, kernel="tensor.gather_grad", type_input=2,
          attrs={"axis": Int(0)},
          doc="inputs shape, indices, dY; attribute axis: zeros of shape, dY's rows added at the indices"),
    OpDef("Identity", _identity, since=19, kind="alias", dtypes=ANY, vjp=lambda g, dys: [dys[0]]),
    OpDef("OneHot", _one_hot, since=11, kernel="tensor.one_hot", dtypes=ALL_NUMERIC,
          attrs={"axis": Int(-1)},
          doc="depth known when planning; indices outside [-depth, depth) give all off_value, as ONNX says"),
    OpDef("Pad", _pad, since=19, kernel="tensor.pad", dtypes=ANY, vjp=_pad_vjp,
          attrs={"mode": String("constant", ("constant", "reflect", "edge", "wrap")), "pads": Ints()}),
    OpDef("Range", lambda ctx: [_t(ctx, (range_length(ctx),))], since=11, kind="fold", dtypes=RANGE_DTYPES,
          fold=_range_fold, doc="folded when planning: start, limit and delta must be known then"),
    OpDef("Reshape", _reshape, since=19, kind="alias", dtypes=ANY, vjp=_view_vjp, attrs={"allowzero": Flag(0)}),
    OpDef("Resize", _resize, since=19, kernel="tensor.resize", dtypes=RESIZE_DTYPES, vjp=_resize_vjp,
          attrs=RESIZE_ATTRS,
          doc="modes nearest and linear (up to 2 spatial axes); tf_crop_and_resize and cubic are rejected"),
    OpDef("ResizeGrad", _resize_grad, domain=MS, since=1, kernel="tensor.resize_grad", attrs=RESIZE_ATTRS,
          doc="inputs dY, X[, roi, scales] and Resize's attributes (nearest, linear): the transposed resize"),
    OpDef("ScatterElements", _scatter_elements, since=18, kernel="tensor.scatter_elements", dtypes=ANY,
          vjp=_scatter_elements_vjp, attrs={"axis": Int(0), "reduction": String("none", SCATTER_REDUCTIONS)},
          doc="a copy of data with updates written (or combined) where the indices point; repeated indices with "
              "reduction none: the last one wins"),
    OpDef("ReverseSequence", _reverse_sequence, since=10, kernel="tensor.reverse_sequence",
          dtypes=NUMERIC + (np.dtype(np.bool_),),     # a jitted copy: Numba has no float16
          vjp=_reverse_sequence_vjp, attrs={"batch_axis": Int(1), "time_axis": Int(0)},
          doc="lengths outside [0, time steps] are refused with the batch entry named"),
    OpDef("Scatter", _scatter_elements, since=9, kernel="tensor.scatter_elements", dtypes=ANY,
          vjp=_scatter_elements_vjp, attrs={"axis": Int(0)},
          doc="opsets 9-10: ScatterElements without reduction, under its first name"),
    OpDef("Slice", _slice, kernel="tensor.slice", dtypes=ANY, vjp=_slice_vjp),
    OpDef("SliceGrad", _slice_grad, domain=MS, since=1, kernel="tensor.slice_grad", dtypes=ANY,
          doc="inputs dY, shape, starts, ends[, axes, steps]: zeros of shape with dY written into the slice"),
    OpDef("Split", _split, since=18, kernel="tensor.split", dtypes=ANY, vjp=_split_vjp,
          attrs={"axis": Int(0), "num_outputs": Int(low=1), "split": Ints(low=0)}),
    OpDef("Squeeze", _squeeze, kind="alias", dtypes=ANY, vjp=_view_vjp, attrs=AXES_ATTR),
    OpDef("Tile", _tile, since=13, kernel="tensor.tile", dtypes=ANY, vjp=_tile_vjp,
          doc="copies into a [r0, d0, r1, d1, ...] view of Y; gradient: ReduceSum over the copies"),
    OpDef("Transpose", _transpose, kernel="tensor.transpose", dtypes=ANY, vjp=_transpose_vjp, attrs={"perm": Ints()}),
    OpDef("Trilu", _trilu, since=14, kernel="tensor.trilu", dtypes=ANY, vjp=_trilu_vjp, attrs={"upper": Flag(1)},
          doc="k (optional input) must be known when planning"),
    OpDef("Unsqueeze", _unsqueeze, kind="alias", dtypes=ANY, vjp=_view_vjp, attrs=AXES_ATTR),
)
