"""GridSample: forward against onnxruntime (every mode, padding and align_corners, grids reaching outside the
image), gradients (GridSampleGrad: dX and dgrid) against torch.nn.functional.grid_sample's autograd and by
finite differences; a non-finite grid coordinate reads padding, never memory outside X."""
import numpy as np
import pytest
from onnx import helper
from oracle import assert_matches, model, run_edgetrain

from edgetrain.errors import ShapeError
from edgetrain.ir import Node, TensorType

MODES = ("linear", "nearest", "cubic")
PADDINGS = ("zeros", "border", "reflection")
TORCH_MODE = {"linear": "bilinear", "nearest": "nearest", "cubic": "bicubic"}


def _case(dtype=np.float32, seed=0, shape=(2, 3, 4, 5), out=(3, 4)):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dtype)
    grid = rng.uniform(-1.6, 1.6, (shape[0],) + out + (2,)).astype(dtype)   # some points outside the image
    return x, grid


def _node(mode, pad, align, opset_mode=None):
    return helper.make_node("GridSample", ["x", "g"], ["y"], mode=opset_mode or mode, padding_mode=pad,
                            align_corners=align)


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("pad", PADDINGS)
@pytest.mark.parametrize("mode", MODES)
def test_grid_sample_against_onnxruntime(mode, pad, align):
    from oracle import run_onnxruntime
    x, grid = _case(seed=len(mode) + 3 * len(pad) + align)
    m = model(_node(mode, pad, align), {"x": x, "g": grid}, ["y"], opset=22)
    assert_matches(m, {"x": x, "g": grid}, oracle=run_onnxruntime, rtol=1e-5, atol=1e-5)


def test_grid_sample_opset16_spelling_and_default_mode():
    from oracle import run_onnxruntime
    x, grid = _case(seed=7)
    for node in (_node("bilinear", "border", 0), _node("bicubic", "zeros", 1),
                 helper.make_node("GridSample", ["x", "g"], ["y"])):
        m = model(node, {"x": x, "g": grid}, ["y"], opset=16)
        assert_matches(m, {"x": x, "g": grid}, oracle=run_onnxruntime, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("pad", PADDINGS)
@pytest.mark.parametrize("mode", MODES)
def test_grid_sample_gradients_like_torch(mode, pad, align):
    import torch
    from gradcheck import gradient_session
    x, grid = _case(np.float64, seed=11, shape=(2, 2, 4, 5), out=(3, 3))
    node = Node("GridSample", ["x", "g"], ["y"], {"mode": mode, "padding_mode": pad, "align_corners": align}, "gs")
    sess, graph = gradient_session([node], {"x": x, "g": grid}, {}, ["y"], [TensorType(np.float64, (2, 2, 3, 3))],
                                   opset=22)
    _, dx, dgrid = sess.run(None, {"x": x, "g": grid})
    tx, tg = torch.from_numpy(x).requires_grad_(), torch.from_numpy(grid).requires_grad_()
    y = torch.nn.functional.grid_sample(tx, tg, mode=TORCH_MODE[mode], padding_mode=pad, align_corners=bool(align))
    (y * torch.from_numpy(graph.initializers["cot_0"])).sum().backward()
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dgrid, tg.grad.numpy(), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_grid_sample_gradients_by_finite_differences(mode):
    from gradcheck import check_gradients
    x, grid = _case(np.float64, seed=5, shape=(1, 2, 4, 4), out=(2, 3))
    grid = np.clip(grid, -0.9, 0.9)     # inside, away from the border kinks
    check_gradients([Node("GridSample", ["x", "g"], ["y"], {"mode": mode, "align_corners": 0}, "gs")],
                    {"x": x, "g": grid}, ["y"], [TensorType(np.float64, (1, 2, 2, 3))], opset=22, samples=8)


@pytest.mark.parametrize("pad", PADDINGS)
@pytest.mark.parametrize("mode", MODES)
def test_non_finite_or_huge_grid_stays_inside_x(mode, pad):
    """Coordinates from data: NaN, inf and 1e30 never index outside X. With zero padding they read zeros; border
    clamps 1e30 to the edge pixels as torch does (onnxruntime overflows its integer pixel indices there)."""
    import torch
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4) + 1
    grid = np.array([[[[np.nan, 0.0], [np.inf, -np.inf], [1e30, -1e30], [0.0, 0.0]]]], np.float32)
    m = model(_node(mode, pad, 0), {"x": x, "g": grid}, ["y"], opset=22)
    y = run_edgetrain(m, {"x": x, "g": grid})[0]
    assert y.shape == (1, 1, 1, 4)
    assert np.all(np.isnan(y) | ((y >= 0) & (y <= 16 * 1.5)))     # cubic weights overshoot a little
    if pad == "zeros":
        assert np.all(y[0, 0, 1:3] == 0)
    finite = np.array([[[[1e30, -1e30], [0.3, -0.2]]]], np.float32)
    m2 = model(_node(mode, pad, 0), {"x": x, "g": finite}, ["y"], opset=22)
    if mode != "cubic" or pad == "zeros":      # cubic taps at 1e30 lose all precision in float32 either way
        want = torch.nn.functional.grid_sample(torch.from_numpy(x), torch.from_numpy(finite), mode=TORCH_MODE[mode],
                                               padding_mode=pad, align_corners=False).numpy()
        np.testing.assert_allclose(run_edgetrain(m2, {"x": x, "g": finite})[0], want, rtol=1e-5, atol=1e-5)


