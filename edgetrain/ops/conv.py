"""Conv (1-D and 2-D, any group count) and its gradient op, onnxruntime's com.microsoft ConvGrad;
ConvTranspose, the adjoint of a Conv, with a gradient rule in the same vocabulary. The bias of Conv and
ConvTranspose is split off by ``plan.lower`` into an element-wise Add, so at runtime they usually have two
inputs; constant folding may still run them with a bias. The gradient rules see the unlowered node, bias
included.

``window_geometry`` is the sliding-window arithmetic (auto_pad, pads, strides, dilations, ceil_mode) that
the pooling ops share.
"""
from __future__ import annotations


import numpy as np

from .. import config
from ..ir import TensorType
from ..record import Frozen
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


class Window(Frozen):
    """A sliding window over ``len(kernel)`` spatial dims, every field one entry per spatial dim."""
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    out: tuple[int, ...]

    def __init__(self, kernel, strides, dilations, pads_begin, pads_end, out):
        self._set(kernel=kernel, strides=strides, dilations=dilations, pads_begin=pads_begin, pads_end=pads_end,
                  out=out)

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


class ConvGeometry(Frozen):
    n: int
    c: int          # input channels
    m: int          # output channels
    group: int
    window: Window  # always 2-D (1-D convs get a leading spatial dim of size 1)
    in_hw: tuple[int, int]

    def __init__(self, n, c, m, group, window, in_hw):
        self._set(n=n, c=c, m=m, group=group, window=window, in_hw=in_hw)

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


SPLIT_WORK = 1 << 22     # multiply-adds of a conv call worth splitting over intra-op threads (~0.1 ms: waking a
                         # helper and waiting for its last block cost tens of us, which smaller calls lost)


def image_slots(g: ConvGeometry) -> int:
    """How many slices of the batch a conv call runs at once (``edgetrain.parallel``): each needs its own
    scratch plane, so the workspace holds one per slice."""
    work = g.n * g.m * g.ohw * g.ckk // max(1, g.group)
    return max(1, min(config.num_threads(), g.n)) if work >= SPLIT_WORK else 1


BATCH_GEMM_PIXELS = 64   # output pixels per image up to which a Conv's GEMM runs over the whole batch at once:
                         # per image, W [M, C*kh*kw] times only this many columns is near a GEMV, W read once per
                         # image (ResNet-18's 512-channel 3x3 at 2x2 pixels, batch 8: 13.6 ms per image, 3.1 ms as
                         # one GEMM and a transposing copy; at 8x8 pixels 2.8 against 2.3 ms)


def batch_gemm(g: ConvGeometry) -> bool:
    """Whether ``kernels.conv.conv`` runs the GEMM path as one GEMM over the batch (``BATCH_GEMM_PIXELS``):
    columns laid out [C*kh*kw, N, OH*OW] and Y's rows [M, N, OH*OW] in scratch, copied to Y's layout."""
    return g.group == 1 and g.n > 1 and not g.pointwise and not g.direct and g.ohw <= BATCH_GEMM_PIXELS


STACK_PLANE = 1024       # padded plane size (cells) up to which a unit-stride direct conv stacks the batch's
                         # planes into one pass per tap (kernels.conv._conv_direct_stacked): 7x7 planes 5x, 14x14
                         # 2.4x, 28x28 1.3x faster; at 56x56 on par


def _padded(g: ConvGeometry) -> tuple[int, int]:
    w = g.window
    return g.in_hw[0] + w.pads_begin[0] + w.pads_end[0], g.in_hw[1] + w.pads_begin[1] + w.pads_end[1]


def stacked_planes(g: ConvGeometry) -> bool:
    """Whether ``kernels.conv.conv``'s direct path stacks the images' padded planes (``STACK_PLANE``)."""
    hp, wp = _padded(g)
    return g.direct and g.window.strides == (1, 1) and hp * wp <= STACK_PLANE


def channel_slots(g: ConvGeometry) -> int:
    """How many blocks of input channels the stacked depthwise gradient runs at once (``edgetrain.parallel``):
    dW and dX, twice a Conv's multiply-adds, against ``SPLIT_WORK``."""
    work = 2 * g.n * g.m * g.ohw * g.ckk // max(1, g.group)
    return max(1, min(config.num_threads(), g.c)) if work >= SPLIT_WORK else 1


