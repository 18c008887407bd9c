"""Data-movement kernels: numpy copies into preallocated outputs; Gather, GatherGrad and Resize(Grad) are
jitted loops.

Launchers receive ``(inputs..., outputs..., workspaces...)`` with one slot per node input and output.
"""
from __future__ import annotations

import builtins

import numpy as np

from edgetrain import config
from edgetrain.ir.dtypes import ONNX_TO_NUMPY, SATURATING, ml_dtypes
from edgetrain.ops.tensor import (
    RESIZE_RANK,
    dropout_grad_scale,
    dropout_ratio,
    gather_elements_axis,
    one_hot_geometry,
    pad_widths,
    resize_grad_view,
    resize_tables,
    reverse_sequence_axes,
    scatter_reduction,
    slice_grad_view,
    slice_spec,
    split_sizes,
    tile_repeats,
    transpose_perm,
    trilu_mask,
)

from . import bindable, checked
from ._jit import jit


def cast(ctx):
    """numpy's conversion (float16: round to nearest even; the ml_dtypes types as onnx's reference converts). A
    result carried in float32 (plan/widen.py) is rounded through the scratch of its own type the op's workspace
    rule asks for."""
    if ctx.op.workspace(ctx):
        to = ctx.attr("to")
        if to in SATURATING and ctx.attr("saturate"):
            limit = float(ml_dtypes.finfo(ONNX_TO_NUMPY[to]).max)

            def run_saturated(x, y, rounded):
                np.clip(x, -limit, limit, out=y)      # inf too, as ONNX's saturation table says; NaN stays
                np.copyto(rounded, y, casting="unsafe")
                np.copyto(y, rounded)
            return run_saturated

        def run(x, y, rounded):
            with np.errstate(over="ignore"):    # past float16's range is inf, as ONNX says: no warning
                np.copyto(rounded, x, casting="unsafe")
            np.copyto(y, rounded)
        return run

    def run(x, y):
        np.copyto(y, x, casting="unsafe")
    return run


def concat(ctx):
    axis = ctx.attr("axis") % len(ctx.out(0).shape)

    def run(*args):
        np.concatenate([a for a in args[:-1] if a is not None], axis=axis, out=args[-1])
    return run


def expand(ctx):
    shape = ctx.out(0).shape

    @bindable
    def bind(x, _shape, y):
        return np.copyto, (y, np.broadcast_to(x, shape))     # the broadcast view made once, not every step
    return bind


def gather(ctx):
    """Gather as rows of a [outer, size, inner] view; an index outside [-size, size) raises InputError."""
    data = ctx.shape(0)
    axis = ctx.attr("axis") % len(data)
    size = data[axis]
    outer, inner = int(np.prod(data[:axis], dtype=np.int64)), int(np.prod(data[axis + 1:], dtype=np.int64))
    n = ctx.type(1).size
    allowed = f"an index in [{-size}, {size}) (axis {axis} of data {list(data)})"

    @bindable
    def bind(x, idx, y):
        call = (x.reshape(outer, size, inner), idx.reshape(n), y.reshape(outer, n, inner))
        return checked(_gather, call, ctx, 1, idx, allowed)
    return bind


@jit
def _gather(x, idx, y):
    """y[o, k] = x[o, idx[k]]; returns -1, or the first k whose index is out of range (checked before use)."""
    size = x.shape[1]
    for k in range(idx.shape[0]):
        j = idx[k]
        if j < -size or j >= size:
            return k
        j = j + size if j < 0 else j
        for o in range(x.shape[0]):
            y[o, k, :] = x[o, j, :]
    return -1


def gather_grad(ctx):
    """GatherGrad: zeros, then each dY row added at its index (repeated indices accumulate); an index outside
    [-size, size) raises InputError."""
    data = tuple(int(d) for d in ctx.const(0, "shape").reshape(-1))
    axis = ctx.attr("axis") % len(data)
    size = data[axis]
    outer, inner = int(np.prod(data[:axis], dtype=np.int64)), int(np.prod(data[axis + 1:], dtype=np.int64))
    n = ctx.type(1).size
    allowed = f"an index in [{-size}, {size}) (axis {axis} of shape {list(data)})"

    @bindable
    def bind(_shape, idx, dy, dx):
        return checked(_gather_grad, (dy.reshape(outer, n, inner), idx.reshape(n), dx.reshape(outer, size, inner)),
                       ctx, 1, idx, allowed)
    return bind