def test_volumetric_grid_is_refused_by_name():
    x = np.zeros((1, 1, 2, 2, 2), np.float32)
    grid = np.zeros((1, 1, 1, 1, 3), np.float32)
    m = model(_node("linear", "zeros", 0), {"x": x, "g": grid}, ["y"], opset=22)
    with pytest.raises(ShapeError, match="GridSample.*2-D"):
        run_edgetrain(m, {"x": x, "g": grid})


def test_a_learned_flow_field_trains_through_artifacts(tmp_path):
    """A warp by a trainable flow field (the optical-flow / spatial-transformer pattern): generate_artifacts
    writes GridSampleGrad with an ai.edgetrain opset import, and training steps lower the loss."""
    import onnx
    from onnx import TensorProto, numpy_helper

    from edgetrain import artifacts
    from edgetrain.api import CheckpointState, Module, Optimizer
    rng = np.random.default_rng(0)
    ys, xs = np.meshgrid(np.linspace(-1, 1, 3), np.linspace(-1, 1, 3), indexing="ij")
    inits = [numpy_helper.from_array((rng.standard_normal((1, 3, 3, 2)) * 0.1).astype(np.float32), "flow"),
             numpy_helper.from_array(np.stack([xs, ys], -1)[None].astype(np.float32), "base")]
    nodes = [helper.make_node("Add", ["base", "flow"], ["grid"]),
             helper.make_node("GridSample", ["x", "grid"], ["s"], padding_mode="border"),
             helper.make_node("Flatten", ["s"], ["out"])]
    g = helper.make_graph(nodes, "warp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 9])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)
    artifacts.generate_artifacts(m, requires_grad=["flow"], frozen_params=["base"], loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=tmp_path)
    training = onnx.load(tmp_path / "training_model.onnx")
    assert ("ai.edgetrain", 1) in [(o.domain, o.version) for o in training.opset_import]
    assert "GridSampleGrad" in [n.op_type for n in training.graph.node]
    module = Module(tmp_path / "training_model.onnx", CheckpointState.load_checkpoint(tmp_path / "checkpoint"))
    opt = Optimizer(tmp_path / "optimizer_model.onnx", module)
    x, target = rng.standard_normal((1, 1, 4, 4)).astype(np.float32), rng.standard_normal((1, 9)).astype(np.float32)
    module.train()
    losses = []
    for _ in range(5):
        losses.append(float(np.asarray(module(x, target))))
        opt.step()
        module.lazy_reset_grad()
    assert losses[-1] < losses[0]
