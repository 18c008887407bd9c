"""An ONNX graph as a PyTorch layer: ``ONNXLayer(model)`` is an ``nn.Module`` whose forward and backward run
in edgetrain (``ForwardBackward``), so an ONNX sub-model trains inside a PyTorch model with a torch optimizer.

Optional: this is the only module of edgetrain that imports torch (install it yourself). The weights are
``nn.Parameter`` s of the layer, passed to edgetrain on each call (the functional form), so torch's
optimizers, ``state_dict`` and ``zero_grad`` work as for any layer. Tensors cross as numpy arrays (CPU only).
"""
from __future__ import annotations

import numpy as np
import torch

from .compact import load_graph
from .errors import InputError
from .forward_backward import ForwardBackward
from .ir import Graph


def _array(t: torch.Tensor) -> np.ndarray:
    if t.device.type != "cpu":
        raise InputError(f"edgetrain.torch runs on the CPU; got a tensor on {t.device}")
    return np.ascontiguousarray(t.detach().numpy())


class _Apply(torch.autograd.Function):
    """forward(fb, n_inputs, *inputs_then_weights) -> the graph's outputs; backward asks edgetrain."""

    @staticmethod
    def forward(ctx, fb: ForwardBackward, n_inputs: int, *tensors):
        inputs = [_array(t) for t in tensors[:n_inputs]]
        weights = {n: _array(t) for n, t in zip(fb.weight_names, tensors[n_inputs:])}
        outs, context = fb.forward(inputs, training=True, weights=weights)
        ctx.fb, ctx.context, ctx.n_inputs = fb, context, n_inputs
        results = tuple(torch.from_numpy(o) for o in outs)
        ctx.mark_non_differentiable(*[r for r in results if not r.is_floating_point()])
        return results

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grad_outputs):
        fb = ctx.fb
        grads = fb.backward(ctx.context, [None if g is None else _array(g) for g in grad_outputs])
        ctx.context = None
        inputs = [torch.from_numpy(grads[n]) if n in grads else None for n in fb.input_names[:ctx.n_inputs]]
        weights = [torch.from_numpy(grads[n]) for n in fb.weight_names]
        return (None, None, *inputs, *weights)


class ONNXLayer(torch.nn.Module):
    """An ONNX model as a layer: ``layer(*inputs)`` returns its output (a tuple if it has several).

    Parameters
    ----------
    model : path, bytes, ModelProto or edgetrain Graph
        A forward-only model; its weights become ``nn.Parameter`` s initialized from its initializers.
    weights : list of str, optional
        Initializers to train (default as ``ForwardBackward``: every float initializer that gets a gradient).
    input_grads : list of str, optional
        Inputs whose gradient flows back to the layers before it (default: every floating-point input).

    In training mode (``layer.train()``, the default) a call that needs gradients keeps a context for
    backward; in eval mode the layer runs the inference form (Dropout off, BatchNorm on running statistics)
    and passes no gradient, as under ``torch.no_grad()``.
    """

    def __init__(self, model, weights=None, input_grads=None, max_memory=None):
        super().__init__()
        graph = model if isinstance(model, Graph) else load_graph(model)
        if input_grads is None:
            input_grads = [v.name for v in graph.inputs if np.dtype(v.type.dtype).kind == "f"]
        self.fb = ForwardBackward(graph, weights=weights, input_grads=input_grads, max_memory=max_memory)
        self.weight_names = list(self.fb.weight_names)
        # weight names ("fc1.weight") are not valid attribute names: keep them in order in a list
        self.weights = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.from_numpy(np.array(self.fb.weights[n]))) for n in self.weight_names])
        # running statistics: torch buffers over the very arrays edgetrain updates, so state_dict() and
        # load_state_dict() see and set them
        self.buffer_names = list(self.fb.buffers)
        for k, n in enumerate(self.buffer_names):
            self.register_buffer(f"statistic{k}", torch.from_numpy(self.fb.buffers[n]))

    def named_weights(self) -> dict[str, torch.nn.Parameter]:
        """The ONNX initializer name of each parameter."""
        return dict(zip(self.weight_names, self.weights))

    def forward(self, *inputs):
        if len(inputs) != len(self.fb.input_names):
            raise InputError(f"the layer takes {len(self.fb.input_names)} input(s) {self.fb.input_names}, "
                             f"got {len(inputs)}")
        needs = torch.is_grad_enabled() and (any(w.requires_grad for w in self.weights)
                                             or any(t.requires_grad for t in inputs))
        if needs and self.training:
            outs = _Apply.apply(self.fb, len(inputs), *inputs, *self.weights)
        else:
            weights = {n: _array(w) for n, w in zip(self.weight_names, self.weights)}
            arrays, context = self.fb.forward([_array(t) for t in inputs], training=self.training,
                                              weights=weights)
            if context is not None:
                context.release()
            outs = tuple(torch.from_numpy(o) for o in arrays)
        return outs[0] if len(outs) == 1 else outs