@jit
def _gather_grad(dy, idx, dx):
    """dx = 0, then dx[o, idx[k]] += dy[o, k]; returns -1, or the first k whose index is out of range."""
    size = dx.shape[1]
    for o in range(dx.shape[0]):
        for j in range(size):
            for m in range(dx.shape[2]):
                dx[o, j, m] = 0
    for k in range(idx.shape[0]):
        j = idx[k]
        if j < -size or j >= size:
            return k
        j = j + size if j < 0 else j
        for o in range(dx.shape[0]):
            for m in range(dx.shape[2]):
                dx[o, j, m] += dy[o, k, m]
    return -1


def slice_grad(ctx):
    """SliceGrad: zeros with dY written into the slice of dX."""
    spec = slice_spec(slice_grad_view(ctx))

    def run(dy, *rest):
        dx = rest[-1]
        dx.fill(0)
        np.copyto(dx[spec], dy)
    return run


def slice(ctx):  # noqa: A001 (named after the op)
    spec = slice_spec(ctx)

    def run(x, *rest):
        np.copyto(rest[-1], x[spec])
    return run


def split(ctx):
    axis = ctx.attr("axis") % len(ctx.shape(0))
    bounds = np.cumsum([0] + split_sizes(ctx))
    parts = [(builtins.slice(None),) * axis + (builtins.slice(int(a), int(b)),) for a, b in zip(bounds, bounds[1:])]
    n_in = len(ctx.node.inputs)

    def run(*args):
        for out, part in zip(args[n_in:], parts):
            if out is not None:
                np.copyto(out, args[0][part])
    return run


def _element_geometry(indices: tuple, data: tuple):
    """(indices' shape, data's strides in elements) as int64 arrays for the element-wise gather/scatter loops."""
    strides = np.cumprod((1,) + tuple(data[:0:-1]), dtype=np.int64)[::-1].copy()
    return np.array(indices, np.int64), strides


def gather_elements(ctx):
    """y[i...] = data[i... with i[axis] replaced by indices[i...]]; an index outside [-n, n) raises InputError."""
    data = ctx.shape(0)
    axis = gather_elements_axis(ctx, data)
    ishape, strides = _element_geometry(ctx.shape(1), data)
    allowed = f"an index in [{-data[axis]}, {data[axis]}) (axis {axis} of data {list(data)})"

    def run(x, idx, y):
        bad = _gather_elements(x.reshape(-1), idx.reshape(-1), y.reshape(-1), ishape, strides, axis, data[axis])
        if bad >= 0:
            raise ctx.bad_value(1, idx, bad, allowed)
    return run


def gather_elements_grad(ctx):
    """dX = 0, then dX[i... with i[axis] = indices[i...]] += dY[i...]; bad indices raise InputError."""
    data = tuple(int(d) for d in ctx.const(1, "shape").reshape(-1))
    axis = gather_elements_axis(ctx, data, idx=2)
    ishape, strides = _element_geometry(ctx.shape(2), data)
    allowed = f"an index in [{-data[axis]}, {data[axis]}) (axis {axis} of data {list(data)})"

    def run(dy, _shape, idx, dx):
        dx.fill(0)
        bad = _scatter_add_elements(dy.reshape(-1), idx.reshape(-1), dx.reshape(-1), ishape, strides, axis, data[axis])
        if bad >= 0:
            raise ctx.bad_value(2, idx, bad, allowed)
    return run


SCATTER_CODES = {"none": 0, "add": 1, "mul": 2, "max": 3, "min": 4}


def scatter_elements(ctx):
    """Y = data, then Y[where indices point] = updates (or combined by the reduction); bad indices raise
    InputError before anything is written past them (Y is the node's own output, never state)."""
    data = ctx.shape(0)
    axis = gather_elements_axis(ctx, data)
    ishape, strides = _element_geometry(ctx.shape(1), data)
    code = SCATTER_CODES[scatter_reduction(ctx)]
    allowed = f"an index in [{-data[axis]}, {data[axis]}) (axis {axis} of data {list(data)})"

    def run(x, idx, updates, y):
        np.copyto(y, x)
        bad = _scatter_elements(updates.reshape(-1), idx.reshape(-1), y.reshape(-1), ishape, strides, axis,
                                data[axis], code)
        if bad >= 0:
            raise ctx.bad_value(1, idx, bad, allowed)
    return run


