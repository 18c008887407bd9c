"""The ops onnxruntime 1.19's training graph transformers and gradient builder write into training artifacts
that the other families lack (the full list, with what is and is not supported: docs/ort_training_vocabulary.md).

- ``ConcatTraining``/``SplitTraining`` (com.microsoft): ORT's ConcatReplacement turns every Concat of a training
  graph into ConcatTraining, whose second output (the inputs' lengths along the axis) feeds the SplitTraining
  of its gradient. The lengths follow from shapes, so they are known when planning (``known_outputs``);
  ConcatTraining runs as a Concat (``plan.lower``) and SplitTraining as a Split.
- ``DivGrad`` (com.microsoft): Div's gradient op, lowered to element-wise ops and broadcast reductions.
- ``Trilu`` (com.microsoft): what ORT's Trilu gradient emits; the same op as ai.onnx Trilu.
- ``QuickGelu``, ``FastGelu``, ``BiasGelu`` and their gradient ops: the fusions QuickGeluFusion (x *
  sigmoid(a x), SiLU), FastGeluFusion (the tanh GELU) and BiasGeluFusion write them; element-wise, so fused.
- ``SimplifiedLayerNormalization`` (ai.onnx domain in ORT, version 1) and its ``...Grad``: RMS normalization,
  written by SimplifiedLayerNormFusion for x / sqrt(mean(x^2) + eps) * scale; lowered to reductions and
  element-wise ops. ai.onnx ``RMSNormalization`` (opset 23) is the same op without the inv_std_var output:
  lowered alike, and trained as SimplifiedLayerNormalization (``train_form``), whose gradient reads that output.
- ``ConvTransposeGrad`` (com.microsoft): ConvTranspose's gradient op, lowered to the Conv (dX) and ConvGrad
  (dW) of ``ops.conv``'s own ConvTranspose gradient rule.
- ``SoftmaxCrossEntropyLossInternal`` and its ``...Grad`` (com.microsoft): SoftmaxCrossEntropyLossInternalFusion's
  form of LogSoftmax + NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss(Grad) with ignore_index as an input;
  lowered to those.
- ``FusedGemm``/``FusedConv`` (com.microsoft): Gemm/Conv and an activation, as ORT's activation fusions write them
  into optimized models; lowered to the core op's own lowering and the activation.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..ir import Node, TensorType
from ..ir.dtypes import to_numpy
from .attrs import Flag, Float, Floats, Int, Ints, String
from .base import ANY, NodeContext, OpDef, broadcast_shapes, normalize_axis
from .conv import CONV_ATTRS, CONV_TRANSPOSE_ATTRS
from .conv import OPS as CONV_OPS
from .elementwise import OPS as ELEMENTWISE_OPS
from .elementwise import ew, grad_op
from .matmul import OPS as MATMUL_OPS
from .normalization import LAYER_NORM_ATTRS, layer_norm_axis, stash_dtype
from .softmax import OPS as SOFTMAX_OPS
from .softmax import REDUCTIONS
from .tensor import split_input_gradient, split_sizes, trilu_mask

MS = "com.microsoft"
GELU_C, GELU_A = 0.7978845608028654, 0.044715    # sqrt(2 / pi) and the cubic term of the tanh GELU
QUICK_GELU_ALPHA = Float(1.702)


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _erf(x):
    from math import erf
    return np.vectorize(erf, otypes=[np.float64])(x)


def _gelu_grad(dy, x):
    return dy * (0.5 * (1 + _erf(x / np.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi))


def _fast_gelu(x):
    return 0.5 * x * (1 + np.tanh(GELU_C * x * (1 + GELU_A * x * x)))


def _fast_gelu_grad(dy, x):
    t = np.tanh(GELU_C * x * (1 + GELU_A * x * x))
    return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * GELU_C * (1 + 3 * GELU_A * x * x))


def _quick_gelu_grad(ctx, dy, x):
    a = ctx.attr("alpha")
    s = _sigmoid(a * x)
    return dy * s * (1 + a * x * (1 - s))


def _typed(f):
    """A numpy form that computes in float64 and returns the first input's element type."""
    def run(ctx, *xs):
        return np.asarray(f(ctx, *(np.asarray(x, np.float64) for x in xs))).astype(xs[0].dtype)
    return run