def conv_workspace(ctx: NodeContext):
    """Scratch of ``kernels.conv.conv``: the im2col matrix of the whole batch and a zero-padded input plane
    (GEMM path); the padded plane split into its stride phases, [sh * sw, ceil(hp / sh), ceil(wp / sw)], and
    one output plane on the phases' width (direct path); nothing for a pointwise conv. The planes come once
    per slice of the batch that runs at once (``image_slots``, leading axis); with ``stacked_planes`` each holds
    the padded planes of a whole batch, one above the other. With ``batch_gemm`` the columns
    are [C*kh*kw, N, OH*OW] and a third array holds the GEMM's result, [M, N, OH*OW]."""
    g = conv_geometry(ctx)
    if g.pointwise and not g.direct:
        return []
    dtype = ctx.type(0).dtype
    w = g.window
    padded = (g.in_hw[0] + w.pads_begin[0] + w.pads_end[0], g.in_hw[1] + w.pads_begin[1] + w.pads_end[1])
    slots = image_slots(g)
    if stacked_planes(g):     # all the images' padded planes one above the other, and their outputs' rows
        return [TensorType(dtype, (slots, 1, g.n * padded[0], padded[1])),
                TensorType(dtype, (slots, g.n * padded[0] * padded[1]))]
    if g.direct:
        (sh, sw), oh = w.strides, w.out[0]
        phase = (-(-padded[0] // sh), -(-padded[1] // sw))
        return [TensorType(dtype, (slots, sh * sw) + phase), TensorType(dtype, (slots, oh * phase[1]))]
    if batch_gemm(g):
        return [TensorType(dtype, (g.ckk, g.n, g.ohw)), TensorType(dtype, (slots,) + padded),
                TensorType(dtype, (g.m, g.n, g.ohw))]
    return [TensorType(dtype, (g.n, g.ckk, g.ohw)), TensorType(dtype, (slots,) + padded)]


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


def conv_grad_layout(ctx: NodeContext) -> dict[str, TensorType]:
    """Scratch of ``kernels.conv.conv_grad`` by name, in workspace order. GEMM path: dW and dX are each one
    GEMM over the whole batch (one BLAS call instead of one per image: 1.2-2x faster at ResNet-18's late
    layers, where an image has 4-16 pixels, and one thread handshake instead of N with two threads), on the
    columns of X ("cols", [C*kh*kw, N*OH*OW], laid out by im2col through a padded "plane"; then reused for
    dX's columns) and dY with the batch axis moved next to the pixels ("dy_t", [M, N*OH*OW]; so X too, "x_t",
    when it is its own column matrix, which then takes dX's transpose). For one image those are views of dY
    and X. Direct path: padded planes of X and dX, and one dY plane on the padded width (``stacked_planes``:
    the whole batch's, one above the other)."""
    g = conv_geometry(ctx, 1, 2, None)
    want_dx, want_dw, _ = conv_grad_outputs(ctx)
    dtype = ctx.type(1).dtype
    w = g.window
    padded = (g.in_hw[0] + w.pads_begin[0] + w.pads_end[0], g.in_hw[1] + w.pads_begin[1] + w.pads_end[1])
    plane = TensorType(dtype, padded)
    if stacked_planes(g):     # the batch's padded planes one above the other, dY's on the same rows; a set per
        slots = channel_slots(g)      # thread, each thread running a block of channels
        tall = TensorType(dtype, (slots, g.n * padded[0], padded[1]))
        return {"plane": tall, "dx_plane": tall,
                "dy_row": TensorType(dtype, (slots, g.n * padded[0] * padded[1]))}
    if g.direct:
        return {"plane": plane, "dx_plane": plane, "dy_row": TensorType(dtype, (w.out[0] * padded[1],))}
    plane = TensorType(dtype, (image_slots(g),) + padded)        # one per slice of the batch run at once
    ws = {}
    columns = g.n * g.ohw
    if not g.pointwise and (want_dx or want_dw):
        ws |= {"cols": TensorType(dtype, (g.ckk, columns)), "plane": plane}
    if g.n != 1 and (want_dw or want_dx):
        ws["dy_t"] = TensorType(dtype, (g.m, columns))
    if g.n != 1 and g.pointwise and (want_dw or want_dx):
        ws["x_t"] = TensorType(dtype, (g.c, columns))
    return ws


def conv_grad_workspace(ctx: NodeContext):
    """``conv_grad_layout``'s types."""
    return list(conv_grad_layout(ctx).values())


# --- ConvTranspose ----------------------------------------------------------------------------------------
# ConvTranspose(X, W) is the adjoint of the Conv from Y back to X with the same W: W's layout
# [C_in, C_out/group, k...] is Conv's [M, C/group, k...] with M = C_in and C = C_out. Its geometry is
# that Conv's, with Y's spatial shape as the Conv's input and X's as its output, so the kernel is ConvGrad's
# dX path and the gradient rule a Conv (dX) and a ConvGrad (dW).

CONV_TRANSPOSE_ATTRS = CONV_ATTRS | {"output_padding": Ints(low=DIM[0], high=DIM[1]),
                                     "output_shape": Ints(low=DIM[0], high=DIM[1])}


class TransposeGeometry(Frozen):
    """ConvTranspose's output spatial shape and the Conv (from Y to X) whose adjoint it is: ``conv.window``
    has X's spatial shape as output and the pads that crop the full result to Y."""
    conv: ConvGeometry
    out: tuple[int, ...]          # Y's spatial shape (one entry for 1-D)

    def __init__(self, conv, out):
        self._set(conv=conv, out=out)

    def conv_attrs(self) -> dict:
        """The attributes of that Conv (1-D: without the leading size-1 dim)."""
        w, skip = self.conv.window, 2 - len(self.out)
        return {"kernel_shape": w.kernel[skip:], "strides": w.strides[skip:], "dilations": w.dilations[skip:],
                "pads": w.pads_begin[skip:] + w.pads_end[skip:], "group": self.conv.group}


def _transpose_pads(size: int, span: int, st: int, extra: int, b: int, e: int, out: int | None,
                    auto_pad: str) -> tuple[int, int, int]:
    """(output size, begin pad, end pad) along one axis, as onnxruntime computes them: the full result is
    ``st * (size - 1) + span`` long; output_padding (``extra``) adds zeros at its end; explicit pads crop it;
    SAME_* (output ``size * st``) and an explicit output_shape split the total crop (more at the end for
    SAME_UPPER, at the start otherwise). An output_shape longer than the full result grows it with zeros at
    its end; SAME_* never grows it (onnxruntime's output then is shorter than ``size * st``, where the ONNX
    spec and its reference evaluator pad with zeros: only when the kernel's span is shorter than the
    stride)."""
    full = st * (size - 1) + span + extra
    if out is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = min(size * st, full)
    if out is None:
        return (full, 0, 0) if auto_pad == "VALID" else (full - b - e, b, e)
    total = max(0, full - out)
    begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
    return out, begin, total - begin


def _output_shape(ctx: NodeContext, nd: int) -> tuple:
    """The output_shape attribute (Y's spatial shape), or one None per spatial dim when absent."""
    shape = ctx.attr("output_shape")
    if shape is None:
        return (None,) * nd
    if len(shape) != nd or any(s < 1 for s in shape):
        raise ctx.error(f"output_shape {list(shape)} must have {nd} positive entries (one per spatial dim)")
    return tuple(shape)


def conv_transpose_geometry(ctx: NodeContext) -> TransposeGeometry:
    """ConvTranspose's geometry from inputs X, W (and B, checked when present)."""
    x = check_rank(ctx, 0)
    w = ctx.shape(1)
    nd = len(x) - 2
    if len(w) != len(x):
        raise ctx.error(f"W of shape {w} must have the rank of X ({len(x)})")
    if ctx.type(1).dtype != ctx.type(0).dtype:
        raise ctx.error("X and W must share one element type")
    group = ctx.attr("group")
    n, c_in = x[0], x[1]
    if w[0] != c_in:
        raise ctx.error(f"W of shape {w} must have X's {c_in} channels first ([C_in, C_out/group, k...])")
    if c_in % group:
        raise ctx.error(f"group {group} must divide the input channels ({c_in})")
    c_out = w[1] * group
    kernel = tuple(w[2:])
    attr_kernel = ctx.attr("kernel_shape")
    if attr_kernel is not None and tuple(attr_kernel) != kernel:
        raise ctx.error(f"kernel_shape {list(attr_kernel)} differs from W's spatial shape {list(kernel)}")
    if any(k < 1 for k in kernel):
        raise ctx.error(f"kernel_shape {list(kernel)} must be positive")
    if ctx.has_input(2):
        if ctx.shape(2) != (c_out,):
            raise ctx.error(f"B must have shape ({c_out},); got {ctx.shape(2)}")
        if ctx.type(2).dtype != ctx.type(0).dtype:
            raise ctx.error("X and B must share one element type")
    strides, dilations, auto_pad, begin, end = _window_attrs(ctx, nd)
    extra = _ints(ctx, "output_padding", nd, 0)
    wanted = _output_shape(ctx, nd)
    span = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations))
    axes = [_transpose_pads(*a, auto_pad) for a in zip(x[2:], span, strides, extra, begin, end, wanted)]
    out = tuple(a[0] for a in axes)
    if any(o < 1 for o in out):
        raise ctx.error(f"the output spatial shape {list(out)} is empty (pads {list(begin + end)} crop more "
                        "than the full result)")
    # the Conv from Y to X: its end pad is what the crop drops past Y, output_padding's zeros are never read
    conv_begin = tuple(a[1] for a in axes)
    conv_end = tuple(max(0, st * (s - 1) + sp - b - o)
                     for s, sp, st, b, o in zip(x[2:], span, strides, conv_begin, out))
    back = [(o + b + e - sp) // st + 1 for o, b, e, sp, st in zip(out, conv_begin, conv_end, span, strides)]
    if tuple(back) != tuple(x[2:]):
        raise ctx.error(f"output_padding {list(extra)} or output_shape {list(out)} adds a stride or more of "
                        f"zeros (strides {list(strides)}): a Conv with these attributes maps Y back to "
                        f"spatial shape {back}, not X's {list(x[2:])}; make each output_padding smaller than "
                        "its stride")
    window = Window(kernel, strides, dilations, conv_begin, conv_end, tuple(x[2:])).as_2d()
    in_hw = out if nd == 2 else (1,) + out
    return TransposeGeometry(ConvGeometry(n, c_out, c_in, group, window, in_hw), out)


def _conv_transpose(ctx: NodeContext):
    g = conv_transpose_geometry(ctx)
    return [TensorType(ctx.type(0).dtype, (g.conv.n, g.conv.c) + g.out)]


def conv_transpose_workspace(ctx: NodeContext):
    """Scratch of ``kernels.conv.conv_transpose``, ConvGrad's dX path: the columns W^T X and a padded plane of
    Y (GEMM path, nothing for a pointwise one); padded planes and one X plane (direct path)."""
    g = conv_transpose_geometry(ctx).conv
    dtype = ctx.type(0).dtype
    w = g.window
    padded = (g.in_hw[0] + w.pads_begin[0] + w.pads_end[0], g.in_hw[1] + w.pads_begin[1] + w.pads_end[1])
    if g.direct:
        plane = TensorType(dtype, padded)
        return [plane, TensorType(dtype, (w.out[0] * padded[1],))]
    if g.pointwise:
        return []
    return [TensorType(dtype, (g.n, g.ckk, g.ohw)), TensorType(dtype, padded)]


def _conv_transpose_vjp(g, dys):
    """With C the Conv from Y to X whose adjoint ConvTranspose is (Y = C^T(X; W) + B):
    dX = C(dY; W) = Conv(dY, W), dW = com.microsoft ConvGrad(X, dY, W)'s dW (X in dY's place: the gradient of
    <X, C(dY; W)> in W), dB = ReduceSum(dY) over N and space."""
    dy = dys[0]
    probe = NodeContext(g.node, CONV_TRANSPOSE, g.opset, list(g.in_types), [None] * len(g.in_types))
    attrs = conv_transpose_geometry(probe).conv_attrs()
    needs = list(g.needs) + [False] * 3
    dx = g.emit("Conv", [dy, g.x(1)], attrs) if needs[0] else None
    dw = None
    if needs[1]:
        label = g.node.name or g.y()
        dw = f"{label}_Grad/ConvGrad_dW"
        g.emit("ConvGrad", [g.x(0), dy, g.x(1)], attrs, "com.microsoft", outputs=["", dw], n_out=2)
    db = None
    if needs[2]:
        axes = [0] + list(range(2, len(g.in_types[0].shape)))
        # ReduceSum-13's axes input: edgetrain loads ai.onnx opsets 13 and later only
        db = g.emit("ReduceSum", [dy, g.const(axes, "int64", "axes")], {"keepdims": 0})
    return [dx, dw, db]


CONV_TRANSPOSE = OpDef(
    "ConvTranspose", _conv_transpose, since=11, kernel="conv.conv_transpose",
    workspace=conv_transpose_workspace, vjp=_conv_transpose_vjp, attrs=CONV_TRANSPOSE_ATTRS,
    doc="1-D/2-D, the adjoint of Conv: W^T X by np.matmul, then col2im (ConvGrad's dX path); a direct loop "
        "for one output channel per group")

def col2im_geometry(ctx: NodeContext):
    """(image shape, block shape, strides, dilations, pads begin, pads end, sliding positions per dim), checked
    against input [N, C * prod(block), L] with L the product of the positions."""
    x = tuple(ctx.shape(0))
    image = tuple(int(v) for v in ctx.const(1, "image_shape").reshape(-1))
    block = tuple(int(v) for v in ctx.const(2, "block_shape").reshape(-1))
    n = len(image)
    if len(x) != 3 or n < 1 or len(block) != n or min(image) < 1 or min(block) < 1:
        raise ctx.error(f"input {list(x)} must be [N, C * prod(block), L] with image_shape {list(image)} and "
                        f"block_shape {list(block)} of one positive size per spatial dim")
    strides = _ints(ctx, "strides", n, 1)
    dilations = _ints(ctx, "dilations", n, 1)
    pads = ctx.attr("pads")
    pads = (0,) * (2 * n) if pads is None else tuple(int(v) for v in pads)
    if len(pads) != 2 * n or min(strides + dilations) < 1:
        raise ctx.error(f"pads {list(pads)} must have {2 * n} entries, strides and dilations be positive")
    steps = tuple((i + pb + pe - d * (b - 1) - 1) // s + 1
                  for i, b, s, d, pb, pe in zip(image, block, strides, dilations, pads[:n], pads[n:]))
    cells = int(np.prod(block, dtype=np.int64))
    if min(steps) < 1 or x[1] % cells or x[2] != int(np.prod(steps, dtype=np.int64)):
        raise ctx.error(f"input {list(x)} must be [N, C * {cells}, {int(np.prod(steps, dtype=np.int64))}] for "
                        f"blocks {list(block)} sliding {list(steps)} times over image {list(image)}")
    return image, block, strides, dilations, pads[:n], pads[n:], steps


def _col2im(ctx: NodeContext):
    image, block = col2im_geometry(ctx)[:2]
    x = ctx.shape(0)
    return [TensorType(ctx.type(0).dtype, (x[0], x[1] // int(np.prod(block, dtype=np.int64))) + image)]


OPS = (
    OpDef("Col2Im", _col2im, since=18, kernel="conv.col2im", attrs={
        "dilations": Ints(low=DIM[0], high=DIM[1]), "pads": Ints(low=DIM[0], high=DIM[1]),
        "strides": Ints(low=DIM[0], high=DIM[1])},
          doc="N-D; image_shape and block_shape known when planning; sums the overlapping blocks (no gradient)"),
    OpDef("Conv", _conv, since=11, kernel="conv.conv", workspace=conv_workspace, vjp=_conv_vjp, attrs=CONV_ATTRS,
          doc="1-D/2-D; im2col + batched np.matmul, a direct loop for one input channel per group"),
    OpDef("ConvGrad", _conv_grad, domain="com.microsoft", since=1, kernel="conv.conv_grad",
          workspace=conv_grad_workspace, attrs=CONV_ATTRS,
          doc="inputs dY, X, W; optional outputs dX, dW, dB; Conv's attributes. im2col + np.matmul + col2im, "
              "direct loops for one input channel per group"),
    CONV_TRANSPOSE,
)
