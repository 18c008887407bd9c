"""BatchNormalization, LayerNormalization, GroupNormalization, InstanceNormalization against onnxruntime and
the ONNX reference evaluator; their gradient rules and gradient ops against finite differences and torch."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gradcheck import check_directional, check_gradients, gradient_session
from onnx import helper
from oracle import assert_matches, model, run_edgetrain, run_onnxruntime, run_reference

from edgetrain.autodiff.builder import gradient_graph, prepare_for_training, with_gradients
from edgetrain.errors import ShapeError, UnsupportedOpError
from edgetrain.ir import Graph, Node, TensorType, Value
from edgetrain.onnx_io import from_graph

pytestmark = pytest.mark.arm64   # also on the emulated arm64 stage (.ci/run, README "Platforms")

FLOATS = [np.float32, np.float64]


def _rand(rng, shape, dtype, low=None):
    x = rng.standard_normal(shape) if low is None else rng.uniform(low, low + 1.0, shape)
    return x.astype(dtype)


# --- BatchNormalization -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 4, 3, 5)])
@pytest.mark.parametrize("const_params", [False, True])
def test_batch_norm_inference(dtype, shape, const_params):
    rng = np.random.default_rng(1)
    c = shape[1]
    x = _rand(rng, shape, dtype)
    params = {"s": _rand(rng, c, dtype), "b": _rand(rng, c, dtype), "m": _rand(rng, c, dtype),
              "v": _rand(rng, c, dtype, low=0.5)}
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)
    feeds = {"x": x} if const_params else {"x": x, **params}
    m = model(node, feeds, ["y"], initializers=params if const_params else None, opset=15)
    assert_matches(m, feeds, oracle=run_onnxruntime)
    assert_matches(m, feeds, oracle=run_reference)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(6, 3), (3, 2, 7), (2, 4, 3, 5)])
def test_batch_norm_training_three_outputs(dtype, shape):
    rng = np.random.default_rng(2)
    c = shape[1]
    feeds = {"x": _rand(rng, shape, dtype) * 3 + 1, "s": _rand(rng, c, dtype), "b": _rand(rng, c, dtype),
             "m": _rand(rng, c, dtype), "v": _rand(rng, c, dtype, low=0.5)}
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"],
                            training_mode=1, momentum=0.7, epsilon=1e-4)
    m = model(node, feeds, ["y", "rm", "rv"], opset=15)
    assert_matches(m, feeds, oracle=run_onnxruntime)
    assert_matches(m, feeds, oracle=run_reference)


def test_batch_norm_training_running_var_is_biased():
    """running_var uses the biased batch variance (as the ONNX reference and onnxruntime do)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 2, 3))
    feeds = {"x": x, "s": np.ones(2), "b": np.zeros(2), "m": np.zeros(2), "v": np.ones(2)}
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1)
    _, rm, rv = run_edgetrain(model(node, feeds, ["y", "rm", "rv"], opset=15), feeds)
    np.testing.assert_allclose(rm, 0.1 * x.mean(axis=(0, 2)), rtol=1e-12)
    np.testing.assert_allclose(rv, 0.9 + 0.1 * x.var(axis=(0, 2)), rtol=1e-12)


def test_batch_norm_training_optional_outputs_omitted():
    rng = np.random.default_rng(4)
    feeds = {"x": _rand(rng, (4, 3, 2), np.float32), "s": _rand(rng, 3, np.float32),
             "b": _rand(rng, 3, np.float32), "m": _rand(rng, 3, np.float32), "v": _rand(rng, 3, np.float32, 0.5)}
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "", "rv"], training_mode=1)
    assert_matches(model(node, feeds, ["y", "rv"], opset=15), feeds, oracle=run_reference)  # onnxruntime segfaults


def test_batch_norm_running_outputs_need_training_mode():
    x = np.zeros((2, 3), np.float32)
    p = np.ones(3, np.float32)
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"])
    m = model(node, {"x": x}, ["y", "rm", "rv"], initializers=dict(s=p, b=p, m=p, v=p), opset=15)
    with pytest.raises(ShapeError, match="training_mode"):
        run_edgetrain(m, {"x": x})


