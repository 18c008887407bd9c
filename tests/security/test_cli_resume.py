"""Issue 11, item 6: `edgetrain train --resume` checks the run properties it resumes from (typed, in range) and
refuses bad ones with one error line naming the checkpoint, the property and its value -- no traceback, and no
epoch silently skipped."""
import subprocess
import sys

import numpy as np
import pytest

from edgetrain import checkpoint
from edgetrain.cli import main
from edgetrain.cli.train import EPOCH, SEED, STEP
from edgetrain.data import digits_split

pytestmark = pytest.mark.native

EPOCHS, BATCH, SAMPLES = 2, 32, 96            # 3 steps per epoch
CLI = "import sys; from edgetrain.cli import main; sys.exit(main())"     # the `edgetrain` console script


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory, shared):
    """Artifacts, training data, and a checkpoint saved after one epoch by `edgetrain train`."""
    folder = tmp_path_factory.mktemp("resume")
    (x, y), _ = digits_split()
    np.savez(folder / "train.npz", input=x[:SAMPLES], labels=y[:SAMPLES])
    assert main(["artifacts", str(shared / "models" / "digits.onnx"), "-o", str(folder / "art")]) == 0
    assert main(["train", str(folder / "art"), "--data", str(folder / "train.npz"), "--epochs", "1",
                 "--batch-size", str(BATCH), "-o", str(folder / "run"), "--no-progress"]) == 0
    return folder


def _train(folder, out, *extra):
    return subprocess.run([sys.executable, "-c", CLI, "train", str(folder / "art"), "--data",
                           str(folder / "train.npz"), "--epochs", str(EPOCHS), "--batch-size", str(BATCH), "-o",
                           str(out), "--no-progress", *extra], capture_output=True, text=True, timeout=600,
                           check=False)


def _resume_with(folder, tmp_path, name, value):
    ckpt = checkpoint.load(folder / "run" / "checkpoint")
    assert ckpt.properties[EPOCH] == 1 and ckpt.properties[STEP] == 0
    ckpt.properties[name] = value
    checkpoint.save(ckpt, tmp_path / "checkpoint")
    return _train(folder, tmp_path, "--resume")


BAD = [(SEED, "abc"), (SEED, float("nan")), (SEED, 1.0), (SEED, -1),
       (EPOCH, -1), (EPOCH, EPOCHS + 1), (EPOCH, "1"), (EPOCH, float("inf")),
       (STEP, 2**62), (STEP, -1), (STEP, SAMPLES // BATCH), (STEP, 0.5)]


@pytest.mark.parametrize("name, value", BAD, ids=[f"{n.split('.')[1]}={v!r}" for n, v in BAD])
def test_a_bad_run_property_is_one_clean_error(run_folder, tmp_path, name, value):
    proc = _resume_with(run_folder, tmp_path, name, value)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "train loss" not in proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("edgetrain: error: --resume: checkpoint ")
    assert f"'{tmp_path / 'checkpoint'}'" in line and f"{name} = {value!r}" in line


@pytest.mark.parametrize("name, value, resumes_at", [(STEP, SAMPLES // BATCH - 1, "epoch 2 step 3"),
                                                      (EPOCH, EPOCHS, None), (SEED, 2**63 - 1, "epoch 2 step 1")])
def test_properties_at_the_ends_of_their_ranges_resume(run_folder, tmp_path, name, value, resumes_at):
    proc = _resume_with(run_folder, tmp_path, name, value)
    assert proc.returncode == 0, proc.stderr
    if resumes_at is None:          # the run was already complete: nothing to train
        assert "train loss" not in proc.stdout
    else:
        assert f"resuming at {resumes_at}" in proc.stdout and proc.stdout.count("train loss") == 1


def test_a_negative_seed_option_is_one_clean_error(run_folder, tmp_path):
    proc = _train(run_folder, tmp_path, "--seed=-1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    # argparse's usage error, no traceback
    assert proc.stderr.strip().endswith(f"argument --seed: must be an integer from 0 to {2**63 - 1}, got -1")