# --- gradient rules --------------------------------------------------------------------------------------

def _quick_gelu_vjp(g, dys):
    return [g.emit("QuickGeluGrad", [dys[0], g.x(0)], {"alpha": g.attr("alpha")}, MS)]


def _biased(g, dx_of):
    """dX = dx_of(dY, X, B) and dB = dX summed over B's broadcast axes (BiasGelu, FastGelu with a bias)."""
    dx = dx_of()
    return [dx if g.needs[0] else None, g.unbroadcast(dx, 1) if len(g.needs) > 1 and g.needs[1] else None]


def _fast_gelu_vjp(g, dys):
    if len(g.node.inputs) < 2 or not g.node.inputs[1]:
        return [g.emit("FastGeluGrad", [dys[0], g.x(0)], domain=MS), None][:len(g.node.inputs)]
    return _biased(g, lambda: g.emit("BiasFastGeluGrad_dX", [dys[0], g.x(0), g.x(1)], domain=MS))


def _bias_gelu_vjp(g, dys):
    return _biased(g, lambda: g.emit("BiasGeluGrad_dX", [dys[0], g.x(0), g.x(1)], domain=MS))


def _trilu_vjp(g, dys):
    """Trilu is linear: dX = Trilu(dY) with the same k and upper (ORT emits the com.microsoft one)."""
    k = [g.x(1)] if len(g.node.inputs) > 1 and g.node.inputs[1] else []
    return [g.emit("Trilu", [dys[0]] + k, {"upper": g.attr("upper")}, MS), None]


def _concat_training_vjp(g, dys):
    """SplitTraining(dY, lengths): the node's own lengths output (always known when planning)."""
    if len(g.node.outputs) < 2 or not g.node.outputs[1]:
        raise g.error("needs its per_input_length output")
    outs = [f"{g.node.name}_Grad/SplitTraining_dx{i}" if need else "" for i, need in enumerate(g.needs)]
    g.emit("SplitTraining", [dys[0], g.y(1)], {"axis": g.attr("axis")}, MS, outputs=outs)
    return [o or None for o in outs]


def _split_training_vjp(g, dys):
    return [split_input_gradient(g, dys), None]


def _sln_vjp(g, dys):
    """SimplifiedLayerNormalizationGrad(dY, X, scale, inv_std_var) -> dX, dScale, as onnxruntime emits it."""
    if len(g.node.outputs) < 2 or not g.node.outputs[1]:
        raise g.error("needs its inv_std_var output")
    if len(dys) > 1 and dys[1] is not None:
        raise g.error("has no gradient through inv_std_var")
    outs = [f"{g.node.name}_Grad/SimplifiedLayerNormalizationGrad_{d}" if need else ""
            for need, d in zip(g.needs, ("dX", "dScale"))]
    g.emit("SimplifiedLayerNormalizationGrad", [dys[0], g.x(0), g.x(1), g.y(1)], dict(g.node.attrs), MS,
           outputs=outs)
    return [o or None for o in outs]


# --- shape rules -----------------------------------------------------------------------------------------

def _concat_axis(ctx: NodeContext) -> tuple[int, list[int]]:
    present = [i for i in range(len(ctx.node.inputs)) if ctx.has_input(i)]
    if not present:
        raise ctx.error("needs at least one input")
    rank = len(ctx.shape(present[0]))
    if rank == 0:
        raise ctx.error("cannot concatenate scalars (rank 0)")
    return normalize_axis(ctx, ctx.attr("axis"), rank), present


