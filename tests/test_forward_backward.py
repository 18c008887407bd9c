"""ForwardBackward and the torch layer: outputs and gradients against torch autograd on the same layer
written in torch, and against central differences in float64."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

from edgetrain.errors import InputError
from edgetrain.forward_backward import ForwardBackward, get_train_initializer
from edgetrain.torch import ONNXLayer

ONNX_TYPE = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}


def make_model(nodes, inputs: dict[str, tuple], outputs: list[str], inits: dict[str, np.ndarray],
               dtype=np.float32):
    graph = helper.make_graph(
        nodes, "net", [helper.make_tensor_value_info(k, ONNX_TYPE[np.dtype(dtype)], s) for k, s in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _r(rng, *shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


# one small net per op family: (nodes, inputs, outputs, initializers, the same net in torch)
def _elementwise(rng):
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"]), helper.make_node("Sigmoid", ["m"], ["s"]),
             helper.make_node("Add", ["s", "b"], ["a"]), helper.make_node("Tanh", ["a"], ["t"]),
             helper.make_node("Mul", ["t", "x"], ["y"]), helper.make_node("Exp", ["w"], ["ew"]),
             helper.make_node("Div", ["y", "ew"], ["z"])]
    inits = {"w": _r(rng, 5), "b": _r(rng, 5)}
    return nodes, {"x": ["N", 5]}, ["z"], inits, lambda x, w, b: (
        torch.tanh(torch.sigmoid(x * w) + b) * x / torch.exp(w),)


def _matmul(rng):
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Gemm", ["r", "V", "c"], ["y"], transB=1)]
    inits = {"W": _r(rng, 6, 7), "b": _r(rng, 7), "V": _r(rng, 3, 7), "c": _r(rng, 3)}
    return nodes, {"x": ["N", 6]}, ["y"], inits, lambda x, W, b, V, c: (F.relu(x @ W + b) @ V.T + c,)


def _conv_pool(rng):
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("AveragePool", ["p"], ["q"], kernel_shape=[2, 2], strides=[1, 1]),
             helper.make_node("Flatten", ["q"], ["f"]),
             helper.make_node("Gemm", ["f", "V", "c0"], ["y"], transB=1)]
    inits = {"W": _r(rng, 4, 2, 3, 3, scale=0.5), "B": _r(rng, 4), "V": _r(rng, 3, 4 * 3 * 3), "c0": _r(rng, 3)}

    def net(x, W, B, V, c0):
        q = F.avg_pool2d(F.max_pool2d(F.relu(F.conv2d(x, W, B, padding=1)), 2), 2, stride=1)
        return (q.flatten(1) @ V.T + c0,)
    return nodes, {"x": ["N", 2, 8, 8]}, ["y"], inits, net


def _normalization(rng):
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["l"], axis=-1),
             helper.make_node("Gemm", ["l", "W", "c"], ["h"]),
             helper.make_node("BatchNormalization", ["h", "s", "t", "mean", "var"], ["y"], training_mode=1)]
    inits = {"g": _r(rng, 6), "b": _r(rng, 6), "W": _r(rng, 6, 4), "c": _r(rng, 4), "s": _r(rng, 4),
             "t": _r(rng, 4), "mean": np.zeros(4, np.float32), "var": np.ones(4, np.float32)}

    def net(x, g, b, W, c, s, t):
        h = F.layer_norm(x, (6,), g, b) @ W + c
        return (F.batch_norm(h, None, None, s, t, training=True),)
    return nodes, {"x": ["N", 6]}, ["y"], inits, net


def _softmax_reduce(rng):
    nodes = [helper.make_node("Gemm", ["x", "W"], ["h"]), helper.make_node("Softmax", ["h"], ["p"], axis=-1),
             helper.make_node("LogSoftmax", ["h"], ["lp"], axis=-1), helper.make_node("Mul", ["p", "lp"], ["e"]),
             helper.make_node("ReduceMean", ["e", "ax"], ["y"], keepdims=1)]
    inits = {"W": _r(rng, 5, 4), "ax": np.array([1], np.int64)}
    return nodes, {"x": ["N", 5]}, ["y"], inits, lambda x, W: (
        (torch.softmax(x @ W, -1) * torch.log_softmax(x @ W, -1)).mean(1, keepdim=True),)


def _tensor(rng):
    nodes = [helper.make_node("Gemm", ["x", "W"], ["h"]), helper.make_node("Reshape", ["h", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Slice", ["t", "st", "en", "axs"], ["s"]),
             helper.make_node("Concat", ["s", "t"], ["c"], axis=1), helper.make_node("Sigmoid", ["c"], ["y"])]
    inits = {"W": _r(rng, 4, 6), "shape": np.array([0, 2, 3], np.int64), "st": np.array([1], np.int64),
             "en": np.array([3], np.int64), "axs": np.array([1], np.int64)}

    def net(x, W):
        t = (x @ W).reshape(-1, 2, 3).transpose(1, 2)
        return (torch.sigmoid(torch.cat([t[:, 1:3], t], 1)),)
    return nodes, {"x": ["N", 4]}, ["y"], inits, net


FAMILIES = {"elementwise": _elementwise, "matmul": _matmul, "conv_pool": _conv_pool,
            "normalization": _normalization, "softmax_reduce": _softmax_reduce, "tensor": _tensor}
INPUT_SHAPES = {"elementwise": (4, 5), "matmul": (4, 6), "conv_pool": (3, 2, 8, 8), "normalization": (5, 6),
                "softmax_reduce": (4, 5), "tensor": (4, 4)}


def _torch_grads(net, x, weights: dict[str, np.ndarray], gy: list[np.ndarray]):
    xt = torch.tensor(x, requires_grad=True)
    wt = {k: torch.tensor(v, requires_grad=True) for k, v in weights.items()}
    outs = net(xt, **wt)
    torch.autograd.backward(outs, [torch.tensor(g) for g in gy])
    return [o.detach().numpy() for o in outs], {"x": xt.grad.numpy()} | {k: t.grad.numpy() for k, t in wt.items()}


def _close(got, want, what, tol=2e-4):
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg=what)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gradients_match_torch_autograd(family):
    rng = np.random.default_rng(1)
    nodes, inputs, outputs, inits, net = FAMILIES[family](rng)
    fb = ForwardBackward(make_model(nodes, inputs, outputs, inits), input_grads=["x"])
    x = _r(rng, *INPUT_SHAPES[family])
    outs, ctx = fb.forward({"x": x})
    gy = [_r(rng, *o.shape) for o in outs]
    grads = fb.backward(ctx, gy)
    want_outs, want = _torch_grads(net, x, fb.weights, gy)
    for got, exp in zip(outs, want_outs):
        _close(got, exp, f"{family} output")
    assert list(grads) == ["x"] + fb.weight_names
    for name, g in grads.items():
        _close(g, want[name], f"{family} gradient of {name}")


def test_default_weights_are_float_initializers_that_get_a_gradient():
    rng = np.random.default_rng(2)
    nodes, inputs, outputs, inits, _ = _normalization(rng)
    m = make_model(nodes, inputs, outputs, inits)
    assert sorted(get_train_initializer(m)) == sorted(inits)
    # BatchNorm's running statistics reach no output differentiably: they stay constants
    assert ForwardBackward(m).weight_names == ["g", "b", "W", "c", "s", "t"]


def test_float64_gradients_match_central_differences():
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Gemm", ["x", "W", "b"], ["h"]), helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("MatMul", ["t", "V"], ["y"])]
    inits = {"W": _r(rng, 3, 4, dtype=np.float64), "b": _r(rng, 4, dtype=np.float64),
             "V": _r(rng, 4, 2, dtype=np.float64)}
    fb = ForwardBackward(make_model(nodes, {"x": ["N", 3]}, ["y"], inits, np.float64), input_grads=["x"])
    x = _r(rng, 2, 3, dtype=np.float64)
    (y,), ctx = fb.forward([x])
    c = _r(rng, *y.shape, dtype=np.float64)
    grads = fb.backward(ctx, [c])
    eps = 1e-6
    for name in ["x"] + fb.weight_names:
        base = x if name == "x" else fb.weights[name]
        numeric = np.zeros_like(base)
        for k in np.ndindex(base.shape):
            values = []
            for sign in (1, -1):
                moved = base.copy()
                moved[k] += sign * eps
                feeds = [moved] if name == "x" else [x]
                weights = fb.weights | ({name: moved} if name != "x" else {})
                values.append(float((fb.forward(feeds, training=False, weights=weights)[0][0] * c).sum()))
            numeric[k] = (values[0] - values[1]) / (2 * eps)
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-6, atol=1e-8, err_msg=name)


def test_several_live_contexts_and_block_reuse():
    rng = np.random.default_rng(4)
    nodes, inputs, outputs, inits, net = _matmul(rng)
    fb = ForwardBackward(make_model(nodes, inputs, outputs, inits), input_grads=["x"])
    xs = [_r(rng, 4, 6) for _ in range(3)]
    pending = [fb.forward([x]) for x in xs]          # three forwards before any backward
    assert fb.blocks_made == 3 and fb.memory()["blocks"] == 3
    for x, (outs, ctx) in reversed(list(zip(xs, pending))):
        gy = [_r(rng, *outs[0].shape)]
        grads = fb.backward(ctx, gy)
        want = _torch_grads(net, x, fb.weights, gy)[1]
        for name, g in grads.items():
            _close(g, want[name], name)
    fb.forward([xs[0]])                              # blocks come back from the pool
    assert fb.blocks_made == 3
    m = fb.memory()
    saved = sum(-(-int(np.prod(s)) * 4 // 64) * 64 for s in [(4, 6), (6, 7), (3, 7), (4, 7)])
    assert m["context_bytes"] == saved               # x, W, V, the Relu output; each 64-byte aligned


def test_functional_weights_leave_held_weights_alone():
    rng = np.random.default_rng(5)
    nodes, inputs, outputs, inits, net = _matmul(rng)
    fb = ForwardBackward(make_model(nodes, inputs, outputs, inits))
    held = {k: v.copy() for k, v in fb.weights.items()}
    other = {k: _r(rng, *v.shape) for k, v in fb.weights.items()}
    x = _r(rng, 4, 6)
    outs, ctx = fb.forward([x], weights=other)
    gy = [_r(rng, *outs[0].shape)]
    grads = fb.backward(ctx, gy)
    want_outs, want = _torch_grads(net, x, other, gy)
    _close(outs[0], want_outs[0], "output")
    for name in fb.weight_names:
        _close(grads[name], want[name], name)
        np.testing.assert_array_equal(fb.weights[name], held[name])
    assert "x" not in grads


def test_inference_form_keeps_nothing():
    rng = np.random.default_rng(6)
    nodes = [helper.make_node("Gemm", ["x", "W"], ["h"]),
             helper.make_node("BatchNormalization", ["h", "s", "t", "mean", "var"], ["y"])]
    inits = {"W": _r(rng, 3, 4), "s": _r(rng, 4), "t": _r(rng, 4), "mean": _r(rng, 4),
             "var": np.abs(_r(rng, 4)) + 0.5}
    fb = ForwardBackward(make_model(nodes, {"x": ["N", 3]}, ["y"], inits))
    x = _r(rng, 5, 3)
    (y,), ctx = fb.forward([x], training=False)
    assert ctx is None and fb.blocks_made == 0
    want = F.batch_norm(torch.tensor(x @ inits["W"]), torch.tensor(inits["mean"]), torch.tensor(inits["var"]),
                        torch.tensor(inits["s"]), torch.tensor(inits["t"]), training=False)
    _close(y, want.numpy(), "eval output")


def test_refusals_name_the_thing():
    rng = np.random.default_rng(7)
    nodes, inputs, outputs, inits, _ = _matmul(rng)
    m = make_model(nodes, inputs, outputs, inits)
    with pytest.raises(InputError, match="'nope'"):
        ForwardBackward(m, weights=["nope"])
    with pytest.raises(InputError, match="input_grads.*'z'"):
        ForwardBackward(m, input_grads=["z"])
    fb = ForwardBackward(m)
    with pytest.raises(InputError, match="'x'.*dim 1"):
        fb.forward({"x": _r(rng, 4, 5)})
    with pytest.raises(InputError, match="unexpected.*'q'"):
        fb.forward({"x": _r(rng, 4, 6), "q": _r(rng, 1)})
    with pytest.raises(InputError, match="missing \\['V', 'c'\\]"):
        fb.forward([_r(rng, 4, 6)], weights={"W": inits["W"], "b": inits["b"]})
    outs, ctx = fb.forward([_r(rng, 4, 6)])
    with pytest.raises(InputError, match="gradient of output 'y'.*float\\[4,3\\]"):
        fb.backward(ctx, [_r(rng, 4, 2)])
    with pytest.raises(InputError, match="\\['w'\\] are not outputs"):
        fb.backward(ctx, {"w": outs[0]})
    fb.backward(ctx, [outs[0]])
    with pytest.raises(InputError, match="already used"):
        fb.backward(ctx, [outs[0]])
    with pytest.raises(InputError, match="this object's forward"):
        ForwardBackward(m).backward(fb.forward([_r(rng, 4, 6)])[1], [outs[0]])


def test_retain_keeps_the_context():
    rng = np.random.default_rng(8)
    nodes, inputs, outputs, inits, _ = _matmul(rng)
    fb = ForwardBackward(make_model(nodes, inputs, outputs, inits))
    outs, ctx = fb.forward([_r(rng, 4, 6)])
    first = fb.backward(ctx, [outs[0]], retain=True)
    second = fb.backward(ctx, [2 * outs[0]])
    for name in first:
        _close(second[name], 2 * first[name], name)
    assert not ctx.alive


# -- the torch layer -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["conv_pool", "normalization"])
def test_torch_layer_inside_a_torch_model(family):
    rng = np.random.default_rng(9)
    nodes, inputs, outputs, inits, net = FAMILIES[family](rng)
    layer = ONNXLayer(make_model(nodes, inputs, outputs, inits))
    x = torch.tensor(_r(rng, *INPUT_SHAPES[family]), requires_grad=True)
    pre = torch.nn.Parameter(torch.tensor(1.5))      # a torch parameter before the layer
    (layer(x * pre) ** 2).sum().backward()
    ref = {k: torch.tensor(v.detach().numpy(), requires_grad=True) for k, v in layer.named_weights().items()}
    xr = torch.tensor(x.detach().numpy(), requires_grad=True)
    pr = torch.nn.Parameter(torch.tensor(1.5))
    (net(xr * pr, **ref)[0] ** 2).sum().backward()
    _close(pre.grad.numpy(), pr.grad.numpy(), "parameter before the layer", tol=1e-3)
    _close(x.grad.numpy(), xr.grad.numpy(), "input")
    for name, w in layer.named_weights().items():
        _close(w.grad.numpy(), ref[name].grad.numpy(), name, tol=1e-3)


def _train(model: torch.nn.Module, data, steps: int, lr=0.02, momentum=0.9) -> list[float]:
    """SGD with momentum as torch.optim.SGD writes it (torch.optim itself costs seconds to import)."""
    params = list(model.parameters())
    buffers = [torch.zeros_like(p) for p in params]
    losses = []
    for k in range(steps):
        x, y = data[k % len(data)]
        for p in params:
            p.grad = None
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p, b in zip(params, buffers):
                b.mul_(momentum).add_(p.grad)
                p.sub_(lr * b)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("family", ["matmul", "conv_pool"])
def test_torch_layer_trains_like_torch(family):
    """An MLP / a CNN as an ONNX layer between torch layers, trained 20 steps: the same losses as the same
    model written in torch."""
    rng = np.random.default_rng(10)
    nodes, inputs, outputs, inits, net = FAMILIES[family](rng)
    inits = {k: v * np.float32(0.3) if v.dtype.kind == "f" else v for k, v in inits.items()}   # losses O(1)

    class Torch(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.ParameterDict({k: torch.nn.Parameter(torch.tensor(v)) for k, v in inits.items()
                                             if k in onnx_layer.weight_names})
            self.head = torch.nn.Linear(3, 4)

        def forward(self, x):
            return self.head(net(x, **self.w)[0])

    onnx_layer = ONNXLayer(make_model(nodes, inputs, outputs, inits))
    torch.manual_seed(0)
    ours = torch.nn.Sequential(onnx_layer, torch.nn.Linear(3, 4))
    torch.manual_seed(0)
    ref = Torch()
    ref.head.load_state_dict(ours[1].state_dict())
    shape = INPUT_SHAPES[family]
    data = [(torch.tensor(_r(rng, *shape)), torch.tensor(rng.integers(0, 4, shape[0]))) for _ in range(4)]
    got, want = _train(ours, data, 20), _train(ref, data, 20)
    assert max(got) < 5
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert np.mean(got[-4:]) < np.mean(got[:4])


def test_torch_layer_eval_mode_and_errors():
    rng = np.random.default_rng(11)
    nodes, inputs, outputs, inits, net = _matmul(rng)
    layer = ONNXLayer(make_model(nodes, inputs, outputs, inits)).eval()
    x = torch.tensor(_r(rng, 4, 6))
    y = layer(x)
    assert not y.requires_grad and layer.fb.blocks_made == 0
    _close(y.numpy(), net(x, **{k: torch.tensor(v) for k, v in inits.items()})[0].numpy(), "eval output")
    with pytest.raises(InputError, match="takes 1 input"):
        layer(x, x)


@pytest.mark.native
def test_import_edgetrain_stays_light():
    code = ("import sys, edgetrain; assert 'edgetrain.forward_backward' not in sys.modules; "
            "assert 'edgetrain.autodiff' not in sys.modules; assert edgetrain.ForwardBackward.__name__ "
            "== 'ForwardBackward'; assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)




def test_profile_counts_the_contexts():
    from edgetrain.profiling import profile_forward_backward
    rng = np.random.default_rng(12)
    nodes, inputs, outputs, inits, _ = _matmul(rng)
    fb = ForwardBackward(make_model(nodes, inputs, outputs, inits), input_grads=["x"])
    x = _r(rng, 8, 6)
    p = profile_forward_backward(fb, [x], steps=3, contexts=2)
    # saved: x, W, V and the Relu output, each rounded up to 64 bytes; recounted from the shapes
    saved = sum(-(-int(np.prod(s)) * 4 // 64) * 64 for s in [(8, 6), (6, 7), (3, 7), (8, 7)])
    assert p["context_bytes"] == saved and p["backward"].state == {"contexts": 2 * saved}
    assert fb.blocks_made == 2          # two contexts alive at once, then pooled
    weights = sum(v.nbytes for v in inits.values())
    assert p["forward"].state == {"weights": weights}
    assert p["planned_bytes"] >= p["forward"].arena_bytes + p["backward"].arena_bytes + weights + 2 * saved
    assert p["forward"].kernels >= 2 and p["backward"].kernels >= 3
    assert len(p["backward"].kernel_times) == len(fb.forward([x])[1].program.calls)


def test_an_output_read_downstream_and_a_missing_gradient():
    """y1 is an output and feeds y2: its gradient sums the given one and y2's; None stands for zeros."""
    rng = np.random.default_rng(13)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y1"]),
             helper.make_node("Sigmoid", ["y1"], ["y2"])]
    fb = ForwardBackward(make_model(nodes, {"x": ["N", 3]}, ["y1", "y2"], {"W": _r(rng, 3, 4)}),
                         input_grads=["x"])
    x = _r(rng, 5, 3)
    (y1, y2), ctx = fb.forward([x])
    g1, g2 = _r(rng, 5, 4), _r(rng, 5, 4)
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(fb.weights["W"], requires_grad=True)
    t1 = torch.relu(xt @ wt)
    t2 = torch.sigmoid(t1)
    torch.autograd.backward([t1, t2], [torch.tensor(g1), torch.tensor(g2)])
    _close(y1, t1.detach().numpy(), "y1")
    _close(y2, t2.detach().numpy(), "y2")
    grads = fb.backward(ctx, {"y1": g1, "y2": g2})
    _close(grads["x"], xt.grad.numpy(), "x")
    _close(grads["W"], wt.grad.numpy(), "W")
    _, ctx = fb.forward([x])
    only = fb.backward(ctx, {"y2": g2})                      # y1's gradient left out: zeros
    _, ctx = fb.forward([x])
    zeros = fb.backward(ctx, [np.zeros_like(g1), g2])
    for name in only:
        np.testing.assert_array_equal(only[name], zeros[name])