# --- LayerNormalization -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("axis", [-1, 1, 0, -2])
@pytest.mark.parametrize("n_out", [1, 3])
def test_layer_norm(dtype, axis, n_out):
    rng = np.random.default_rng(5)
    shape = (3, 4, 6)
    norm_shape = shape[axis % 3:]
    feeds = {"x": _rand(rng, shape, dtype) * 2 + 0.5}
    inits = {"s": _rand(rng, norm_shape, dtype), "b": _rand(rng, norm_shape, dtype)}
    outs = ["y", "mean", "inv"][:n_out]
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], outs, axis=axis, epsilon=1e-3)
    m = model(node, feeds, outs, initializers=inits, opset=17)
    assert_matches(m, feeds, oracle=run_onnxruntime)
    if dtype == np.float32 or n_out == 1:   # the reference keeps Mean/InvStdDev in X's type, not stash_type's
        assert_matches(m, feeds, oracle=run_reference)


def test_layer_norm_no_bias_input_scale():
    rng = np.random.default_rng(6)
    feeds = {"x": _rand(rng, (5, 8), np.float32), "s": _rand(rng, (8,), np.float32)}
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y", "", "inv"])
    assert_matches(model(node, feeds, ["y", "inv"], opset=17), feeds, oracle=run_onnxruntime)


def test_layer_norm_stash_type_sets_stat_dtype():
    x = np.random.default_rng(7).standard_normal((2, 3))
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean", "inv"])
    y, mean, inv = run_edgetrain(model(node, {"x": x}, ["y", "mean", "inv"], initializers={"s": np.ones(3)}), {"x": x})
    assert y.dtype == np.float64 and mean.dtype == inv.dtype == np.float32 and mean.shape == (2, 1)


def test_layer_norm_rejects_broadcast_scale():
    x = np.zeros((2, 3, 4), np.float32)
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y"], axis=1)
    m = model(node, {"x": x}, ["y"], initializers={"s": np.ones(4, np.float32)})
    with pytest.raises(ShapeError, match="normalized shape"):
        run_edgetrain(m, {"x": x})


# --- GroupNormalization / InstanceNormalization -----------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("shape,groups", [((2, 6, 5), 3), ((2, 4, 3, 3), 2), ((3, 4, 2), 4), ((2, 6), 1)])
def test_group_norm(dtype, opset, shape, groups):
    rng = np.random.default_rng(8)
    k = shape[1] if opset >= 21 else groups
    feeds = {"x": _rand(rng, shape, dtype) * 2 - 1, "s": _rand(rng, k, dtype), "b": _rand(rng, k, dtype)}
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=groups, epsilon=1e-3)
    m = model(node, feeds, ["y"], opset=opset)
    assert_matches(m, feeds, oracle=run_reference)
    assert_matches(m, feeds, oracle=run_onnxruntime)


def test_group_norm_groups_must_divide_channels():
    x = np.zeros((1, 6, 2), np.float32)
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=4)
    m = model(node, {"x": x}, ["y"], initializers={"s": np.ones(4, np.float32), "b": np.ones(4, np.float32)},
              opset=18)
    with pytest.raises(ShapeError, match="num_groups 4"):
        run_edgetrain(m, {"x": x})


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 2, 4)])
def test_instance_norm(dtype, shape):
    rng = np.random.default_rng(9)
    c = shape[1]
    feeds = {"x": _rand(rng, shape, dtype) + 3}
    inits = {"s": _rand(rng, c, dtype), "b": _rand(rng, c, dtype)}
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-4)
    m = model(node, feeds, ["y"], initializers=inits, opset=17)
    assert_matches(m, feeds, oracle=run_reference)
    if dtype == np.float32:   # onnxruntime has no double InstanceNormalization
        assert_matches(m, feeds, oracle=run_onnxruntime)


@pytest.mark.parametrize("op", ["LayerNormalization", "InstanceNormalization"])
def test_float32_stats_survive_a_large_offset(op):
    """Mean and variance accumulate in float64: a float32 input of 1e4 + N(0, 1e-2) normalizes to ~1e-5."""
    rng = np.random.default_rng(10)
    x64 = 1e4 + rng.standard_normal((2, 3, 512)) * 1e-2
    x = x64.astype(np.float32)
    inits = {"s": np.ones(512 if op == "LayerNormalization" else 3, np.float32),
             "b": np.zeros(512 if op == "LayerNormalization" else 3, np.float32)}
    (y,) = run_edgetrain(model(helper.make_node(op, ["x", "s", "b"], ["y"], epsilon=1e-12), {"x": x}, ["y"],
                               initializers=inits), {"x": x})
    xd = x.astype(np.float64)
    want = (xd - xd.mean(-1, keepdims=True)) / np.sqrt(xd.var(-1, keepdims=True) + 1e-12)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


# --- gradients -----------------------------------------------------------------------------------------------
# Rules against finite differences (float64), the gradient kernels and rules against torch.autograd (float32
# data), BatchNormInternal against onnxruntime, and a dot-product test at MobileNet's BatchNorm shapes.