def _concat_training(ctx: NodeContext):
    axis, present = _concat_axis(ctx)
    shapes = [ctx.shape(i) for i in present]
    if len({ctx.type(i).dtype for i in present}) > 1:
        raise ctx.error("inputs must share one element type")
    for s in shapes:
        if len(s) != len(shapes[0]) or any(a != b for d, (a, b) in enumerate(zip(s, shapes[0])) if d != axis):
            raise ctx.error(f"shapes {shapes} differ outside axis {axis}")
    if len(ctx.node.outputs) > 2:
        raise ctx.error("has at most 2 outputs (concat_result, per_input_length)")
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    return [TensorType(ctx.type(present[0]).dtype, tuple(out)), TensorType(np.int64, (len(present),))]


def _input_lengths(ctx: NodeContext) -> dict[int, np.ndarray]:
    axis, present = _concat_axis(ctx)
    return {1: np.array([ctx.shape(i)[axis] for i in present], np.int64)}


def _concat_training_fold(ctx, *xs):
    axis, _ = _concat_axis(ctx)
    xs = [x for x in xs if x is not None]
    return [np.concatenate(xs, axis=axis), np.array([x.shape[axis] for x in xs], np.int64)]


def _split_training(ctx: NodeContext):
    shape = ctx.shape(0)
    axis = normalize_axis(ctx, ctx.attr("axis"), len(shape))
    if ctx.has_input(1) and ctx.type(1).dtype != np.int64:
        raise ctx.error(f"input 1 ('split') must be int64, got {ctx.type(1)}")
    return [TensorType(ctx.type(0).dtype, shape[:axis] + (s,) + shape[axis + 1:]) for s in split_sizes(ctx)]


def _div_grad(ctx: NodeContext):
    dy, a, b = ctx.type(0), ctx.type(1), ctx.type(2)
    if len({dy.dtype, a.dtype, b.dtype}) > 1:
        raise ctx.error("dY, A and B must share one element type")
    if broadcast_shapes(ctx, a.shape, b.shape) != tuple(dy.shape):
        raise ctx.error(f"dY's shape {dy.shape} is not the broadcast of A {a.shape} and B {b.shape}")
    if len(ctx.node.outputs) > 2:
        raise ctx.error("has at most 2 outputs (dA, dB)")
    return [a, b][:max(1, len(ctx.node.outputs))]


def _div_grad_fold(ctx, dy, a, b):
    def reduce_to(x, shape):
        lead = x.ndim - len(shape)
        axes = tuple(range(lead)) + tuple(lead + d for d, n in enumerate(shape) if n == 1 and x.shape[lead + d] != 1)
        return x.sum(axis=axes, keepdims=True).reshape(shape)
    return [reduce_to(dy / b, a.shape), reduce_to(-dy * a / (b * b), b.shape)]


def _trilu(ctx: NodeContext):
    trilu_mask(ctx)
    return [ctx.type(0)]


def _sln_types(ctx: NodeContext, x: TensorType, scale_input: int) -> TensorType:
    axis = layer_norm_axis(ctx)
    norm = tuple(x.shape[axis:])
    scale = ctx.type(scale_input)
    if scale.dtype != x.dtype or tuple(scale.shape) != norm:
        raise ctx.error(f"scale must be {x.dtype}{list(norm)} (X's normalized shape), got {scale}")
    return TensorType(stash_dtype(ctx), x.shape[:axis] + (1,) * (len(x.shape) - axis))


def _simplified_layer_norm(ctx: NodeContext):
    x = ctx.type(0)
    stat = _sln_types(ctx, x, 1)
    if len(ctx.node.outputs) > 2:
        raise ctx.error("has at most 2 outputs (Y, inv_std_var)")
    return [x, stat][:max(1, len(ctx.node.outputs))]


def _rms_norm(ctx: NodeContext):
    x = ctx.type(0)
    _sln_types(ctx, x, 1)
    if len(ctx.node.outputs) > 1:
        raise ctx.error("has one output (Y)")
    return [x]


def _rms_norm_fold(ctx, x, scale):
    return _sln_fold(ctx, x, scale)[0]


