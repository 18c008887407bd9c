"""BatchNormalization, LayerNormalization, GroupNormalization, InstanceNormalization against onnxruntime and
the ONNX reference evaluator."""
import numpy as np
import pytest
from onnx import helper

from edgetrain.errors import ShapeError
from oracle import assert_matches, model, run_edgetrain, run_onnxruntime, run_reference

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
