"""Run an ONNX graph with PyTorch ops, so torch.autograd can serve as the gradient oracle.

Only the ops of the bench models (and their losses) are mapped; each maps to the torch op of the same
meaning, never to edgetrain code.
"""
from __future__ import annotations

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper


def _attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _ints(t):
    return [int(v) for v in t.reshape(-1).tolist()]


def _pads(p, rank):
    """ONNX pads (begins..., ends...) -> torch's F.pad order (last dim first)."""
    out = []
    for d in reversed(range(rank)):
        out += [p[d], p[d + rank]]
    return out


def _conv(x, w, b=None, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1, **_):
    x = F.pad(x, _pads(list(pads), len(strides)))
    fn = F.conv2d if x.dim() == 4 else F.conv1d
    return fn(x, w, b, stride=tuple(strides), dilation=tuple(dilations), groups=group)


def _maxpool(x, kernel_shape, strides=None, pads=None, **_):
    rank = len(kernel_shape)
    if pads is not None and any(pads):
        x = F.pad(x, _pads(list(pads), rank), value=float("-inf"))
    return F.max_pool2d(x, tuple(kernel_shape), tuple(strides or kernel_shape))


def _batchnorm(x, scale, b, mean, var, epsilon=1e-5, momentum=0.9, training_mode=0, **_):
    return F.batch_norm(x, mean.clone(), var.clone(), scale, b, bool(training_mode), 1 - momentum, epsilon)


def _gemm(a, b, c=None, transA=0, transB=0, alpha=1.0, beta=1.0):
    y = alpha * ((a.T if transA else a) @ (b.T if transB else b))
    return y + beta * c if c is not None else y


def _sce(scores, labels, weight=None, reduction="mean", ignore_index=-100):
    return F.cross_entropy(scores, labels, weight=weight, reduction=reduction, ignore_index=ignore_index)


def _slice(x, starts, ends, axes=None, steps=None):
    starts, ends = _ints(starts), _ints(ends)
    axes = list(range(len(starts))) if axes is None else _ints(axes)
    steps = [1] * len(starts) if steps is None else _ints(steps)
    index = [slice(None)] * x.dim()
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[a] = slice(s, min(e, x.shape[a]) if e >= 0 else e, st)
    return x[tuple(index)]


def _layernorm(x, scale, b=None, axis=-1, epsilon=1e-5, **_):
    axis = axis % x.dim()
    return F.layer_norm(x, x.shape[axis:], scale, b, epsilon)


def _reshape(x, shape, allowzero=0):
    shape = [x.shape[i] if d == 0 and not allowzero else d for i, d in enumerate(_ints(shape))]
    return x.reshape(shape)


OPS = {
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
    "Div": lambda a, b: a / b if a.is_floating_point() else torch.div(a, b, rounding_mode="trunc"),
    "Mod": lambda a, b, fmod=0: torch.fmod(a, b) if fmod else torch.remainder(a, b),
    "Relu": F.relu, "Erf": torch.erf, "Sqrt": torch.sqrt,
    "Clip": lambda x, lo=None, hi=None: torch.clamp(x, lo, hi),
    "Gemm": _gemm, "MatMul": torch.matmul, "Conv": _conv, "MaxPool": _maxpool,
    "GlobalAveragePool": lambda x: x.mean(dim=tuple(range(2, x.dim())), keepdim=True),
    "Flatten": lambda x, axis=1: x.reshape(int(np.prod(x.shape[:axis])), -1),
    "BatchNormalization": _batchnorm, "LayerNormalization": _layernorm,
    "Softmax": lambda x, axis=-1: torch.softmax(x, axis),
    "Cast": lambda x, to: x.to({1: torch.float32, 7: torch.int64, 11: torch.float64}[to]),
    "Transpose": lambda x, perm=None: x.permute(*(perm or reversed(range(x.dim())))),
    "Reshape": _reshape, "Shape": lambda x: torch.tensor(x.shape, dtype=torch.int64),
    "Unsqueeze": lambda x, axes: x.reshape([*x.shape[:_ints(axes)[0] % (x.dim() + 1)], 1,
                                            *x.shape[_ints(axes)[0] % (x.dim() + 1):]]) if len(_ints(axes)) == 1
    else _multi_unsqueeze(x, _ints(axes)),
    "Squeeze": lambda x, axes=None: x.squeeze() if axes is None else _squeeze(x, _ints(axes)),
    "Concat": lambda *xs, axis: torch.cat(xs, axis),
    "Slice": _slice,
    "Gather": lambda x, idx, axis=0: torch.index_select(x, axis, idx.reshape(-1)).reshape(
        [*x.shape[:axis], *idx.shape, *x.shape[axis + 1:]]),
    "ReduceMean": lambda x, axes=None, keepdims=1: x.mean(dim=tuple(axes), keepdim=bool(keepdims)),
    "Dropout": lambda x, ratio=None, training=None, seed=None: (x, torch.ones_like(x, dtype=torch.bool)),
    "SoftmaxCrossEntropyLoss": _sce,
}


