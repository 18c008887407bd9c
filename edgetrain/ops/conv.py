"""Conv (1-D and 2-D, any group count) and its gradient op, onnxruntime's com.microsoft ConvGrad. Conv's
bias is split off by ``plan.lower`` into an element-wise Add, so at runtime Conv usually has two inputs;
constant folding may still run it with a bias. The gradient rule sees the unlowered node, bias included.

``window_geometry`` is the sliding-window arithmetic (auto_pad, pads, strides, dilations, ceil_mode) that
the pooling ops share.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import TensorType
from .attrs import REQUIRED, Int, Ints, String
from .base import NodeContext, OpDef

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
DIM = (0, 1 << 32)       # range of a window size, stride, dilation or pad (the shape rules check more)
# the sliding-window attributes Conv, ConvGrad and the pools share
WINDOW_ATTRS = {"auto_pad": String("NOTSET", AUTO_PADS), "dilations": Ints(low=DIM[0], high=DIM[1]),
                "kernel_shape": Ints(low=DIM[0], high=DIM[1]), "pads": Ints(low=DIM[0], high=DIM[1]),
                "strides": Ints(low=DIM[0], high=DIM[1])}
CONV_ATTRS = WINDOW_ATTRS | {"group": Int(1, low=1, high=DIM[1])}
POOL_ATTRS = WINDOW_ATTRS | {"kernel_shape": Ints(REQUIRED, low=DIM[0], high=DIM[1])}


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
    value = ctx.attr(name)
    if value is None:
        return (default,) * n
    value = tuple(int(v) for v in value)
    if len(value) != n:
        raise ctx.error(f"attribute '{name}' {list(value)} must have {n} entries (one per spatial dim)")
    return value


def _window_attrs(ctx: NodeContext, n: int):
    """strides, dilations, auto_pad and the explicit pads (begin, end; zeros unless auto_pad is NOTSET)."""
    strides = _ints(ctx, "strides", n, 1)
    dilations = _ints(ctx, "dilations", n, 1)
    if any(s < 1 for s in strides):
        raise ctx.error(f"strides {list(strides)} must be positive")
    if any(d < 1 for d in dilations):
        raise ctx.error(f"dilations {list(dilations)} must be positive")
    auto_pad = ctx.attr("auto_pad")
    pads = (0,) * (2 * n)
    if auto_pad == "NOTSET":
        pads = ctx.attr("pads")
        pads = (0,) * (2 * n) if pads is None else tuple(int(p) for p in pads)
        if len(pads) != 2 * n:
            raise ctx.error(f"pads {list(pads)} must have {2 * n} entries (begin and end per spatial dim)")
        if any(p < 0 for p in pads):
            raise ctx.error(f"pads {list(pads)} must not be negative")
    return strides, dilations, auto_pad, pads[:n], pads[n:]


def _axis_window(size: int, span: int, st: int, b: int, e: int, auto_pad: str, ceil_mode: bool):
    """Output size and (begin, end) pads along one spatial axis."""
    if auto_pad == "NOTSET":
        room = size + b + e - span
        o = (-(-room // st) if ceil_mode else room // st) + 1
        if ceil_mode and (o - 1) * st >= size + b:   # the last window starts inside the input or left pad
            o -= 1
        return o, b, e
    if auto_pad == "VALID":
        return (size - span) // st + 1, 0, 0
    o = -(-size // st)
    total = max(0, (o - 1) * st + span - size)
    begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
    return o, begin, total - begin


def window_geometry(ctx: NodeContext, spatial: tuple[int, ...], kernel: tuple[int, ...],
                    ceil_mode: bool = False, pool: bool = False) -> Window:
    """Output size and explicit pads of a sliding window over ``spatial``, as the ONNX Conv/Pool specs say."""
    n = len(spatial)
    if any(k < 1 for k in kernel):
        raise ctx.error(f"kernel_shape {list(kernel)} must be positive")
    strides, dilations, auto_pad, begin, end = _window_attrs(ctx, n)
    span = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations))
    if pool and auto_pad == "NOTSET" and any(p >= s for p, s in zip(begin + end, span + span)):
        raise ctx.error(f"pads {list(begin + end)} must be smaller than the (dilated) kernel {list(span)}")
    axes = [_axis_window(*a, auto_pad, ceil_mode) for a in zip(spatial, span, strides, begin, end)]
    out = [a[0] for a in axes]
    begin, end = tuple(a[1] for a in axes), tuple(a[2] for a in axes)
    if any(o < 1 for o in out):
        raise ctx.error(f"the window (kernel {list(kernel)}, dilations {list(dilations)}) does not fit the "
                        f"input of spatial shape {list(spatial)} with pads {list(begin) + list(end)}: "
                        f"output size {out}")
    return Window(tuple(kernel), strides, dilations, begin, end, tuple(out))


def smallest_input(ctx: NodeContext, out: tuple[int, ...], kernel: tuple[int, ...],
                   ceil_mode: bool = False) -> tuple[int, ...]:
    """The smallest spatial input shape whose window output is ``out`` (a pooling gradient's dX shape when
    no ``input_spatial_shape`` attribute says otherwise: with strides > 1 several input sizes pool alike)."""
    strides, dilations, auto_pad, begin, end = _window_attrs(ctx, len(out))
    sizes = []
    for o, k, st, d, b, e in zip(out, kernel, strides, dilations, begin, end):
        span = (k - 1) * d + 1
        size = next((s for s in range(1, (o + 1) * st + span + 1)
                     if _axis_window(s, span, st, b, e, auto_pad, ceil_mode)[0] >= o), None)
        if size is None or _axis_window(size, span, st, b, e, auto_pad, ceil_mode)[0] != o:
            raise ctx.error(f"no input size gives the output spatial shape {list(out)} with kernel "
                            f"{list(kernel)}")
        sizes.append(size)
    return tuple(sizes)


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


def conv_geometry(ctx: NodeContext, xi: int = 0, wi: int = 1, bi: int | None = 2) -> ConvGeometry:
    """Conv's geometry from inputs X, W (and B, checked when present) at indices ``xi``, ``wi``, ``bi``."""
    x = check_rank(ctx, xi)
    w = ctx.shape(wi)
    if len(w) != len(x):
        raise ctx.error(f"W of shape {w} must have the rank of X ({len(x)})")
    if ctx.type(wi).dtype != ctx.type(xi).dtype:
        raise ctx.error("X and W must share one element type")
    group = ctx.attr("group")
    n, c = x[0], x[1]
    m = w[0]
    if group < 1 or c % group or m % group:
        raise ctx.error(f"group {group} must divide the input channels ({c}) and the output channels ({m})")
    if w[1] * group != c:
        raise ctx.error(f"W has {w[1]} input channels per group; X has {c} channels in {group} group(s)")
    kernel = tuple(w[2:])
    attr_kernel = ctx.attr("kernel_shape")
    if attr_kernel is not None and tuple(int(k) for k in attr_kernel) != kernel:
        raise ctx.error(f"kernel_shape {list(attr_kernel)} differs from W's spatial shape {list(kernel)}")
    if bi is not None and ctx.has_input(bi):
        if ctx.shape(bi) != (m,):
            raise ctx.error(f"B must have shape ({m},); got {ctx.shape(bi)}")
        if ctx.type(bi).dtype != ctx.type(xi).dtype:
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