def _rms_norm_train_form(node: Node, opset: int) -> Node:
    return Node("SimplifiedLayerNormalization", list(node.inputs), list(node.outputs), dict(node.attrs), node.name)


def _simplified_layer_norm_grad(ctx: NodeContext):
    dy, x = ctx.type(0), ctx.type(1)
    if dy != x:
        raise ctx.error(f"dY {dy} must have X's type {x}")
    stat = _sln_types(ctx, x, 2)
    if ctx.type(3).shape != stat.shape:
        raise ctx.error(f"inv_std_var must have shape {stat.shape}, got {ctx.type(3)}")
    if len(ctx.node.outputs) > 2:
        raise ctx.error("has at most 2 outputs (dX, dScale)")
    return [x, ctx.type(2)][:max(1, len(ctx.node.outputs))]


def _norm_axes(ctx: NodeContext) -> tuple[int, ...]:
    return tuple(range(layer_norm_axis(ctx), len(ctx.shape(0))))


def _sln_fold(ctx, x, scale):
    axes = _norm_axes(ctx)
    xf = x.astype(np.float64)
    inv = 1 / np.sqrt((xf * xf).mean(axis=axes, keepdims=True) + ctx.attr("epsilon"))
    return [(xf * inv * scale).astype(x.dtype), inv.astype(stash_dtype(ctx))]


def _sln_grad_fold(ctx, dy, x, scale, inv):
    axes = tuple(range(layer_norm_axis(ctx), x.ndim))
    xhat = x.astype(np.float64) * inv
    gs = dy.astype(np.float64) * scale
    dx = inv * (gs - xhat * (gs * xhat).mean(axis=axes, keepdims=True))
    lead = tuple(range(layer_norm_axis(ctx)))
    return [dx.astype(x.dtype), (dy * xhat).sum(axis=lead).astype(scale.dtype)]


def _conv_transpose_grad(ctx: NodeContext):
    dy, x, w = ctx.type(0), ctx.type(1), ctx.type(2)
    if len({dy.dtype, x.dtype, w.dtype}) > 1 or len(dy.shape) != len(x.shape) or len(w.shape) != len(x.shape):
        raise ctx.error("dY, X and W must share one element type and rank")
    if len(ctx.node.outputs) > 3:
        raise ctx.error("has at most 3 outputs (dX, dW, dB)")
    bias = TensorType(w.dtype, (w.shape[1] * ctx.attr("group"),))
    return [x, w, bias][:max(1, len(ctx.node.outputs))]


SPLIT_TRAINING_ATTRS = {"axis": Int(0), "num_outputs": Int(low=1), "split": Ints(low=0)}