@jit
def _scatter_elements(updates, idx, y, ishape, strides, axis, n, code):
    for k in range(idx.shape[0]):
        offset = _element_offset(k, idx, ishape, strides, axis, n)
        if offset < 0:
            return k
        u = updates[k]
        if code == 0:
            y[offset] = u
        elif code == 1:
            y[offset] += u
        elif code == 2:
            y[offset] *= u
        elif code == 3:
            y[offset] = max(y[offset], u)
        else:
            y[offset] = min(y[offset], u)
    return -1


@jit
def _element_offset(k, idx, ishape, strides, axis, n):
    """The data offset GatherElements reads for flat index position ``k``, or -1 if its index is out of range."""
    j = idx[k]
    if j < -n or j >= n:
        return -1
    j = j + n if j < 0 else j
    offset, rest = 0, k
    for d in range(ishape.shape[0] - 1, -1, -1):
        m = rest % ishape[d]
        rest //= ishape[d]
        offset += (j if d == axis else m) * strides[d]
    return offset


@jit
def _gather_elements(x, idx, y, ishape, strides, axis, n):
    for k in range(idx.shape[0]):
        offset = _element_offset(k, idx, ishape, strides, axis, n)
        if offset < 0:
            return k
        y[k] = x[offset]
    return -1


@jit
def _scatter_add_elements(dy, idx, dx, ishape, strides, axis, n):
    for k in range(idx.shape[0]):
        offset = _element_offset(k, idx, ishape, strides, axis, n)
        if offset < 0:
            return k
        dx[offset] += dy[k]
    return -1


def one_hot(ctx):
    outer, depth, inner, _ = one_hot_geometry(ctx)

    def run(idx, _depth, values, y):
        _one_hot(idx.reshape(outer, inner), values, y.reshape(outer, depth, inner))
    return run


@jit
def _one_hot(idx, values, y):
    """y[o, :, i] = off, with on at idx[o, i] (counted back from depth if negative); an index outside
    [-depth, depth) leaves the row off, as ONNX says (the range check is what keeps the write in y)."""
    outer, depth, inner = y.shape
    y[:] = values[0]
    for o in range(outer):
        for i in range(inner):
            x = idx[o, i]
            if not (x > -depth - 1 and x < depth):    # NaN and huge floats too, before any int conversion
                continue
            v = int(x)                                # float indices truncate, as a cast to int64
            if v < 0:
                v += depth
            if v >= 0 and v < depth:
                y[o, v, i] = values[1]


def reverse_sequence(ctx):
    t_axis, b_axis = reverse_sequence_axes(ctx)
    shape = ctx.shape(0)
    steps, inner = shape[t_axis], int(np.prod(shape[2:], dtype=np.int64))
    allowed = f"a length in [0, {steps}] (the time steps)"

    def run(x, lens, y):
        view = (shape[0], shape[1], inner)
        bad = _reverse_sequence(x.reshape(view), lens, y.reshape(view), t_axis)
        if bad >= 0:
            raise ctx.bad_value(1, lens, bad, allowed)
    return run


@jit
def _reverse_sequence(x, lens, y, t_axis):
    """y[.., t, b, ..] = x[.., lens[b] - 1 - t, b, ..] for t < lens[b], else x; returns the first batch entry
    whose length is outside [0, steps] (nothing written for it or after), or -1."""
    steps = x.shape[t_axis]
    for b in range(lens.shape[0]):
        n = lens[b]
        if n < 0 or n > steps:
            return b
        for t in range(steps):
            src = n - 1 - t if t < n else t
            if t_axis == 0:
                y[t, b] = x[src, b]
            else:
                y[b, t] = x[b, src]
    return -1


