"""Public options that no other test runs, each once with a numeric check against torch or a numpy formula:
generate_artifacts' four LossTypes and loss=None, the nominal-checkpoint flow and the command line's
artifacts/train/eval/export options (in subprocesses). onnxblock.optim.AdamW's non-default arguments are in
tests/ops/test_training.py."""
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

from edgetrain import artifacts
from edgetrain.api import CheckpointState, Module, Optimizer
from edgetrain.errors import EdgetrainError

RNG = np.random.default_rng(20)
PARAMS = {"fc1.weight": (RNG.standard_normal((5, 4)) * 0.5).astype(np.float32),
          "fc1.bias": (RNG.standard_normal(5) * 0.1).astype(np.float32),
          "fc2.weight": (RNG.standard_normal((2, 5)) * 0.5).astype(np.float32),
          "fc2.bias": (RNG.standard_normal(2) * 0.1).astype(np.float32)}
X = RNG.standard_normal((12, 4)).astype(np.float32)


def tiny(tail=()) -> onnx.ModelProto:
    """x[N, 4] -> Gemm -> Relu (output 'hidden') -> Gemm -> output[N, 2] (then the ``tail`` nodes, if any)."""
    nodes = [helper.make_node("Gemm", ["input", "fc1.weight", "fc1.bias"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["hidden"]),
             helper.make_node("Gemm", ["hidden", "fc2.weight", "fc2.bias"], ["output"], transB=1), *tail]
    out = tail[-1].output[0] if tail else "output"
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("input", 1, ["N", 4])],
                              [helper.make_empty_tensor_value_info(out)],
                              [numpy_helper.from_array(v, k) for k, v in PARAMS.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def torch_forward(x, params):
    h = torch.relu(torch.nn.functional.linear(torch.tensor(x, dtype=torch.float64), params["fc1.weight"],
                                              params["fc1.bias"]))
    return h, torch.nn.functional.linear(h, params["fc2.weight"], params["fc2.bias"])


def torch_leaves():
    return {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in PARAMS.items()}


TARGETS = {"MSELoss": RNG.standard_normal((12, 2)).astype(np.float32),
           "L1Loss": RNG.standard_normal((12, 2)).astype(np.float32),
           "BCEWithLogitsLoss": (RNG.random((12, 2)) > 0.5).astype(np.float32),
           "CrossEntropyLoss": RNG.integers(0, 2, 12)}
TORCH_LOSSES = {"MSELoss": torch.nn.functional.mse_loss, "L1Loss": torch.nn.functional.l1_loss,
                "BCEWithLogitsLoss": torch.nn.functional.binary_cross_entropy_with_logits,
                "CrossEntropyLoss": torch.nn.functional.cross_entropy}


def _module(folder, checkpoint="checkpoint"):
    state = CheckpointState.load_checkpoint(folder / checkpoint)
    return state, Module(folder / "training_model.onnx", state, folder / "eval_model.onnx")


def _check_grads(state, leaves, names):
    for n in names:
        np.testing.assert_allclose(state.parameters[n].grad, leaves[n].grad.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=n)


@pytest.mark.parametrize("loss", list(TARGETS))
def test_every_loss_type_through_generate_artifacts_is_torchs(tmp_path, loss):
    artifacts.generate_artifacts(tiny(), requires_grad=list(PARAMS), loss=artifacts.LossType[loss],
                                 optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    state, module = _module(tmp_path)
    target = TARGETS[loss]
    got = float(module(X, target))
    leaves = torch_leaves()
    want = TORCH_LOSSES[loss](torch_forward(X, leaves)[1], torch.tensor(target if loss == "CrossEntropyLoss"
                                                                        else target.astype(np.float64)))
    want.backward()
    np.testing.assert_allclose(got, want.item(), rtol=1e-5)
    _check_grads(state, leaves, PARAMS)
    module.eval()
    np.testing.assert_allclose(module(X, target), want.item(), rtol=1e-5)


def test_loss_none_trains_the_models_own_scalar_output(tmp_path):
    """loss=None: the model's output is the loss (here mean(output^2), computed by the model itself)."""
    tail = (helper.make_node("Mul", ["output", "output"], ["sq"]),
            helper.make_node("ReduceMean", ["sq"], ["own_loss"], keepdims=0))
    artifacts.generate_artifacts(tiny(tail), requires_grad=["fc2.weight", "fc2.bias"], loss=None,
                                 artifact_directory=tmp_path)
    state, module = _module(tmp_path)
    assert module.input_names() == ["input"] and module.output_names() == ["own_loss"]
    got = float(module(X))
    leaves = torch_leaves()
    want = (torch_forward(X, leaves)[1] ** 2).mean()
    want.backward()
    np.testing.assert_allclose(got, want.item(), rtol=1e-5)
    _check_grads(state, leaves, ["fc2.weight", "fc2.bias"])
    assert "fc1.weight" not in state.parameters      # neither trainable nor frozen: a constant of the model


def test_nominal_checkpoint_flow(tmp_path):
    """ORT's flow: a nominal checkpoint (names and types only) loads, the Module binds it, the real parameters come
    in through copy_buffer_to_parameters(trainable_only=False); training then matches torch from the real ones."""
    artifacts.generate_artifacts(tiny(), requires_grad=["fc2.weight", "fc2.bias"], frozen_params=["fc1.weight",
                                 "fc1.bias"], loss=artifacts.LossType.MSELoss, optimizer=artifacts.OptimType.SGD,
                                 artifact_directory=tmp_path, nominal_checkpoint=True)
    state = CheckpointState.load_checkpoint(tmp_path / "nominal_checkpoint")
    with pytest.raises(EdgetrainError, match="nominal"):
        state.parameters["fc1.weight"].data      # noqa: B018  (no data before a Module binds it)
    module = Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx")
    order = [i.name for i in onnx.load(str(tmp_path / "training_model.onnx")).graph.input if i.name in PARAMS]
    module.copy_buffer_to_parameters(np.concatenate([PARAMS[n].reshape(-1) for n in order]), trainable_only=False)
    for n in PARAMS:
        np.testing.assert_array_equal(state.parameters[n].data, PARAMS[n], err_msg=n)
    opt = Optimizer(tmp_path / "optimizer_model.onnx", module)
    opt.set_learning_rate(0.1)
    got = float(module(X, TARGETS["MSELoss"]))
    opt.step()
    leaves = torch_leaves()
    want = torch.nn.functional.mse_loss(torch_forward(X, leaves)[1], torch.tensor(TARGETS["MSELoss"],
                                                                                  dtype=torch.float64))
    want.backward()
    np.testing.assert_allclose(got, want.item(), rtol=1e-5)
    for n in ("fc2.weight", "fc2.bias"):     # plain SGD: p - lr * g
        np.testing.assert_allclose(state.parameters[n].data, PARAMS[n] - 0.1 * leaves[n].grad.numpy(), rtol=1e-5,
                                   atol=1e-6, err_msg=n)


def test_prefix_additional_outputs_and_loss_input_names(tmp_path):
    """generate_artifacts(prefix, additional_output_names, loss_input_names): the prefixed files train, the
    module returns the loss (torch's) and the extra output (numpy's forward), in that order."""
    artifacts.generate_artifacts(tiny(), requires_grad=list(PARAMS), loss=artifacts.LossType.CrossEntropyLoss,
                                 artifact_directory=tmp_path, prefix="p_", additional_output_names=["output"],
                                 loss_input_names=["output"])
    assert sorted(f.name for f in tmp_path.iterdir()) == ["p_checkpoint", "p_eval_model.onnx",
                                                           "p_training_model.onnx"]
    state = CheckpointState.load_checkpoint(tmp_path / "p_checkpoint")
    module = Module(tmp_path / "p_training_model.onnx", state, tmp_path / "p_eval_model.onnx")
    loss, output = module(X, TARGETS["CrossEntropyLoss"])
    w1, b1, w2, b2 = (PARAMS[n].astype(np.float64) for n in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"))
    np.testing.assert_allclose(output, np.maximum(X @ w1.T + b1, 0) @ w2.T + b2, rtol=1e-5, atol=1e-6)
    leaves = torch_leaves()
    want = torch.nn.functional.cross_entropy(torch_forward(X, leaves)[1], torch.tensor(TARGETS["CrossEntropyLoss"]))
    np.testing.assert_allclose(loss, want.item(), rtol=1e-5)


# --- the command line, in subprocesses ----------------------------------------------------------------------

def _cli(*argv) -> str:
    r = subprocess.run([sys.executable, "-c", "import sys; from edgetrain.cli import main; sys.exit(main())",
                        *map(str, argv)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.native
def test_cli_options_against_numpy(tmp_path):
    """artifacts --loss mse --optimizer sgd --requires-grad (fc2 only), then --frozen; train --lr --seed (2 epochs
    of batch 5 over 12 samples: SGD replayed in numpy on the same batch order), then with --schedule linear
    --warmup-steps and --eval-data; eval --batch-size; export --outputs (two, one hidden, run in onnxruntime)."""
    import onnxruntime
    onnx.save(tiny(), tmp_path / "tiny.onnx")
    target = TARGETS["MSELoss"]
    np.savez(tmp_path / "train.npz", input=X, target=target)
    art, run = tmp_path / "art", tmp_path / "run"
    _cli("artifacts", tmp_path / "tiny.onnx", "-o", art, "--loss", "mse", "--optimizer", "sgd",
         "--requires-grad", "fc2.weight", "fc2.bias")
    _cli("train", art, "--data", tmp_path / "train.npz", "--epochs", 2, "--batch-size", 5, "--lr", 0.3,
         "--seed", 7, "-o", run, "--no-progress")

    w1, b1, w2, b2 = (PARAMS[n].astype(np.float64) for n in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"))
    hidden = np.maximum(X @ w1.T + b1, 0)
    for epoch in range(2):           # the documented batch order: a permutation from default_rng([seed, epoch])
        order = np.random.default_rng([7, epoch]).permutation(len(X))
        for start in range(0, len(X), 5):
            idx = order[start:start + 5]
            dy = 2 * (hidden[idx] @ w2.T + b2 - target[idx]) / dy_size(idx)
            w2, b2 = w2 - 0.3 * dy.T @ hidden[idx], b2 - 0.3 * dy.sum(0)
    trained = CheckpointState.load_checkpoint(run / "checkpoint")
    assert sorted(n for n, p in trained.parameters if p.requires_grad) == ["fc2.bias", "fc2.weight"]
    np.testing.assert_allclose(trained.parameters["fc2.weight"].data, w2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trained.parameters["fc2.bias"].data, b2, rtol=1e-5, atol=1e-6)

    # artifacts --frozen (fc1 kept fixed, every other float initializer trainable): the same two epochs of SGD
    _cli("artifacts", tmp_path / "tiny.onnx", "-o", tmp_path / "art_frozen", "--loss", "mse", "--optimizer", "sgd",
         "--frozen", "fc1.weight", "fc1.bias")
    _cli("train", tmp_path / "art_frozen", "--data", tmp_path / "train.npz", "--epochs", 2, "--batch-size", 5,
         "--lr", 0.3, "--seed", 7, "-o", tmp_path / "run_frozen", "--no-progress")
    frozen = CheckpointState.load_checkpoint(tmp_path / "run_frozen" / "checkpoint")
    assert {n: p.requires_grad for n, p in frozen.parameters} == {"fc1.weight": False, "fc1.bias": False,
                                                                  "fc2.weight": True, "fc2.bias": True}
    np.testing.assert_allclose(frozen.parameters["fc2.weight"].data, w2, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(frozen.parameters["fc1.weight"].data, PARAMS["fc1.weight"])

    out = _cli("eval", art, "--data", tmp_path / "train.npz", "--checkpoint", run / "checkpoint", "--batch-size", 5)
    want = ((hidden @ w2.T + b2 - target) ** 2).mean()
    assert float(out.split("eval loss ")[1].split(",")[0].split()[0]) == pytest.approx(want, rel=1e-5)

    # train --schedule linear --warmup-steps --eval-data: the documented schedule on the optimizer's step count,
    # lr_k = lr * (k / warmup if k < warmup else (total - k) / (total - warmup)), and the epoch's eval loss
    np.savez(tmp_path / "eval.npz", input=X[:7], target=target[:7])
    out = _cli("train", art, "--data", tmp_path / "train.npz", "--eval-data", tmp_path / "eval.npz", "--epochs", 2,
               "--batch-size", 5, "--lr", 0.3, "--seed", 7, "--schedule", "linear", "--warmup-steps", 2,
               "-o", tmp_path / "linear", "--no-progress")
    lw2, lb2 = PARAMS["fc2.weight"].astype(np.float64), PARAMS["fc2.bias"].astype(np.float64)
    k, total, evals = 0, 2 * 3, []
    for epoch in range(2):
        order = np.random.default_rng([7, epoch]).permutation(len(X))
        for start in range(0, len(X), 5):
            idx = order[start:start + 5]
            rate = 0.3 * (k / 2 if k < 2 else max(0.0, (total - k) / (total - 2)))
            dy = 2 * (hidden[idx] @ lw2.T + lb2 - target[idx]) / dy_size(idx)
            lw2, lb2 = lw2 - rate * dy.T @ hidden[idx], lb2 - rate * dy.sum(0)
            k += 1
        evals.append(((hidden[:7] @ lw2.T + lb2 - target[:7]) ** 2).mean())
    linear = CheckpointState.load_checkpoint(tmp_path / "linear" / "checkpoint")
    np.testing.assert_allclose(linear.parameters["fc2.weight"].data, lw2, rtol=1e-5, atol=1e-6)
    printed = [float(line.split("eval loss ")[1].split(",")[0]) for line in out.splitlines() if "eval loss" in line]
    np.testing.assert_allclose(printed, evals, rtol=1e-3)     # printed with 4 decimals

    _cli("export", art, "-o", tmp_path / "inference.onnx", "--checkpoint", run / "checkpoint",
         "--outputs", "hidden", "output")
    sess = onnxruntime.InferenceSession(str(tmp_path / "inference.onnx"), providers=["CPUExecutionProvider"])
    assert [o.name for o in sess.get_outputs()] == ["hidden", "output"]
    got_hidden, got_output = sess.run(None, {"input": X})
    np.testing.assert_allclose(got_hidden, hidden, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_output, hidden @ w2.T + b2, rtol=1e-5, atol=1e-5)


def dy_size(idx) -> int:
    """MSELoss(reduction='mean') divides by every element of the batch's output: samples x 2."""
    return len(idx) * 2