OPS = (
    replace(ew("BiasGelu", _typed(lambda ctx, a, b: 0.5 * (a + b) * (1 + _erf((a + b) / np.sqrt(2.0)))),
               domain=MS, since=1, doc="Gelu(A + B), erf form; B broadcasts"), vjp=_bias_gelu_vjp),
    grad_op("BiasGeluGrad_dX", _typed(lambda ctx, dy, x, b: _gelu_grad(dy, x + b)), "dX = GeluGrad(dY, X + B)"),
    OpDef("ConcatTraining", _concat_training, domain=MS, since=1, kind="lowered", fold=_concat_training_fold,
          known_outputs=_input_lengths, vjp=_concat_training_vjp, grad_outputs=2, attrs={"axis": Int(0)},
          doc="Concat with a second output, the int64 lengths of the inputs along axis (known when planning)"),
    OpDef("ConvTransposeGrad", _conv_transpose_grad, domain=MS, since=1, kind="lowered",
          attrs=CONV_TRANSPOSE_ATTRS,
          doc="inputs dY, X, W; outputs dX, dW, dB: lowered to Conv(dY, W) and ConvGrad's dW"),
    OpDef("DivGrad", _div_grad, domain=MS, since=1, kind="lowered", fold=_div_grad_fold,
          doc="inputs dY, A, B; outputs dA = dY / B, dB = -dY A / B^2, each summed to its input's shape"),
    grad_op("BiasFastGeluGrad_dX", _typed(lambda ctx, dy, x, b: _fast_gelu_grad(dy, x + b)),
            "dX = FastGeluGrad(dY, X + B)"),
    replace(ew("FastGelu", _typed(lambda ctx, x, b=None: _fast_gelu(x if b is None else x + b)), domain=MS,
               since=1, doc="tanh-approximated GELU of X (+ optional bias)"), vjp=_fast_gelu_vjp),
    grad_op("FastGeluGrad", _typed(lambda ctx, dy, x: _fast_gelu_grad(dy, x)), "dX = dY * d/dx FastGelu(X)"),
    replace(ew("QuickGelu", _typed(lambda ctx, x: x * _sigmoid(ctx.attr("alpha") * x)), domain=MS, since=1,
               attrs={"alpha": QUICK_GELU_ALPHA}, doc="X * Sigmoid(alpha X) (SiLU for alpha 1)"),
            vjp=_quick_gelu_vjp),
    grad_op("QuickGeluGrad", _typed(_quick_gelu_grad), "dX = dY * s (1 + alpha X (1 - s)), s = Sigmoid(alpha X)",
            {"alpha": QUICK_GELU_ALPHA}),
    OpDef("RMSNormalization", _rms_norm, since=23, kind="lowered", fold=_rms_norm_fold, vjp=_sln_vjp,
          train_form=_rms_norm_train_form, attrs=LAYER_NORM_ATTRS,
          doc="Y = X / sqrt(mean(X^2 over axis..) + epsilon) * scale, scale of X's normalized shape; trains as "
              "SimplifiedLayerNormalization"),
    OpDef("SimplifiedLayerNormalization", _simplified_layer_norm, since=1, kind="lowered", fold=_sln_fold,
          vjp=_sln_vjp, grad_outputs=2, attrs=LAYER_NORM_ATTRS,
          doc="onnxruntime's RMS normalization (its ai.onnx-domain contrib op): Y = X / sqrt(mean(X^2 over axis..) "
              "+ epsilon) * scale; optional output inv_std_var (stash_type)"),
    OpDef("SimplifiedLayerNormalizationGrad", _simplified_layer_norm_grad, domain=MS, since=1, kind="lowered",
          fold=_sln_grad_fold, attrs=LAYER_NORM_ATTRS,
          doc="inputs dY, X, scale, inv_std_var; outputs dX = r (g - x^ mean(g x^)), dScale = sum(dY x^) with "
              "x^ = X r, g = dY scale"),
    OpDef("SplitTraining", _split_training, domain=MS, since=1, kernel="tensor.split", dtypes=ANY,
          vjp=_split_training_vjp, attrs=SPLIT_TRAINING_ATTRS,
          doc="Split whose sizes (input 1, ConcatTraining's lengths) must be known when planning"),
    OpDef("Trilu", _trilu, domain=MS, since=1, kernel="tensor.trilu", dtypes=ANY, vjp=_trilu_vjp,
          attrs={"upper": Flag(1)}, doc="ai.onnx Trilu in onnxruntime's domain (its gradient op)"),
)


# --- SoftmaxCrossEntropyLossInternal: SoftmaxCrossEntropyLoss with ignore_index as an input ------------------

SCE = {op.op_type: op for op in SOFTMAX_OPS if op.op_type.startswith("SoftmaxCrossEntropyLoss")}
SCE_INTERNAL_ATTRS = {"output_type": Int(), "reduction": String("mean", REDUCTIONS)}


