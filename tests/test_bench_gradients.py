"""The training graph of every bench model gives the same loss and gradients as PyTorch's autograd."""
import numpy as np
import onnx
import pytest
import torch
import torch_ref
from conftest import BENCH_MODELS
from trainrun import train_step

import edgetrain.onnxblock as onnxblock


class _CrossEntropy(onnxblock.TrainingBlock):
    def __init__(self):
        super().__init__()
        self._loss = onnxblock.loss.CrossEntropyLoss()

    def build(self, output):
        return self._loss(output)


def _feeds(model, rng):
    feeds = {}
    for i in model.graph.input:
        if i.name in {t.name for t in model.graph.initializer}:
            continue
        dims = [d.dim_value or 8 for d in i.type.tensor_type.shape.dim]
        feeds[i.name] = (rng.integers(0, 100, dims) if i.type.tensor_type.elem_type == 7
                         else rng.standard_normal(dims).astype(np.float32))
    return feeds


@pytest.mark.parametrize("name", BENCH_MODELS)
def test_bench_model_gradients_match_pytorch(shared, name):
    model = onnx.load(str(shared / "models" / f"{name}.onnx"))
    rng = np.random.default_rng(0)
    params = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer
              if t.data_type == 1 and "running" not in t.name}
    frozen = [t.name for t in model.graph.initializer if "running" in t.name]
    block = _CrossEntropy()
    for p in params:
        block.requires_grad(p)
    for p in frozen:
        block.requires_grad(p, False)
    with onnxblock.base(model):
        block(model.graph.output[0].name)
        train, _ = block.to_model_proto()
    feeds = _feeds(model, rng)
    classes = model.graph.output[0].type.tensor_type.shape.dim[1].dim_value
    batch = next(iter(feeds.values())).shape[0]
    feeds["labels"] = rng.integers(0, classes, batch)
    running = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name in frozen}
    loss, grads = train_step(train, feeds | running, params)

    # the oracle: torch autograd in float64; the bar: torch's own float32 error against it (at least 1e-4
    # of the largest gradient), since edgetrain computes in float32 too
    path = shared / "models" / f"{name}.onnx"
    expected, want = torch_ref.loss_and_gradients(path, feeds, params, dtype=torch.float64)
    _, want32 = torch_ref.loss_and_gradients(path, feeds, params, dtype=torch.float32)
    np.testing.assert_allclose(float(loss.reshape(())), expected, rtol=1e-5, atol=1e-6)
    for p in params:
        scale = np.abs(want[p]).max() + 1e-12
        torch32_error = np.abs(want32[p] - want[p]).max() / scale
        error = np.abs(grads[p] - want[p]).max() / scale
        assert error <= max(1e-4, 2 * torch32_error), f"{p}: error {error:.2e}, torch float32 {torch32_error:.2e}"