F64 = np.float64


def _t(shape, dtype=F64):
    return TensorType(np.dtype(dtype), tuple(shape))


def _bn_node(outputs=("y",), **attrs):
    return Node("BatchNormalization", ["x", "s", "b", "m", "v"], list(outputs), attrs, "bn")


def _bn_params(shape, dtype=F64, seed=0):
    rng = np.random.default_rng(seed)
    c = shape[1]
    return {"x": (rng.standard_normal(shape) * 1.5 + 0.5).astype(dtype), "s": rng.standard_normal(c).astype(dtype),
            "b": rng.standard_normal(c).astype(dtype), "m": rng.standard_normal(c).astype(dtype),
            "v": rng.uniform(0.5, 1.5, c).astype(dtype)}


@pytest.mark.parametrize("outputs", [("y",), ("y", "rm", "rv")], ids=["y", "y-running"])
def test_batch_norm_training_rule(outputs):
    p = _bn_params((4, 3, 2, 3))
    check_gradients([_bn_node(outputs, training_mode=1, epsilon=1e-3, momentum=0.8)],
                    {k: p[k] for k in "xsb"}, ["y"], [_t((4, 3, 2, 3))], consts={k: p[k] for k in "mv"}, opset=15)


@pytest.mark.parametrize("wrt", ["xsbmv", "sb"])
def test_batch_norm_inference_rule(wrt):
    """Frozen statistics (fine-tuning a pretrained BatchNorm): scale/B, and X and the statistics themselves."""
    p = _bn_params((4, 3, 2, 3), seed=1)
    check_gradients([_bn_node(epsilon=1e-3)], {k: p[k] for k in wrt}, ["y"], [_t((4, 3, 2, 3))],
                    consts={k: v for k, v in p.items() if k not in wrt}, opset=15)


def test_batch_norm_inference_rule_float32_statistics_and_2d_params():
    """Statistics of another element type (cast in the rule) and a [1, C] scale (dScale reshaped back)."""
    p = _bn_params((5, 3), seed=2)
    consts = {"m": p["m"].astype(np.float32), "v": p["v"].astype(np.float32)}
    params = {"x": p["x"], "s": p["s"].reshape(1, 3), "b": p["b"]}
    check_gradients([_bn_node(epsilon=1e-3)], params, ["y"], [_t((5, 3))], consts=consts, opset=15)


@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_rule(axis, bias):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 4)) * 2 + 1
    norm = x.shape[axis % 3:]
    params = {"x": x, "s": rng.standard_normal(norm)}
    inputs = ["x", "s"]
    if bias:
        params["b"] = rng.standard_normal(norm)
        inputs.append("b")
    node = Node("LayerNormalization", inputs, ["y"], {"axis": axis, "epsilon": 1e-3, "stash_type": 11}, "ln")
    check_gradients([node], params, ["y"], [_t(x.shape)], opset=17)


def test_layer_norm_rule_float32_stash_and_broadcast_shaped_params():
    """Default stash_type (float32 Mean/InvStdDev for float64 X) and a [1, n] scale beside an [n] bias."""
    rng = np.random.default_rng(4)
    params = {"x": rng.standard_normal((3, 5)), "s": rng.standard_normal((1, 5)), "b": rng.standard_normal(5)}
    node = Node("LayerNormalization", ["x", "s", "b"], ["y"], {}, "ln")
    check_gradients([node], params, ["y"], [_t((3, 5))], opset=17, rtol=1e-4)


@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("shape", [(2, 6, 5), (2, 6, 2, 2), (3, 6)], ids=str)
def test_group_norm_rule(opset, shape):
    rng = np.random.default_rng(5)
    k = shape[1] if opset >= 21 else 3
    params = {"x": rng.standard_normal(shape) * 2 - 1, "s": rng.standard_normal(k), "b": rng.standard_normal(k)}
    node = Node("GroupNormalization", ["x", "s", "b"], ["y"], {"num_groups": 3, "epsilon": 1e-3}, "gn")
    check_gradients([node], params, ["y"], [_t(shape)], opset=opset)


@pytest.mark.parametrize("opset", [17, 18])   # ReduceMean's axes: attribute before 18, input from 18
def test_instance_norm_rule(opset):
    rng = np.random.default_rng(6)
    params = {"x": rng.standard_normal((2, 3, 2, 3)) + 2, "s": rng.standard_normal(3), "b": rng.standard_normal(3)}
    node = Node("InstanceNormalization", ["x", "s", "b"], ["y"], {"epsilon": 1e-3}, "in")
    check_gradients([node], params, ["y"], [_t((2, 3, 2, 3))], opset=opset)