def sce_core(ctx: NodeContext, ignore_input: int, weight_input: int) -> NodeContext:
    """The SoftmaxCrossEntropyLoss(Grad) node an Internal one is: ``ignore_index`` (an int64 scalar input, which
    must be known when planning) becomes the attribute, the optional bias input of the gradient is left out."""
    node, core = ctx.node, SCE[ctx.op.op_type.replace("Internal", "")]
    attrs = {"reduction": ctx.attr("reduction")}
    if ctx.has_input(ignore_input):
        ignore = ctx.const(ignore_input, "ignore_index")
        if ignore.size != 1 or ignore.dtype != np.int64:
            raise ctx.error(f"ignore_index must be one int64, got {ctx.type(ignore_input)}")
        attrs["ignore_index"] = int(ignore.reshape(()))
    out_type = ctx.attr("output_type")
    if out_type is not None and to_numpy(out_type, f"{node} attribute 'output_type'") != ctx.type(0).dtype:
        raise ctx.error("output_type must be the scores' element type (edgetrain computes the loss in it)")
    keep = weight_input + 1 if ctx.has_input(weight_input) else weight_input
    inputs = list(node.inputs[:keep])
    core_node = Node(core.op_type, inputs, list(node.outputs), core.checked_attrs(
        Node(core.op_type, inputs, [], attrs, node.name, core.domain)), node.name, core.domain)
    return NodeContext(core_node, core, ctx.opset, list(ctx.in_types[:keep]), list(ctx.consts[:keep]),
                       list(ctx.out_types))


def _sce_internal(ctx: NodeContext):
    return SCE["SoftmaxCrossEntropyLoss"].infer(sce_core(ctx, 3, 2))


def _sce_internal_grad(ctx: NodeContext):
    if ctx.has_input(5):
        raise ctx.error("the bias input (SceLossGradBiasFusion, a CUDA fusion) is not supported")
    return SCE["SoftmaxCrossEntropyLossGrad"].infer(sce_core(ctx, 4, 3))


def _sce_internal_vjp(g, dys):
    """SoftmaxCrossEntropyLossInternalGrad(dY, log_prob, label[, weight, ignore_index]), as ORT emits it."""
    if len(g.node.outputs) < 2 or not g.node.outputs[1]:
        raise g.error("needs its log_prob output")
    inputs = [dys[0], g.y(1)] + list(g.node.inputs[1:])
    attrs = {"reduction": g.attr("reduction")}
    if g.attr("output_type") is not None:
        attrs["output_type"] = g.attr("output_type")
    return [g.emit("SoftmaxCrossEntropyLossInternalGrad", inputs, attrs, MS)] + [None] * (len(g.node.inputs) - 1)


OPS = OPS + (
    OpDef("SoftmaxCrossEntropyLossInternal", _sce_internal, domain=MS, since=1, kind="lowered",
          vjp=_sce_internal_vjp, grad_outputs=2, attrs=SCE_INTERNAL_ATTRS,
          doc="inputs scores, labels[, weights, ignore_index (known when planning)]; outputs loss, log_prob: "
              "SoftmaxCrossEntropyLoss (what SoftmaxCrossEntropyLossInternalFusion makes of LogSoftmax + "
              "NegativeLogLikelihoodLoss)"),
    OpDef("SoftmaxCrossEntropyLossInternalGrad", _sce_internal_grad, domain=MS, since=1, kind="lowered",
          attrs=SCE_INTERNAL_ATTRS,
          doc="inputs dY, log_prob, labels[, weights, ignore_index]: SoftmaxCrossEntropyLossGrad; no bias input"),
)


# --- FusedGemm / FusedConv: Gemm or Conv with an activation (ORT's GemmActivationFusion, ConvActivationFusion) --

CORE = {op.op_type: op for op in MATMUL_OPS + CONV_OPS if op.op_type in ("Gemm", "Conv")}
# what ORT's kernels accept: FusedGemm's element-wise functors, FusedConv's MLAS activations
GEMM_ACTIVATIONS = ("Elu", "HardSigmoid", "LeakyRelu", "Relu", "Selu", "Sigmoid", "Softplus", "Tanh")
CONV_ACTIVATIONS = ("Clip", "HardSigmoid", "LeakyRelu", "Relu", "Sigmoid", "Tanh")
# the edgetrain attribute each activation parameter becomes, in order, with the defaults the activation op declares
_ACTIVATION_OPS = {op.op_type: op for op in ELEMENTWISE_OPS if op.domain == ""}
ACTIVATION_PARAMS = {name: tuple((p, a.default) for p, a in _ACTIVATION_OPS[name].attrs.items())
                     for name in sorted(set(GEMM_ACTIVATIONS + CONV_ACTIVATIONS) - {"Clip"})}
