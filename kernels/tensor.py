"""Data-movement kernels: numpy copies into preallocated outputs (no Numba needed for these).

Launchers receive ``(inputs..., outputs..., workspaces...)`` with one slot per node input and output.
"""
from __future__ import annotations

import builtins

import numpy as np

from edgetrain.ops.tensor import pad_widths, slice_spec, split_sizes, transpose_perm


def cast(ctx):
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

    def run(x, _shape, y):
        np.copyto(y, np.broadcast_to(x, shape))
    return run


def gather(ctx):
    axis = ctx.attr("axis", 0) % len(ctx.shape(0))
    size = ctx.shape(0)[axis]

    def run(x, idx, y):
        if idx.size and (idx.min() < -size or idx.max() >= size):
            bad = idx[(idx < -size) | (idx >= size)].reshape(-1)[0]
            raise IndexError(f"{ctx.node}: index {bad} is out of range for axis {axis} of size {size}")
        np.take(x, idx, axis=axis, out=y, mode="wrap")
    return run


def slice(ctx):  # noqa: A001 (named after the op)
    spec = slice_spec(ctx)

    def run(x, *rest):
        np.copyto(rest[-1], x[spec])
    return run


def split(ctx):
    axis = ctx.attr("axis", 0) % len(ctx.shape(0))
    bounds = np.cumsum([0] + split_sizes(ctx))
    parts = [(builtins.slice(None),) * axis + (builtins.slice(int(a), int(b)),) for a, b in zip(bounds, bounds[1:])]
    n_in = len(ctx.node.inputs)

    def run(*args):
        for out, part in zip(args[n_in:], parts):
            if out is not None:
                np.copyto(out, args[0][part])
    return run


def transpose(ctx):
    perm = transpose_perm(ctx)

    def run(x, y):
        np.copyto(y, x.transpose(perm))
    return run


def pad(ctx):
    widths = pad_widths(ctx)
    mode = ctx.attr("mode", "constant")
    shape = ctx.shape(0)
    src = tuple(builtins.slice(max(0, -a), d - max(0, -b)) for (a, b), d in zip(widths, shape))
    dst = tuple(builtins.slice(max(0, a), max(0, a) + s.stop - s.start) for (a, _), s in zip(widths, src))
    value = ctx.const(2, "constant_value", np.zeros(())) if mode == "constant" else None
    value = value.reshape(-1)[0] if value is not None and value.size else 0
    n_in = len(ctx.node.inputs)

    def run(*args):
        x, y = args[0], args[n_in]
        if mode == "constant":
            y.fill(value)
            np.copyto(y[dst], x[src])
        else:  # reflect / edge / wrap go through numpy's pad, which allocates; rare in training graphs
            np.copyto(y, np.pad(x, widths, mode=mode))
    return run


def dropout(ctx):
    """Training-mode Dropout: mask = (U[0,1) >= ratio), y = x * mask / (1 - ratio)."""
    ratio = float(ctx.const(1, "ratio").reshape(())) if ctx.has_input(1) else 0.5
    rng = np.random.default_rng(ctx.attr("seed", None))
    n_in = len(ctx.node.inputs)
    has_mask = len(ctx.node.outputs) > 1 and bool(ctx.node.outputs[1])

    def run(*args):
        x, y, noise = args[0], args[n_in], args[-1]
        rng.random(out=noise)
        keep = noise >= ratio if not has_mask else np.greater_equal(noise, ratio, out=args[n_in + 1])
        np.multiply(x, keep, out=y)
        np.multiply(y, y.dtype.type(1.0 / (1.0 - ratio)), out=y)
    return run