def test_group_norm_rule_only_bias():
    """A frozen scale: only dB is emitted, without recomputing the statistics."""
    rng = np.random.default_rng(7)
    node = Node("GroupNormalization", ["x", "s", "b"], ["y"], {"num_groups": 2}, "gn")
    grads = check_gradients([node], {"b": rng.standard_normal(4)}, ["y"], [_t((2, 4, 3))], opset=21,
                            consts={"x": rng.standard_normal((2, 4, 3)), "s": rng.standard_normal(4)})
    assert grads["b"].shape == (4,)


# --- the gradient ops' kernels against torch.autograd ------------------------------------------------------------

def _torch_grads(fn, arrays: dict, dy: np.ndarray) -> dict:
    """d sum(fn(**arrays) * dy) / d each array, in float64 (the oracle is more precise than float32)."""
    leaves = {k: torch.tensor(v.astype(np.float64), requires_grad=True) for k, v in arrays.items()}
    (fn(**leaves) * torch.tensor(dy.astype(np.float64))).sum().backward()
    return {k: v.grad.numpy() for k, v in leaves.items()}


def _close(ours, want, what, rtol=1e-4):
    np.testing.assert_allclose(ours, want, rtol=rtol, atol=rtol * np.abs(want).max(), err_msg=what)


@pytest.mark.parametrize("shape", [(8, 4, 3, 5), (16, 5), (2, 3, 7)], ids=str)
@pytest.mark.parametrize("outputs", [("dx", "ds", "db"), ("", "ds", ""), ("dx",)], ids=["all", "ds", "dx"])
def test_batch_norm_grad_kernel_against_torch(shape, outputs):
    rng = np.random.default_rng(8)
    f32 = np.float32
    c, eps = shape[1], 1e-3
    x = (rng.standard_normal(shape) * 2 + 3).astype(f32)
    s, b = rng.standard_normal(c).astype(f32), rng.standard_normal(c).astype(f32)
    dy = rng.standard_normal(shape).astype(f32)
    axes = (0,) + tuple(range(2, len(shape)))
    xd = x.astype(np.float64)
    saved_mean = xd.mean(axis=axes).astype(f32)
    saved_inv_std = (1 / np.sqrt(xd.var(axis=axes) + eps)).astype(f32)
    feeds = {"dy": dy, "x": x, "s": s, "sm": saved_mean, "si": saved_inv_std}
    node = helper.make_node("BatchNormalizationGrad", ["dy", "x", "s", "sm", "si"], list(outputs),
                            domain="com.microsoft", epsilon=eps)
    named = [o for o in outputs if o]
    ours = dict(zip(named, run_edgetrain(model(node, feeds, named, opset=15), feeds)))
    want = _torch_grads(lambda x, s, b: F.batch_norm(x, None, None, s, b, True, 0.1, eps), {"x": x, "s": s, "b": b},
                        dy)
    for name, key in (("dx", "x"), ("ds", "s"), ("db", "b")):
        if name in ours:
            assert ours[name].dtype == f32
            _close(ours[name], want[key], name)


@pytest.mark.parametrize("axis", [-1, 1, 2])
@pytest.mark.parametrize("outputs", [("dx", "ds", "db"), ("dx", "ds"), ("", "ds", "db")], ids=["all", "no-db", "no-dx"])
def test_layer_norm_grad_kernel_against_torch(axis, outputs):
    rng = np.random.default_rng(9)
    f32 = np.float32
    shape, eps = (4, 5, 6), 1e-4
    norm = shape[axis % 3:]
    x = (rng.standard_normal(shape) * 2 - 1).astype(f32)
    s, b = rng.standard_normal(norm).astype(f32), rng.standard_normal(norm).astype(f32)
    dy = rng.standard_normal(shape).astype(f32)
    axes = tuple(range(axis % 3, 3))
    xd = x.astype(np.float64)
    mean = xd.mean(axis=axes, keepdims=True).astype(f32)
    inv = (1 / np.sqrt(xd.var(axis=axes, keepdims=True) + eps)).astype(f32)
    feeds = {"dy": dy, "x": x, "s": s, "mean": mean, "inv": inv}
    node = helper.make_node("LayerNormalizationGrad", ["dy", "x", "s", "mean", "inv"], list(outputs),
                            domain="com.microsoft", axis=axis, epsilon=eps)
    named = [o for o in outputs if o]
    ours = dict(zip(named, run_edgetrain(model(node, feeds, named, opset=17), feeds)))
    want = _torch_grads(lambda x, s, b: F.layer_norm(x, norm, s, b, eps), {"x": x, "s": s, "b": b}, dy)
    for name, key in (("dx", "x"), ("ds", "s"), ("db", "b")):
        if name in ours:
            assert ours[name].shape == want[key].shape and ours[name].dtype == f32
            _close(ours[name], want[key], name)


