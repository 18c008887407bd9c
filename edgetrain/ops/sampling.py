"""GridSample (2-D: X [N, C, H, W] read at the normalized positions of grid [N, Ho, Wo, 2]) and its gradient
op GridSampleGrad.

onnxruntime 1.19 has no gradient op for GridSample, so GridSampleGrad(dY, X, grid) -> (dX, dgrid) lives in the
``ai.edgetrain`` domain (the last resort DESIGN.md allows): ORT 1.19 cannot train a model holding it.
"""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from .attrs import Flag, String
from .base import NodeContext, OpDef
from .softmax import EDGETRAIN

DOMAIN = EDGETRAIN   # edgetrain's own ops, as NegativeLogLikelihoodLossGrad
# opset 16 spells the modes bilinear / bicubic, opset 20 linear / cubic: both map to one code
MODES = {"bilinear": 0, "linear": 0, "nearest": 1, "bicubic": 2, "cubic": 2}
PADDINGS = {"zeros": 0, "border": 1, "reflection": 2}
ATTRS = {"mode": String("linear", tuple(MODES)), "padding_mode": String("zeros", tuple(PADDINGS)),
         "align_corners": Flag(0)}


def geometry(ctx: NodeContext, x: int = 0, grid: int = 1) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """X's and grid's shapes, checked: 2-D sampling only, grid [N, Ho, Wo, 2] with X's N and element type."""
    xs, gs = tuple(ctx.shape(x)), tuple(ctx.shape(grid))
    if len(xs) != 4:
        raise ctx.error(f"X {list(xs)} must be [N, C, H, W]: edgetrain samples 2-D grids only")
    if len(gs) != 4 or gs[0] != xs[0] or gs[3] != 2:
        raise ctx.error(f"grid {list(gs)} must be [N, H_out, W_out, 2] with X's N = {xs[0]}")
    if ctx.type(grid).dtype != ctx.type(x).dtype:
        raise ctx.error(f"grid's element type {ctx.type(grid).dtype} must be X's {ctx.type(x).dtype}")
    return xs, gs


def codes(ctx: NodeContext) -> tuple[int, int, int]:
    return MODES[ctx.attr("mode")], PADDINGS[ctx.attr("padding_mode")], int(ctx.attr("align_corners"))


def _grid_sample(ctx: NodeContext):
    xs, gs = geometry(ctx)
    return [TensorType(ctx.type(0).dtype, (xs[0], xs[1], gs[1], gs[2]))]


def _grid_sample_vjp(g, dys):
    """dX scatters dY with the interpolation weights; dgrid = sum_c dY * (d weights / d grid) . X (zero for
    nearest): one GridSampleGrad node gives both."""
    attrs = {k: g.attr(k) for k in ATTRS}
    dx, dgrid = g.emit("GridSampleGrad", [dys[0], g.x(0), g.x(1)], attrs, DOMAIN, n_out=2)
    return [dx if g.needs[0] else None, dgrid if g.needs[1] else None]


def _grid_sample_grad(ctx: NodeContext):
    xs, gs = geometry(ctx, 1, 2)
    if tuple(ctx.shape(0)) != (xs[0], xs[1], gs[1], gs[2]) or ctx.type(0).dtype != ctx.type(1).dtype:
        raise ctx.error(f"dY {ctx.type(0)} must match GridSample's output [{xs[0]}, {xs[1]}, {gs[1]}, {gs[2]}]")
    return [ctx.type(1), ctx.type(2)]


OPS = (
    OpDef("GridSample", _grid_sample, since=22, kernel="sampling.grid_sample", vjp=_grid_sample_vjp, attrs=ATTRS,
          doc="2-D; modes linear/nearest/cubic (bilinear/bicubic), padding zeros/border/reflection, align_corners"),
    OpDef("GridSampleGrad", _grid_sample_grad, domain=DOMAIN, since=1, kernel="sampling.grid_sample_grad",
          attrs=ATTRS, doc="inputs dY, X, grid; outputs dX, dgrid (edgetrain's own: onnxruntime has none)"),
)