# --- gradient ---------------------------------------------------------------------------------------------

def _conv_vjp(g, dys):
    """dX = col2im(W^T dY), dW = sum_n dY im2col(X)^T, dB = sum of dY over N and space: one com.microsoft
    ConvGrad(dY, X, W) with Conv's attributes, "" for the outputs nobody needs (as onnxruntime emits it)."""
    label = g.node.name or g.y()
    outputs = [f"{label}_Grad/ConvGrad_{d}" if need else "" for need, d in zip(g.needs, ("dX", "dW", "dB"))]
    g.emit("ConvGrad", [dys[0], g.x(0), g.x(1)], dict(g.node.attrs), "com.microsoft", outputs=outputs,
           n_out=len(outputs))
    return [o or None for o in outputs]


def conv_grad_outputs(ctx: NodeContext) -> tuple[bool, bool, bool]:
    """Which of ConvGrad's outputs (dX, dW, dB) are wanted."""
    outs = list(ctx.node.outputs) + [""] * 3
    return bool(outs[0]), bool(outs[1]), bool(outs[2])


def _conv_grad(ctx: NodeContext):
    if len(ctx.node.outputs) > 3:
        raise ctx.error("ConvGrad has at most 3 outputs (dX, dW, dB)")
    g = conv_geometry(ctx, 1, 2, None)
    out = g.window.out if len(ctx.shape(1)) == 4 else g.window.out[1:]
    want = (g.n, g.m) + tuple(out)
    if ctx.shape(0) != want or ctx.type(0).dtype != ctx.type(1).dtype:
        want_type = TensorType(ctx.type(1).dtype, want)
        raise ctx.error(f"dY must be {want_type} (Conv's output); got {ctx.type(0)}")
    return [ctx.type(1), ctx.type(2), TensorType(ctx.type(1).dtype, (g.m,))][:len(ctx.node.outputs)]


def conv_grad_workspace(ctx: NodeContext):
    """Scratch of ``kernels.conv.conv_grad``. GEMM path: the im2col matrix (X's columns for dW, then dY's
    columns for dX) and a padded plane unless pointwise, and per-image dW products [N, M, C/group*kh*kw] to
    sum. Direct path: padded planes of X and dX, and one dY plane on the padded width."""
    g = conv_geometry(ctx, 1, 2, None)
    want_dx, want_dw, _ = conv_grad_outputs(ctx)
    dtype = ctx.type(1).dtype
    w = g.window
    padded = (g.in_hw[0] + w.pads_begin[0] + w.pads_end[0], g.in_hw[1] + w.pads_begin[1] + w.pads_end[1])
    if g.direct:
        plane = TensorType(dtype, padded)
        return [plane, plane, TensorType(dtype, (w.out[0] * padded[1],))]
    ws = []
    if not g.pointwise and (want_dx or want_dw):
        ws += [TensorType(dtype, (g.n, g.ckk, g.ohw)), TensorType(dtype, padded)]
    if want_dw:
        ws.append(TensorType(dtype, (g.n, g.m, g.ckk // g.group)))
    return ws


OPS = (
    OpDef("Conv", _conv, since=11, kernel="conv.conv", workspace=conv_workspace, vjp=_conv_vjp, attrs=CONV_ATTRS,
          doc="1-D/2-D; im2col + batched np.matmul, a direct loop for one input channel per group"),
    OpDef("ConvGrad", _conv_grad, domain="com.microsoft", since=1, kernel="conv.conv_grad",
          workspace=conv_grad_workspace, attrs=CONV_ATTRS,
          doc="inputs dY, X, W; optional outputs dX, dW, dB; Conv's attributes. im2col + np.matmul + col2im, "
              "direct loops for one input channel per group"),
)