def _rule_grads(node, params, consts, out_shape, opset):
    """Gradients of sum(Y * C) from edgetrain's training graph, and the random cotangent C it used."""
    dtype = next(iter(params.values())).dtype
    sess, graph = gradient_session([node], params, consts, ["y"], [_t(out_shape, dtype)], opset)
    return dict(zip(params, sess.run(None, dict(params))[1:])), graph.initializers["cot_0"]


def _rule_case(op, rng):
    """(node, params, consts, opset, torch function of the params) for one rule, float32."""
    f32 = np.float32
    x = (rng.standard_normal((6, 4, 3, 3)) * 2 + 1).astype(f32)
    c4 = lambda: rng.standard_normal(4).astype(f32)
    if op == "BatchNormalization":
        m, v = c4(), rng.uniform(0.5, 1.5, 4).astype(f32)
        node = _bn_node(training_mode=1, epsilon=1e-3)
        return (node, {"x": x, "s": c4(), "b": c4()}, {"m": m, "v": v}, 15,
                lambda x, s, b: F.batch_norm(x, None, None, s, b, True, 0.1, 1e-3))
    if op == "GroupNormalization-18":
        node = Node("GroupNormalization", ["x", "s", "b"], ["y"], {"num_groups": 2, "epsilon": 1e-3}, "gn")
        per_group = {"x": x, "s": rng.standard_normal(2).astype(f32), "b": rng.standard_normal(2).astype(f32)}
        return (node, per_group, {}, 18,
                lambda x, s, b: F.group_norm(x, 2, s.repeat_interleave(2), b.repeat_interleave(2), 1e-3))
    if op == "GroupNormalization-21":
        node = Node("GroupNormalization", ["x", "s", "b"], ["y"], {"num_groups": 2, "epsilon": 1e-3}, "gn")
        return node, {"x": x, "s": c4(), "b": c4()}, {}, 21, lambda x, s, b: F.group_norm(x, 2, s, b, 1e-3)
    node = Node("InstanceNormalization", ["x", "s", "b"], ["y"], {"epsilon": 1e-3}, "in")
    return (node, {"x": x, "s": c4(), "b": c4()}, {}, 17,
            lambda x, s, b: F.instance_norm(x, weight=s, bias=b, eps=1e-3))


@pytest.mark.parametrize("op", ["BatchNormalization", "GroupNormalization-18", "GroupNormalization-21",
                                "InstanceNormalization"])
def test_rules_against_torch_float32(op):
    node, params, consts, opset, fn = _rule_case(op, np.random.default_rng(10))
    ours, cot = _rule_grads(node, params, consts, params["x"].shape, opset)
    want = _torch_grads(fn, params, cot)
    for k in params:
        _close(ours[k], want[k], f"d{k}", rtol=2e-4)


@pytest.mark.parametrize("op", ["GroupNormalization-18", "GroupNormalization-21", "InstanceNormalization"])
def test_plain_op_gradient_graphs_run_in_onnxruntime(op):
    """GroupNorm/InstanceNorm gradients are plain ONNX ops: onnxruntime runs edgetrain's training graph."""
    node, params, consts, opset, _ = _rule_case(op, np.random.default_rng(11))
    sess, graph = gradient_session([node], params, consts, ["y"], [_t(params["x"].shape, np.float32)], opset)
    train = from_graph(with_gradients(graph, "loss", list(params)))
    assert {n.domain for n in train.graph.node} <= {"", "ai.onnx"}
    ours = sess.run(None, dict(params))
    for k, (a, b) in enumerate(zip(ours, run_onnxruntime(train, dict(params)))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(b).max(), err_msg=f"output {k}")