def test_integer_inputs_and_two_batch_sizes_at_once():
    """An embedding (Gather of int64 ids) in the torch layer; contexts of two batch sizes alive together."""
    rng = np.random.default_rng(14)
    nodes = [helper.make_node("Gather", ["E", "ids"], ["e"]),
             helper.make_node("ReduceMean", ["e", "ax"], ["y"], keepdims=0)]
    inits = {"E": _r(rng, 10, 4), "ax": np.array([1], np.int64)}
    graph = helper.make_graph(nodes, "emb", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", "T"])],
                              [helper.make_empty_tensor_value_info("y")],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    layer = ONNXLayer(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    assert layer.fb.input_grads == [] and layer.weight_names == ["E"]
    with pytest.raises(InputError, match="\\['ids'\\] are not floating-point inputs"):
        ONNXLayer(layer.fb.graph, input_grads=["ids"])
    ids = [torch.tensor(rng.integers(0, 10, (n, 3))) for n in (4, 2)]
    outs = [layer(i) for i in ids]                           # two shapes, both contexts alive
    (outs[0].sum() + 2 * outs[1].sum()).backward()
    E = torch.tensor(inits["E"], requires_grad=True)
    (E[ids[0]].mean(1).sum() + 2 * E[ids[1]].mean(1).sum()).backward()
    _close(layer.weights[0].grad.numpy(), E.grad.numpy(), "E")
    assert layer.fb.blocks_made == 2


def test_batchnorm_running_statistics_follow_training_forwards():
    """Each training forward replaces the held running statistics, as torch's BatchNorm in training mode; the
    inference form then reads them."""
    rng = np.random.default_rng(15)
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "t", "mean", "var"], ["y"], momentum=0.8,
                              training_mode=1)]
    inits = {"s": _r(rng, 3), "t": _r(rng, 3), "mean": _r(rng, 3), "var": np.abs(_r(rng, 3)) + 0.5}
    fb = ForwardBackward(make_model(nodes, {"x": ["N", 3]}, ["y"], inits))
    assert fb.weight_names == ["s", "t"] and sorted(fb.buffers) == ["mean", "var"]
    bn = torch.nn.BatchNorm1d(3, momentum=0.2)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor(inits["s"]))
        bn.bias.copy_(torch.tensor(inits["t"]))
        bn.running_mean.copy_(torch.tensor(inits["mean"]))
        bn.running_var.copy_(torch.tensor(inits["var"]))
    var = inits["var"].astype(np.float64)
    for _ in range(3):
        x = _r(rng, 6, 3) * 2 + 1
        (y,), ctx = fb.forward([x])
        ctx.release()
        _close(y, bn.train()(torch.tensor(x)).detach().numpy(), "training output")
        var = 0.8 * var + 0.2 * x.var(axis=0)      # ONNX's running variance: the biased batch variance
    _close(fb.buffers["mean"], bn.running_mean.numpy(), "running mean")
    _close(fb.buffers["var"], var, "running variance")     # (torch's takes the unbiased one)
    x = _r(rng, 4, 3)
    with torch.no_grad():
        bn.running_var.copy_(torch.tensor(var))
    _close(fb.forward([x], training=False)[0][0], bn.eval()(torch.tensor(x)).detach().numpy(), "eval output")
    with pytest.raises(InputError, match="\\['mean'\\] given both"):
        fb.forward({"x": x, "mean": inits["mean"]})


def test_torch_layer_statistics_are_torch_buffers():
    rng = np.random.default_rng(16)
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "t", "mean", "var"], ["y"], training_mode=1)]
    inits = {"s": _r(rng, 3), "t": _r(rng, 3), "mean": np.zeros(3, np.float32), "var": np.ones(3, np.float32)}
    layer = ONNXLayer(make_model(nodes, {"x": ["N", 3]}, ["y"], inits))
    x = torch.tensor(_r(rng, 8, 3) + 2)
    layer(x).sum().backward()
    state = layer.state_dict()
    assert layer.buffer_names == ["mean", "var"]
    np.testing.assert_allclose(state["statistic0"].numpy(), 0.1 * x.numpy().mean(0), rtol=1e-5)  # momentum 0.9
    state["statistic0"] = torch.zeros(3)
    layer.load_state_dict(state)
    np.testing.assert_array_equal(layer.fb.buffers["mean"], np.zeros(3, np.float32))