GEMM_ONLY = ("alpha", "beta", "transA", "transB")


def core_context(ctx: NodeContext, op_type: str, n_inputs: int, attr_names) -> NodeContext:
    """The Gemm or Conv node a fused one starts with: its first ``n_inputs`` inputs and those attributes."""
    core, node = CORE[op_type], ctx.node
    inputs = list(node.inputs[:n_inputs])
    attrs = {k: v for k, v in node.attrs.items() if k in attr_names}
    core_node = Node(op_type, inputs, list(node.outputs[:1]), attrs, node.name)
    core_node.attrs = core.checked_attrs(core_node)
    return NodeContext(core_node, core, 11 if op_type == "Conv" else 13, list(ctx.in_types[:n_inputs]),
                       list(ctx.consts[:n_inputs]), list(ctx.out_types[:1]))


def activation(ctx: NodeContext) -> tuple[str, dict, list[float]]:
    """(edgetrain op, its attributes, Clip's bounds) of the fused activation."""
    name = ctx.attr("activation")
    if "activation_params" in ctx.op.attrs:      # FusedConv: one list, in the activation's parameter order
        given = list(ctx.attr("activation_params") or ())
        named = dict(zip([p for p, _ in ACTIVATION_PARAMS.get(name, ())], given))
    else:                                        # FusedGemm: activation_alpha, _beta, _gamma by name
        named = {p: ctx.attr(f"activation_{p}") for p in ("alpha", "beta", "gamma")}
        given = []
    if name == "Clip":
        if len(given) != 2:
            raise ctx.error(f"activation Clip needs activation_params [min, max], got {given}")
        return name, {}, given
    attrs = {p: named[p] if named.get(p) is not None else default for p, default in ACTIVATION_PARAMS.get(name, ())}
    return name, attrs, []


def _fused_gemm(ctx: NodeContext):
    activation(ctx)
    return CORE["Gemm"].infer(core_context(ctx, "Gemm", 3, GEMM_ONLY))


def _fused_conv(ctx: NodeContext):
    activation(ctx)
    y = CORE["Conv"].infer(core_context(ctx, "Conv", 3, CONV_ATTRS))
    if ctx.has_input(3) and (ctx.type(3).dtype != y[0].dtype or broadcast_shapes(ctx, y[0].shape, ctx.shape(3))
                             != tuple(y[0].shape)):
        raise ctx.error(f"Z {ctx.type(3)} must broadcast to the convolution's output {y[0]}")
    return y


FUSED_GEMM_ATTRS = {"alpha": Float(1.0), "beta": Float(1.0), "transA": Flag(0), "transB": Flag(0),
                    "activation": String("Relu", GEMM_ACTIVATIONS), "activation_alpha": Float(),
                    "activation_beta": Float(), "activation_gamma": Float()}
FUSED_CONV_ATTRS = CONV_ATTRS | {"activation": String("Relu", CONV_ACTIVATIONS), "activation_params": Floats()}

OPS = OPS + (
    OpDef("FusedGemm", _fused_gemm, domain=MS, since=1, kind="lowered", attrs=FUSED_GEMM_ATTRS,
          doc="Gemm then an activation (activation_alpha/_beta/_gamma its parameters): ORT's "
              "GemmActivationFusion in optimized inference models; no gradient rule"),
    OpDef("FusedConv", _fused_conv, domain=MS, since=1, kind="lowered", attrs=FUSED_CONV_ATTRS,
          doc="Conv (+ Z) then an activation (activation_params: LeakyRelu alpha, HardSigmoid alpha beta, Clip "
              "min max): ORT's ConvActivationFusion in optimized inference models; no gradient rule"),
)