# --- BatchNormInternal and the training forms --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(4, 3, 2, 3), (6, 5)], ids=str)
def test_batch_norm_internal_forward(dtype, shape):
    """Y and the running statistics as onnxruntime's training-mode BatchNormalization; saved_mean and
    saved_inv_std = 1 / sqrt(biased batch variance + epsilon) as numpy computes them."""
    p = _bn_params(shape, dtype, seed=12)
    eps, momentum = 1e-3, 0.7
    internal = helper.make_node("BatchNormInternal", ["x", "s", "b", "m", "v"], ["y", "rm", "rv", "sm", "si"],
                                domain="com.microsoft", epsilon=eps, momentum=momentum, training_mode=1)
    y, rm, rv, sm, si = run_edgetrain(model(internal, p, ["y", "rm", "rv", "sm", "si"], opset=15), p)
    bn = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], epsilon=eps,
                          momentum=momentum, training_mode=1)
    want = run_onnxruntime(model(bn, p, ["y", "rm", "rv"], opset=15), p)
    for name, a, b in zip(("Y", "running_mean", "running_var"), (y, rm, rv), want):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)
    axes = (0,) + tuple(range(2, len(shape)))
    xd = p["x"].astype(np.float64)
    assert sm.dtype == si.dtype == np.dtype(dtype) and sm.shape == si.shape == (shape[1],)
    np.testing.assert_allclose(sm, xd.mean(axis=axes), rtol=1e-6)
    np.testing.assert_allclose(si, 1 / np.sqrt(xd.var(axis=axes) + eps), rtol=1e-6)


def test_batch_norm_internal_optional_outputs():
    p = _bn_params((3, 2, 4), np.float32, seed=13)
    internal = helper.make_node("BatchNormInternal", ["x", "s", "b", "m", "v"], ["y", "", "", "sm", "si"],
                                domain="com.microsoft")   # training_mode defaults to 1, epsilon to 1e-5
    y, sm, si = run_edgetrain(model(internal, p, ["y", "sm", "si"], opset=15), p)
    xd = p["x"].astype(np.float64)
    want = (xd - xd.mean((0, 2), keepdims=True)) / np.sqrt(xd.var((0, 2), keepdims=True) + 1e-5)
    want = want * p["s"][:, None] + p["b"][:, None]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sm, xd.mean((0, 2)), rtol=1e-6)
    np.testing.assert_allclose(si, 1 / np.sqrt(xd.var((0, 2)) + 1e-5), rtol=1e-6)


def _graph(nodes, params, outputs, opset=17):
    inputs = [Value(k, _t(v.shape, v.dtype)) for k, v in params.items()]
    return Graph(nodes, inputs, [Value(o, _t((), F64)) for o in outputs], {}, {"": opset})


def test_training_forms():
    """Training-mode BatchNormalization -> BatchNormInternal with 5 outputs (Y, running_mean, running_var keep
    their names); inference-mode BatchNormalization stays; LayerNormalization gets Mean and InvStdDev."""
    p = _bn_params((2, 3, 4))
    nodes = [_bn_node(("y", "rm"), training_mode=1, momentum=0.8), _bn_node(("y0",)),
             Node("LayerNormalization", ["y", "s2"], ["z"], {"axis": 1}, "ln")]
    nodes[1] = Node(nodes[1].op_type, nodes[1].inputs, nodes[1].outputs, {}, "bn0")
    prepared = prepare_for_training(_graph(nodes, {**p, "s2": np.ones((3, 4))}, ["z", "y0"], opset=15))
    bn, bn0, ln = prepared.nodes
    assert (bn.domain, bn.op_type) == ("com.microsoft", "BatchNormInternal")
    assert bn.outputs[:2] == ["y", "rm"] and all(bn.outputs[2:]) and len(bn.outputs) == 5
    assert bn.attrs == {"training_mode": 1, "momentum": 0.8}
    assert (bn0.domain, bn0.op_type, bn0.outputs) == ("", "BatchNormalization", ["y0"])
    assert ln.outputs[0] == "z" and len(ln.outputs) == 3 and all(ln.outputs)
    assert prepared.opsets.get("com.microsoft") == 1


def test_rules_emit_onnxruntime_gradient_ops():
    p = _bn_params((2, 3, 4))
    bn = prepare_for_training(_graph([_bn_node(training_mode=1)], p, ["y"], opset=15))
    nodes, _, _ = gradient_graph(bn, "y", ["x", "s"])
    grad = next(n for n in nodes if n.op_type == "BatchNormalizationGrad")
    assert grad.domain == "com.microsoft" and grad.inputs[1:] == ["x", "s"] + bn.nodes[0].outputs[3:]
    assert grad.outputs[0] and grad.outputs[1] and grad.outputs[2] == ""   # B needs no gradient
    assert grad.attrs == {"epsilon": 1e-5}
    p = {"x": p["x"], "s": np.ones((3, 4))}
    ln = prepare_for_training(_graph([Node("LayerNormalization", ["x", "s"], ["y"], {"axis": 1}, "ln")], p, ["y"]))
    nodes, _, _ = gradient_graph(ln, "y", ["x"])
    grad = next(n for n in nodes if n.op_type == "LayerNormalizationGrad")
    assert grad.inputs[1:] == ["x", "s"] + ln.nodes[0].outputs[1:] and grad.attrs == {"axis": 1}
    assert grad.outputs[0] and grad.outputs[1:] == ["", ""]


