"""The command line end to end: artifacts -> train (checkpoints, resume) -> eval -> export -> onnxruntime; the demo."""
from __future__ import annotations

import numpy as np
import onnxruntime
import pytest

from edgetrain.api import CheckpointState
from edgetrain.cli import main
from edgetrain.cli import progress as progress_module
from edgetrain.data import digits_split

pytestmark = pytest.mark.native


@pytest.fixture(scope="module")
def digits_files(tmp_path_factory, shared):
    folder = tmp_path_factory.mktemp("cli")
    (x_train, y_train), (x_test, y_test) = digits_split()
    np.savez(folder / "train.npz", input=x_train[:320], labels=y_train[:320])
    np.savez(folder / "test.npz", input=x_test, labels=y_test)
    assert main(["artifacts", str(shared / "models" / "digits.onnx"), "-o", str(folder / "art")]) == 0
    return folder


def _params(path) -> dict[str, np.ndarray]:
    state = CheckpointState.load_checkpoint(path)
    return {name: np.array(p.data) for name, p in state.parameters}


def test_artifacts_train_eval_export(digits_files, tmp_path, capsys):
    f = digits_files
    assert sorted(p.name for p in (f / "art").iterdir()) == [
        "checkpoint", "eval_model.onnx", "optimizer_model.onnx", "training_model.onnx"]
    out = tmp_path / "run"
    assert main(["train", str(f / "art"), "--data", str(f / "train.npz"), "--eval-data", str(f / "test.npz"),
                 "--epochs", "3", "--batch-size", "32", "-o", str(out)]) == 0
    log = capsys.readouterr().out
    losses = [float(line.split("train loss ")[1].split(",")[0]) for line in log.splitlines() if "train loss" in line]
    assert len(losses) == 3 and losses[0] > losses[-1]
    trained = _params(out / "checkpoint")
    initial = _params(f / "art" / "checkpoint")
    assert all(not np.array_equal(trained[n], initial[n]) for n in initial)

    assert main(["eval", str(f / "art"), "--data", str(f / "test.npz"), "--checkpoint", str(out / "checkpoint")]) == 0
    eval_loss = float(capsys.readouterr().out.split("eval loss ")[1].split(",")[0])
    last_epoch_eval = float(log.strip().splitlines()[-2].split("eval loss ")[1].split(",")[0])
    assert eval_loss == pytest.approx(last_epoch_eval, abs=1e-4)

    model = tmp_path / "inference.onnx"
    assert main(["export", str(f / "art"), "-o", str(model), "--checkpoint", str(out / "checkpoint")]) == 0
    x = np.load(f / "test.npz")["input"]
    (logits,) = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"input": x})
    w1, b1, w2, b2 = (trained[n] for n in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"))
    np.testing.assert_allclose(logits, np.maximum(x @ w1.T + b1, 0) @ w2.T + b2, rtol=1e-4, atol=1e-4)


def test_resume_mid_epoch_continues_as_one_run(digits_files, tmp_path, monkeypatch):
    f = digits_files
    common = ["--data", str(f / "train.npz"), "--epochs", "2", "--batch-size", "32", "--schedule", "linear",
              "--warmup-steps", "3", "--checkpoint-every", "4", "--no-progress"]
    assert main(["train", str(f / "art"), "-o", str(tmp_path / "straight"), *common]) == 0

    real_step = progress_module.Progress.step

    def interrupted(self, info):      # Ctrl-C during epoch 2, step 7: a checkpoint of that point is saved
        if info.epoch == 1 and info.step == 7:
            raise KeyboardInterrupt
        real_step(self, info)
    monkeypatch.setattr(progress_module.Progress, "step", interrupted)
    assert main(["train", str(f / "art"), "-o", str(tmp_path / "cut"), *common]) == 130
    monkeypatch.setattr(progress_module.Progress, "step", real_step)
    state = CheckpointState.load_checkpoint(tmp_path / "cut" / "checkpoint")
    assert (state.properties["edgetrain.epoch"], state.properties["edgetrain.step_in_epoch"]) == (1, 7)
    assert main(["train", str(f / "art"), "-o", str(tmp_path / "cut"), "--resume", *common]) == 0
    straight, resumed = _params(tmp_path / "straight" / "checkpoint"), _params(tmp_path / "cut" / "checkpoint")
    for name in straight:
        np.testing.assert_array_equal(resumed[name], straight[name], err_msg=name)


@pytest.mark.parametrize("argv, message", [
    (["train", "{art}", "--data", "{missing}"], "cannot read"),
    (["train", "{art}", "--data", "{wrong_keys}"], "no array for model input(s) ['input', 'labels']"),
    (["train", "{nowhere}", "--data", "{wrong_keys}"], "does not exist"),
    (["train", "{art}", "--data", "{wrong_keys}", "--resume", "-o", "{nowhere}"], "--resume: no checkpoint"),
    (["artifacts", "{model}", "-o", "{nowhere}", "--frozen", "fc9.weight"], "['fc9.weight'] are not initializers"),
])
def test_bad_arguments_get_clear_errors(digits_files, shared, tmp_path, capsys, argv, message):
    np.savez(tmp_path / "wrong.npz", x=np.zeros((4, 64), np.float32))
    names = {"art": digits_files / "art", "missing": tmp_path / "missing.npz", "wrong_keys": tmp_path / "wrong.npz",
                 "nowhere": tmp_path / "nowhere", "model": shared / "models" / "digits.onnx"}
    assert main([a.format(**names) for a in argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "nowhere").exists()


def test_demo_trains_exports_and_checks(tmp_path, capsys):
    assert main(["demo", "--epochs", "2", "-o", str(tmp_path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "test accuracy" in out and "logits match" in out and "optimizer step: arena" in out
    assert (tmp_path / "digits_inference.onnx").exists()
