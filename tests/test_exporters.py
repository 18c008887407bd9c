"""Models as today's PyTorch exports them (issue 13, item 2): the legacy TorchScript exporter and the default
dynamo one (needs onnxscript). Each architecture makes artifacts, trains, and exports an inference model that
onnxruntime runs. Oracles: torch's loss on the same batch and weights (eval mode, before training), and
onnxruntime's InferenceSession on the exported model after training."""
import numpy as np
import pytest
from exported_models import BUILDERS, build, export

from edgetrain import artifacts
from edgetrain.api import CheckpointState, Module, Optimizer
from edgetrain.cli.artifacts import statistics_buffers
from edgetrain.onnx_io import load_model, to_graph

pytestmark = pytest.mark.native   # torch + onnxscript: not on the emulated arm64 stage


def _torch_loss(w, torch):
    with torch.no_grad():
        out = w.model.eval()(*(torch.from_numpy(v) for v in w.inputs.values()))
        labels = torch.from_numpy(w.labels)
        loss = (torch.nn.functional.cross_entropy(out, labels) if w.loss == "CrossEntropyLoss"
                else torch.nn.functional.mse_loss(out, labels))
    w.model.train()
    return float(loss)


def _numpy_loss(out, w):
    if w.loss == "MSELoss":
        return float(np.mean((out - w.labels) ** 2))
    shifted = out - out.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(w.labels)), w.labels].mean())


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
@pytest.mark.parametrize("name", list(BUILDERS))
def test_exported_model_trains_and_exports_for_onnxruntime(name, exporter, tmp_path):
    torch = pytest.importorskip("torch")
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")
    import onnxruntime

    w = build(name)
    path = tmp_path / "model.onnx"
    export(w, path, exporter)
    if w.opset is not None and w.opset >= 23 and exporter == "dynamo":     # SDPA is written as ONNX's Attention,
        assert "Attention" in {n.op_type for n in load_model(str(path)).graph.node}  # run through its body
    graph = to_graph(str(path))
    params = {n for n, _ in w.model.named_parameters()}
    # the dynamo exporter folds the gate reordering of recurrent weights into new constants (val_*): they are
    # the recurrent layers' parameters in the ONNX model
    recurrent = {i for n in graph.nodes if n.op_type in ("LSTM", "GRU", "RNN") for i in n.inputs[1:4]}
    trainable = [n for n in graph.initializers if n in params or n in recurrent]
    assert trainable, f"no initializer of the {exporter} export is named after a parameter: {list(graph.initializers)}"
    art = tmp_path / "artifacts"
    artifacts.generate_artifacts(str(path), requires_grad=trainable, frozen_params=sorted(statistics_buffers(graph)),
                                 loss=artifacts.LossType[w.loss], optimizer=artifacts.OptimType.AdamW,
                                 artifact_directory=art)
    state = CheckpointState.load_checkpoint(art / "checkpoint")
    module = Module(art / "training_model.onnx", state, art / "eval_model.onnx")
    optimizer = Optimizer(art / "optimizer_model.onnx", module)
    feeds = list(w.inputs.values())

    module.eval()
    np.testing.assert_allclose(float(module(*feeds, w.labels)), _torch_loss(w, torch), rtol=1e-4, atol=1e-5)

    module.train()
    optimizer.set_learning_rate(1e-2)
    losses = []
    for _ in range(25):
        losses.append(float(module(*feeds, w.labels)))
        optimizer.step()
        module.lazy_reset_grad()
    assert np.isfinite(losses).all() and losses[-1] < 0.8 * losses[0], losses

    module.eval()
    trained = float(module(*feeds, w.labels))
    inference = tmp_path / "inference.onnx"
    module.export_model_for_inferencing(inference, ["output"])
    session = onnxruntime.InferenceSession(str(inference), providers=["CPUExecutionProvider"])
    out = session.run(None, dict(zip(w.inputs, feeds)))[0]
    np.testing.assert_allclose(_numpy_loss(out, w), trained, rtol=1e-4, atol=1e-5)