def test_loss_through_layer_norm_statistics_is_refused():
    p = {"x": np.random.default_rng(14).standard_normal((3, 4)), "s": np.ones(4)}
    g = prepare_for_training(_graph([Node("LayerNormalization", ["x", "s"], ["y", "mean"], {}, "ln")], p, ["mean"]))
    with pytest.raises(UnsupportedOpError, match="Mean or InvStdDev"):
        gradient_graph(g, "mean", ["x"])


def test_batch_norm_directional_at_mobilenet_shapes():
    """Dot-product test of training-mode BatchNorm at a MobileNet block's shape, in float64: in float32 the
    difference quotient of a 131k-term loss is rounding noise for the small bias (4% off on the arm64 stage,
    whose reductions sum in another order); float32 kernels are checked against torch elsewhere."""
    rng = np.random.default_rng(15)
    f64 = np.float64
    params = {"x": rng.standard_normal((16, 32, 16, 16)) * 0.5 + 0.2, "s": 1 + 0.1 * rng.standard_normal(32),
              "b": 0.1 * rng.standard_normal(32)}
    consts = {"m": np.zeros(32, f64), "v": np.ones(32, f64)}
    check_directional([_bn_node(training_mode=1)], params, ["y"], [_t((16, 32, 16, 16), f64)], consts=consts,
                      opset=15)


def test_rules_with_a_symbolic_batch():
    """BatchNorm (training) -> Tanh -> GroupNorm -> Tanh -> InstanceNorm on X [N, 4, 3, 3] with N symbolic: the
    rules use no probe sizes (reshapes by 0/-1, runtime shapes), so one training graph serves every batch size."""
    import edgetrain
    rng = np.random.default_rng(16)
    f64 = np.float64
    params = {k: rng.standard_normal(n).astype(f64) for k, n in
              (("s1", 4), ("b1", 4), ("s2", 2), ("b2", 2), ("s3", 4), ("b3", 4))}
    consts = {"m": np.zeros(4, f64), "v": np.ones(4, f64), "w": rng.standard_normal((1, 4, 3, 3)).astype(f64)}
    nodes = [Node("BatchNormalization", ["x", "s1", "b1", "m", "v"], ["y1"], {"training_mode": 1}, "bn"),
             Node("Tanh", ["y1"], ["t1"], {}, "tanh1"),
             Node("GroupNormalization", ["t1", "s2", "b2"], ["y2"], {"num_groups": 2}, "gn"),
             Node("Tanh", ["y2"], ["t2"], {}, "tanh2"),
             Node("InstanceNormalization", ["t2", "s3", "b3"], ["y3"], {}, "in"),
             Node("Mul", ["y3", "w"], ["yw"], {}, "mul"),
             Node("ReduceSum", ["yw"], ["loss"], {"keepdims": 0}, "sum")]
    graph = Graph(nodes, [Value("x", TensorType(np.dtype(f64), ("N", 4, 3, 3)))], [Value("loss", _t((), f64))],
                  {**params, **consts}, {"": 18})
    sess = edgetrain.InferenceSession(from_graph(with_gradients(graph, "loss", list(params))).SerializeToString())

    def reference(x, s1, b1, s2, b2, s3, b3):
        y = F.batch_norm(x, None, None, s1, b1, True, 0.1, 1e-5)
        y = F.group_norm(torch.tanh(y), 2, s2.repeat_interleave(2), b2.repeat_interleave(2), 1e-5)
        return F.instance_norm(torch.tanh(y), weight=s3, bias=b3, eps=1e-5) * torch.tensor(consts["w"], dtype=torch.float64)

    for n in (2, 5):
        x = (rng.standard_normal((n, 4, 3, 3)) * 2 + 1).astype(f64)
        ours = dict(zip(params, sess.run(None, {"x": x, **params})[1:]))
        want = _torch_grads(reference, {"x": x, **params}, np.ones((n, 4, 3, 3)))
        for k in params:
            _close(ours[k], want[k], f"N={n} d{k}", rtol=1e-7)