def _multi_unsqueeze(x, axes):
    rank = x.dim() + len(axes)
    for a in sorted(a % rank for a in axes):
        x = x.unsqueeze(a)
    return x


def _squeeze(x, axes):
    for a in sorted((a % x.dim() for a in axes), reverse=True):
        x = x.squeeze(a)
    return x


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], params: dict[str, np.ndarray], dtype=torch.float64):
    """(outputs, {param: leaf tensor with requires_grad}) — call backward on an output to get gradients."""
    values = {}
    for t in model.graph.initializer:
        values[t.name] = torch.tensor(numpy_helper.to_array(t))
    leaves = {}
    for name, a in params.items():
        leaves[name] = torch.tensor(a, dtype=dtype, requires_grad=True)
        values[name] = leaves[name]
    for name, a in feeds.items():
        values[name] = torch.tensor(a)
    for k, v in list(values.items()):
        if v.is_floating_point() and k not in leaves:
            values[k] = v.to(dtype)
    for node in model.graph.node:
        attrs = _attrs(node)
        if node.op_type == "Constant":
            v = torch.tensor(numpy_helper.to_array(attrs["value"]))
            values[node.output[0]] = v.to(dtype) if v.is_floating_point() else v
            continue
        if node.op_type == "Cast" and attrs.get("to") == 1 and dtype == torch.float64:
            attrs["to"] = 11    # keep float64 through the whole float64 reference run
        args = [values[i] if i else None for i in node.input]
        while args and args[-1] is None:
            args.pop()
        if node.op_type in ("Unsqueeze", "Squeeze", "ReduceMean") and len(args) > 1:
            attrs["axes"] = args.pop(1)
        if node.op_type in ("ReduceMean",) and "axes" in attrs and not isinstance(attrs["axes"], (list, tuple)):
            attrs["axes"] = _ints(attrs["axes"])
        if node.op_type == "Reshape":
            args[1] = args[1]
        out = OPS[node.op_type](*args, **attrs)
        outs = out if isinstance(out, tuple) else (out,)
        for name, v in zip(node.output, outs):
            if name:
                values[name] = v
    return [values[o.name] for o in model.graph.output], leaves


def loss_and_gradients(model_path, feeds: dict, params: dict, dtype=torch.float64):
    """Cross-entropy loss of a bench model's output against feeds['labels'], and d loss / d params."""
    from onnx import helper
    forward = onnx.load(str(model_path))
    forward.graph.node.append(helper.make_node("SoftmaxCrossEntropyLoss", [forward.graph.output[0].name, "labels"],
                                               ["loss"]))
    del forward.graph.output[:]
    forward.graph.output.append(helper.make_empty_tensor_value_info("loss"))
    (loss,), leaves = run(forward, feeds, params, dtype=dtype)
    loss.backward()
    return loss.item(), {p: leaf.grad.numpy() for p, leaf in leaves.items()}