def tile(ctx):
    """Y viewed as [r0, d0, r1, d1, ...] takes X viewed as [1, d0, 1, d1, ...] by broadcasting: no copy of X."""
    shape, reps = ctx.shape(0), tile_repeats(ctx)
    split = tuple(v for r, d in zip(reps, shape) for v in (r, d))
    ones = tuple(v for d in shape for v in (1, d))

    def run(x, _repeats, y):
        np.copyto(y.reshape(split), x.reshape(ones))
    return run


def trilu(ctx):
    """Zeros, then X where the mask keeps it (NaN outside the triangle becomes 0, as ONNX says)."""
    mask = trilu_mask(ctx)

    def run(x, *args):
        y = args[-1]
        y.fill(0)
        np.copyto(y, x, where=mask)
    return run


def transpose(ctx):
    perm = transpose_perm(ctx)

    @bindable
    def bind(x, y):
        return np.copyto, (y, x.transpose(perm))
    return bind


def pad(ctx):
    """Negative pads crop first; reflect / edge / wrap then fill each padded axis in turn from values
    already in ``y`` (numpy.pad's order), one slice copy per padded position, so nothing is allocated."""
    widths = pad_widths(ctx)
    mode = ctx.attr("mode")
    shape = ctx.shape(0)
    src = tuple(builtins.slice(max(0, -a), d - max(0, -b)) for (a, b), d in zip(widths, shape))
    dst = tuple(builtins.slice(max(0, a), max(0, a) + s.stop - s.start) for (a, _), s in zip(widths, src))
    value = ctx.const(2, "constant_value", np.zeros(())) if mode == "constant" else None
    value = value.reshape(-1)[0] if value is not None and value.size else 0
    n_in = len(ctx.node.inputs)
    copies = []          # (destination index, source index) into y, in order
    if mode != "constant":
        np_mode = {"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode]
        for axis, ((a, b), s) in enumerate(zip(widths, dst)):
            before, after, kept = max(0, a), max(0, b), s.stop - s.start
            if not before and not after:
                continue
            source = np.pad(np.arange(kept), (before, after), mode=np_mode) + before   # position in y
            # axes before this one are complete, later ones only hold their kept middle so far
            lead, trail = (builtins.slice(None),) * axis, dst[axis + 1:]
            for j in list(range(before)) + list(range(before + kept, before + kept + after)):
                copies.append((lead + (j,) + trail, lead + (int(source[j]),) + trail))

    def run(*args):
        x, y = args[0], args[n_in]
        if mode == "constant":
            y.fill(value)
        np.copyto(y[dst], x[src])
        for d, s in copies:
            np.copyto(y[d], y[s])
    return run


def dropout(ctx):
    """Training-mode Dropout: mask = (U[0,1) >= ratio), y = x * mask / (1 - ratio)."""
    ratio = dropout_ratio(ctx)
    scale = 1.0 / (1.0 - ratio)
    seed = ctx.attr("seed")
    rng = np.random.default_rng(seed if seed is not None else config.op_seed(ctx.node.name))
    n_in = len(ctx.node.inputs)
    has_mask = len(ctx.node.outputs) > 1 and bool(ctx.node.outputs[1])

    def run(*args):
        x, y, noise = args[0], args[n_in], args[-1]
        rng.random(out=noise, dtype=np.float32)
        if has_mask:
            keep = np.greater_equal(noise, ratio, out=args[n_in + 1])
        else:   # the mask as 0.0 / 1.0 in the noise buffer itself
            keep = np.greater_equal(noise, np.float32(ratio), out=noise)
        np.multiply(x, keep, out=y)
        np.multiply(y, y.dtype.type(scale), out=y)
    return run


def dropout_grad(ctx):
    """DropoutGrad: dX = dY * mask / (1 - ratio), or a copy of dY when the Dropout dropped nothing."""
    scale = dropout_grad_scale(ctx)
    scale = None if scale is None else ctx.type(0).dtype.type(scale)
    n_in = len(ctx.node.inputs)

    def run(*args):
        dy, mask, dx = args[0], args[1], args[n_in]
        if scale is None:
            np.copyto(dx, dy)
        else:
            np.multiply(dy, mask, out=dx)
            np.multiply(dx, scale, out=dx)
    return run


@jit
def _resize_nearest(x, y, i0, i1, i2, i3):
    for a in range(y.shape[0]):
        for b in range(y.shape[1]):
            for c in range(y.shape[2]):
                for d in range(y.shape[3]):
                    y[a, b, c, d] = x[i0[a], i1[b], i2[c], i3[d]]


@jit
def _resize_bilinear(x, y, i0, i1, lo2, hi2, w2, lo3, hi3, w3):
    """Linear along the last two axes (the first two map index to index), computed in float64."""
    for a in range(y.shape[0]):
        p = i0[a]
        for b in range(y.shape[1]):
            q = i1[b]
            for c in range(y.shape[2]):
                l2, h2, v = lo2[c], hi2[c], w2[c]
                for d in range(y.shape[3]):
                    l3, h3, u = lo3[d], hi3[d], w3[d]
                    top = x[p, q, l2, l3] * (1.0 - u) + x[p, q, l2, h3] * u
                    bottom = x[p, q, h2, l3] * (1.0 - u) + x[p, q, h2, h3] * u
                    y[a, b, c, d] = top * (1.0 - v) + bottom * v


def resize(ctx):
    """Resize (nearest, or linear over the last two axes) by per-axis index / weight tables from planning."""
    tables = resize_tables(ctx)
    pad = RESIZE_RANK - len(ctx.shape(0))
    in4 = (1,) * pad + tuple(ctx.shape(0))
    out4 = (1,) * pad + tuple(ctx.out(0).shape)
    linear = ctx.attr("mode") == "linear"
    n_in = len(ctx.node.inputs)
    (i0, _, _), (i1, _, _), (lo2, hi2, w2), (lo3, hi3, w3) = tables

    def run(*args):
        x, y = args[0].reshape(in4), args[n_in].reshape(out4)
        if linear:
            _resize_bilinear(x, y, i0, i1, lo2, hi2, w2, lo3, hi3, w3)
        else:
            _resize_nearest(x, y, i0, i1, lo2, lo3)
    return run


@jit
def _resize_nearest_grad(dy, dx, i0, i1, i2, i3):
    dx[:] = 0
    for a in range(dy.shape[0]):
        for b in range(dy.shape[1]):
            for c in range(dy.shape[2]):
                for d in range(dy.shape[3]):
                    dx[i0[a], i1[b], i2[c], i3[d]] += dy[a, b, c, d]


@jit
def _resize_bilinear_grad(dy, dx, i0, i1, lo2, hi2, w2, lo3, hi3, w3):
    """The transpose of ``_resize_bilinear``: each output gradient split over its four source pixels."""
    dx[:] = 0
    for a in range(dy.shape[0]):
        p = i0[a]
        for b in range(dy.shape[1]):
            q = i1[b]
            for c in range(dy.shape[2]):
                l2, h2, v = lo2[c], hi2[c], w2[c]
                for d in range(dy.shape[3]):
                    l3, h3, u = lo3[d], hi3[d], w3[d]
                    g = dy[a, b, c, d]
                    top, bottom = g * (1.0 - v), g * v
                    dx[p, q, l2, l3] += top * (1.0 - u)
                    dx[p, q, l2, h3] += top * u
                    dx[p, q, h2, l3] += bottom * (1.0 - u)
                    dx[p, q, h2, h3] += bottom * u


def resize_grad(ctx):
    """ResizeGrad: the Resize kernel transposed, from the same index / weight tables."""
    fwd = resize_grad_view(ctx)
    tables = resize_tables(fwd)
    pad = RESIZE_RANK - len(fwd.shape(0))
    in4 = (1,) * pad + tuple(fwd.shape(0))
    out4 = (1,) * pad + tuple(ctx.shape(0))
    linear = ctx.attr("mode") == "linear"
    n_in = len(ctx.node.inputs)
    (i0, _, _), (i1, _, _), (lo2, hi2, w2), (lo3, hi3, w3) = tables

    def run(*args):
        dy, dx = args[0].reshape(out4), args[n_in].reshape(in4)
        if linear:
            _resize_bilinear_grad(dy, dx, i0, i1, lo2, hi2, w2, lo3, hi3, w3)
        else:
            _resize_nearest_grad(dy, dx, i0, i1, lo2, lo3)
    return run