# --- LpNormalization -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_lp_normalization_against_onnxruntime(p, axis):
    """(The ONNX reference evaluator's p=1 disagrees with the spec's x / sum|x|; onnxruntime follows it.)"""
    x = np.random.default_rng(p + 10 * (axis + 1)).standard_normal((3, 4, 5)).astype(np.float32)
    assert_matches(model(helper.make_node("LpNormalization", ["x"], ["y"], axis=axis, p=p), {"x": x}, ["y"]),
                   {"x": x}, oracle=run_onnxruntime)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("opset", [17, 18])
def test_lp_normalization_gradient_matches_torch(p, opset):
    """Against torch.nn.functional.normalize (the same x / ||x||_p away from a zero norm), and by finite
    differences; opset 17 and 18 put the gradient's reduction axes in an attribute and an input."""
    x = np.random.default_rng(p).standard_normal((3, 4))
    check_gradients([Node("LpNormalization", ["x"], ["y"], {"axis": 1, "p": p}, "lp")], {"x": x}, ["y"],
                    [TensorType(np.float64, (3, 4))], opset=opset)
    cot = np.random.default_rng(9).standard_normal((3, 4))
    sess, _ = gradient_session([Node("LpNormalization", ["x"], ["y"], {"axis": 1, "p": p}, "lp")], {"x": x}, {},
                               ["y"], [TensorType(np.float64, (3, 4))], opset=opset, seed=9)
    (_, dx) = sess.run(None, {"x": x})
    xt = torch.tensor(x, requires_grad=True)
    (F.normalize(xt, p=p, dim=1, eps=0.0) * torch.tensor(cot)).sum().backward()
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-10, atol=1e-12)


# --- LRN ------------------------------------------------------------------------------------------------------

LRN_CASES = [((2, 5, 3, 4), dict(size=3)), ((2, 6, 3, 2), dict(size=4, alpha=0.01, beta=0.6, bias=2.0)),
             ((1, 4, 2, 2), dict(size=1)), ((2, 3, 2, 2), dict(size=7, alpha=0.5, beta=1.2, bias=0.5))]


@pytest.mark.parametrize("shape,attrs", LRN_CASES)
def test_lrn_against_onnxruntime(shape, attrs):
    x = np.random.default_rng(len(shape) + attrs["size"]).standard_normal(shape).astype(np.float32) * 3
    m = model(helper.make_node("LRN", ["x"], ["y"], **attrs), {"x": x}, ["y"], opset=13)
    # onnxruntime takes odd sizes only, and the reference evaluator loops over N instead of C: for even sizes
    # the spec's formula in naive loops
    oracle = run_onnxruntime if attrs["size"] % 2 else (lambda m, feeds: [_lrn_naive(feeds["x"], **attrs)])
    assert_matches(m, {"x": x}, oracle=oracle, rtol=1e-5, atol=1e-6)


def _lrn_naive(x, size, alpha=1e-4, beta=0.75, bias=1.0):
    y = np.empty_like(x)
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    for c in range(x.shape[1]):
        window = x[:, max(0, c - lo):min(x.shape[1], c + hi + 1)].astype(np.float64)
        y[:, c] = x[:, c] / (bias + alpha / size * (window ** 2).sum(axis=1)) ** beta
    return y


@pytest.mark.parametrize("shape,attrs", LRN_CASES)
def test_lrn_gradient_by_finite_differences(shape, attrs):
    x = np.random.default_rng(attrs["size"]).standard_normal(shape) * 2
    check_gradients([Node("LRN", ["x"], ["y"], attrs, "lrn")], {"x": x}, ["y"], [TensorType(np.float64, shape)],
                    opset=13, samples=8)


def test_lrn_gradient_like_torch():
    """torch's window matches ONNX's for odd sizes (torch sums the squares by an average pool: 1e-7 apart)."""
    x = np.random.default_rng(3).standard_normal((2, 7, 3, 3)) * 2
    attrs = dict(size=5, alpha=0.3, beta=0.9, bias=1.5)
    sess, graph = gradient_session([Node("LRN", ["x"], ["y"], attrs, "lrn")], {"x": x}, {}, ["y"],
                                   [TensorType(np.float64, x.shape)], opset=13)
    t = torch.from_numpy(x).requires_grad_()
    y = F.local_response_norm(t, 5, alpha=0.3, beta=0.9, k=1.5)
    (y * torch.from_numpy(graph.initializers["cot_0"])).sum().backward()
    np.testing.assert_allclose(sess.run(None, {"x": x})[1], t.grad.numpy(), rtol=1e-6, atol=1e-9)
