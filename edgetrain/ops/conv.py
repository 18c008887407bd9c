"""Conv (1-D and 2-D, any group count). Its bias is split off by ``plan.lower`` into an element-wise Add,
so at runtime Conv usually has two inputs; constant folding may still run it with a bias.

``window_geometry`` is the sliding-window arithmetic (auto_pad, pads, strides, dilations, ceil_mode) that
the pooling ops share.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import TensorType
from .base import NodeContext, OpDef

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@dataclass(frozen=True)
class Window:
    """A sliding window over ``len(kernel)`` spatial dims, every field one entry per spatial dim."""
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    out: tuple[int, ...]

    def as_2d(self) -> "Window":
        """1-D windows as 2-D ones with a leading spatial dim of size 1 (kernels only handle 2-D)."""
        if len(self.kernel) == 2:
            return self
        return Window((1,) + self.kernel, (1,) + self.strides, (1,) + self.dilations, (0,) + self.pads_begin,
                      (0,) + self.pads_end, (1,) + self.out)


def _ints(ctx: NodeContext, name: str, n: int, default: int) -> tuple[int, ...]:
    value = ctx.attr(name, None)
    if value is None:
        return (default,) * n
    value = tuple(int(v) for v in value)
    if len(value) != n:
        raise ctx.error(f"attribute '{name}' {list(value)} must have {n} entries (one per spatial dim)")
    return value


def window_geometry(ctx: NodeContext, spatial: tuple[int, ...], kernel: tuple[int, ...],
                    ceil_mode: bool = False, pool: bool = False) -> Window:
    """Output size and explicit pads of a sliding window over ``spatial``, as the ONNX Conv/Pool specs say."""
    n = len(spatial)
    strides = _ints(ctx, "strides", n, 1)
    dilations = _ints(ctx, "dilations", n, 1)
    if any(k < 1 for k in kernel):
        raise ctx.error(f"kernel_shape {list(kernel)} must be positive")
    if any(s < 1 for s in strides):
        raise ctx.error(f"strides {list(strides)} must be positive")
    if any(d < 1 for d in dilations):
        raise ctx.error(f"dilations {list(dilations)} must be positive")
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad not in AUTO_PADS:
        raise ctx.error(f"auto_pad '{auto_pad}' is not one of {', '.join(AUTO_PADS)}")
    span = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations))
    if auto_pad == "NOTSET":
        pads = ctx.attr("pads", None)
        pads = (0,) * (2 * n) if pads is None else tuple(int(p) for p in pads)
        if len(pads) != 2 * n:
            raise ctx.error(f"pads {list(pads)} must have {2 * n} entries (begin and end per spatial dim)")
        if any(p < 0 for p in pads):
            raise ctx.error(f"pads {list(pads)} must not be negative")
        begin, end = pads[:n], pads[n:]
        if pool and any(p >= s for p, s in zip(pads, span + span)):
            raise ctx.error(f"pads {list(pads)} must be smaller than the (dilated) kernel {list(span)}")
        out = []
        for size, b, e, sp, st in zip(spatial, begin, end, span, strides):
            room = size + b + e - sp
            o = (-(-room // st) if ceil_mode else room // st) + 1
            if ceil_mode and (o - 1) * st >= size + b:   # the last window starts inside the input or left pad
                o -= 1
            out.append(o)
    elif auto_pad == "VALID":
        begin = end = (0,) * n
        out = [(size - sp) // st + 1 for size, sp, st in zip(spatial, span, strides)]
    else:
        out = [-(-size // st) for size, st in zip(spatial, strides)]
        total = [max(0, (o - 1) * st + sp - size) for o, st, sp, size in zip(out, strides, span, spatial)]
        if auto_pad == "SAME_UPPER":
            begin = tuple(t // 2 for t in total)
        else:
            begin = tuple(t - t // 2 for t in total)
        end = tuple(t - b for t, b in zip(total, begin))
    if any(o < 1 for o in out):
        raise ctx.error(f"the window (kernel {list(kernel)}, dilations {list(dilations)}) does not fit the "
                        f"input of spatial shape {list(spatial)} with pads {list(begin) + list(end)}: "
                        f"output size {out}")
    return Window(tuple(kernel), strides, dilations, tuple(begin), tuple(end), tuple(out))


def check_rank(ctx: NodeContext, i: int = 0) -> tuple[int, ...]:
    shape = ctx.shape(i)
    if len(shape) not in (3, 4):
        raise ctx.error(f"input {i} must be 3-D (N, C, W) or 4-D (N, C, H, W); got shape {shape} "
                        "(3-D spatial windows are not supported)")
    return shape


@dataclass(frozen=True)
class ConvGeometry:
    n: int
    c: int          # input channels
    m: int          # output channels
    group: int
    window: Window  # always 2-D (1-D convs get a leading spatial dim of size 1)
    in_hw: tuple[int, int]

    @property
    def ckk(self) -> int:
        """Rows of one image's im2col matrix: C * kh * kw."""
        return self.c * self.window.kernel[0] * self.window.kernel[1]

    @property
    def ohw(self) -> int:
        return self.window.out[0] * self.window.out[1]

    @property
    def pointwise(self) -> bool:
        """A 1x1 kernel with unit strides and no pads: the input already is the im2col matrix."""
        w = self.window
        return w.kernel == w.strides == (1, 1) and w.pads_begin == w.pads_end == (0, 0)

    @property
    def direct(self) -> bool:
        """Use the direct loop: one input channel per group with several groups (depthwise and the like),
        where per-group GEMMs have an inner dimension of only kh * kw (measured 2.4x faster than the
        grouped GEMM on a 32-channel 3x3 depthwise conv; for group == 1, C_in == 1 the two are on par)."""
        return self.group > 1 and self.c // self.group == 1


def conv_geometry(ctx: NodeContext) -> ConvGeometry:
    x = check_rank(ctx, 0)
    w = ctx.shape(1)
    if len(w) != len(x):
        raise ctx.error(f"W of shape {w} must have the rank of X ({len(x)})")
    if ctx.type(1).dtype != ctx.type(0).dtype:
        raise ctx.error("X and W must share one element type")
    group = int(ctx.attr("group", 1))
    n, c = x[0], x[1]
    m = w[0]
    if group < 1 or c % group or m % group:
        raise ctx.error(f"group {group} must divide the input channels ({c}) and the output channels ({m})")
    if w[1] * group != c:
        raise ctx.error(f"W has {w[1]} input channels per group; X has {c} channels in {group} group(s)")
    kernel = tuple(w[2:])
    attr_kernel = ctx.attr("kernel_shape", None)
    if attr_kernel is not None and tuple(int(k) for k in attr_kernel) != kernel:
        raise ctx.error(f"kernel_shape {list(attr_kernel)} differs from W's spatial shape {list(kernel)}")
    if ctx.has_input(2):
        if ctx.shape(2) != (m,):
            raise ctx.error(f"B must have shape ({m},); got {ctx.shape(2)}")
        if ctx.type(2).dtype != ctx.type(0).dtype:
            raise ctx.error("X and B must share one element type")
    window = window_geometry(ctx, tuple(x[2:]), kernel)
    in_hw = tuple(x[2:]) if len(x) == 4 else (1, x[2])
    return ConvGeometry(n, c, m, group, window.as_2d(), in_hw)


def _conv(ctx: NodeContext):
    g = conv_geometry(ctx)
    out = g.window.out if len(ctx.shape(0)) == 4 else g.window.out[1:]
    return [TensorType(ctx.type(0).dtype, (g.n, g.m) + tuple(out))]


def conv_workspace(ctx: NodeContext):
    """Scratch of ``kernels.conv.conv``: a zero-padded input plane, plus the im2col matrix of the whole batch
    (GEMM path) or one output plane on the padded width (direct path); nothing for a pointwise conv."""
    g = conv_geometry(ctx)
    if g.pointwise and not g.direct:
        return []
    dtype = ctx.type(0).dtype
    w = g.window
    padded = (g.in_hw[0] + w.pads_begin[0] + w.pads_end[0], g.in_hw[1] + w.pads_begin[1] + w.pads_end[1])
    plane = TensorType(dtype, padded)
    if g.direct:
        return [plane, TensorType(dtype, (w.out[0] * padded[1],))]
    return [TensorType(dtype, (g.n, g.ckk, g.ohw)), plane]


OPS = (
    OpDef("Conv", _conv, since=11, kernel="conv.conv", workspace=conv_workspace,
          doc="1-D/2-D; im2col + batched np.matmul, a direct loop for one input channel per group"),
)
