"""The command line as a new user meets it (each check runs `python -m edgetrain` in a subprocess, as a user
would): no lost work, sensible defaults, Ctrl-C, clean errors, metrics and the papercuts."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgetrain.api import CheckpointState
from edgetrain.data import digits_split

pytestmark = pytest.mark.native


def cold_cache(tmp_path) -> dict:
    """Environment of a child whose kernel caches are empty. NUMBA_CACHE_DIR too: importing edgetrain's kernels
    in this process exported the (warm) default one into os.environ, which children inherit."""
    return {"EDGETRAIN_CACHE_DIR": str(tmp_path / "cold-cache"), "NUMBA_CACHE_DIR": str(tmp_path / "cold-numba")}


def cli(*args, env=None, timeout=300, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgetrain", *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})), timeout=timeout, cwd=cwd)


def ok(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert r.returncode == 0, r.stderr
    return r


def refused(r: subprocess.CompletedProcess, *phrases: str) -> str:
    """A clean error: exit 2, one 'edgetrain: error' line (or argparse's usage error), no traceback."""
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    for phrase in phrases:
        assert phrase in r.stderr, r.stderr
    return r.stderr


def _params(path) -> dict[str, np.ndarray]:
    return {name: np.array(p.data) for name, p in CheckpointState.load_checkpoint(path).parameters}


@pytest.fixture(scope="module")
def digits(tmp_path_factory, shared):
    folder = tmp_path_factory.mktemp("user")
    (x_train, y_train), (x_test, y_test) = digits_split()
    np.savez(folder / "train.npz", input=x_train[:200], labels=y_train[:200])
    np.savez(folder / "test.npz", input=x_test[:100], labels=y_test[:100])
    ok(cli("artifacts", shared / "models" / "digits.onnx", "-o", folder / "art"))
    return folder


# 1. trained work is never overwritten silently --------------------------------------------------------------

def test_train_again_without_resume_is_refused_and_keeps_the_run(digits, tmp_path):
    out = tmp_path / "run"
    ok(cli("train", digits / "art", "--data", digits / "train.npz", "-o", out, "--no-progress"))
    before = (out / "checkpoint").read_bytes()
    refused(cli("train", digits / "art", "--data", digits / "train.npz", "-o", out, "--no-progress"),
            "holds a trained run", "--resume", "--overwrite")
    assert (out / "checkpoint").read_bytes() == before
    ok(cli("train", digits / "art", "--data", digits / "train.npz", "-o", out, "--no-progress", "--overwrite"))


def test_artifacts_into_a_trained_folder_is_refused_then_keeps_the_run(digits, shared, tmp_path):
    art = tmp_path / "art"
    ok(cli("artifacts", shared / "models" / "digits.onnx", "-o", art))
    ok(cli("train", art, "--data", digits / "train.npz", "--no-progress"))
    refused(cli("artifacts", shared / "models" / "digits.onnx", "-o", art), "already holds a trained run")
    r = ok(cli("artifacts", shared / "models" / "digits.onnx", "-o", art, "--overwrite"))
    kept = [p for p in art.iterdir() if p.name.startswith("run.replaced-")]
    assert len(kept) == 1 and (kept[0] / "checkpoint").exists() and not (art / "run").exists()
    wrote = next(line for line in r.stdout.splitlines() if line.startswith("wrote"))
    assert "run" not in wrote.split(" to ")[0] and "checkpoint" in wrote


# 2. BatchNorm statistics are frozen automatically ----------------------------------------------------------

def _bn_cnn(path) -> None:
    rng = np.random.default_rng(0)

    def init(name, shape, value=None):
        data = rng.standard_normal(shape).astype(np.float32) * 0.3 if value is None else np.full(shape, value,
                                                                                                    np.float32)
        return helper.make_tensor(name, TensorProto.FLOAT, shape, data.ravel().tolist())
    inits = [init("conv.w", [4, 1, 3, 3]), init("bn.scale", [4], 1.0), init("bn.bias", [4], 0.0),
             init("bn.running_mean", [4], 0.0), init("bn.running_var", [4], 1.0), init("fc.w", [3, 4]),
             init("fc.b", [3], 0.0), helper.make_tensor("bn.num_batches_tracked", TensorProto.INT64, [], [0])]
    nodes = [helper.make_node("Conv", ["x", "conv.w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "bn.scale", "bn.bias", "bn.running_mean", "bn.running_var"],
                              ["b", "rm", "rv"], training_mode=1, momentum=0.9),
             helper.make_node("Relu", ["b"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["logits"], transB=1)]
    g = helper.make_graph(nodes, "bn_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 6, 6])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def test_batchnorm_model_trains_with_the_defaults(tmp_path):
    _bn_cnn(tmp_path / "cnn.onnx")
    r = ok(cli("artifacts", tmp_path / "cnn.onnx", "-o", tmp_path / "art"))
    assert "frozen automatically: bn.running_mean, bn.running_var" in r.stdout
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "d.npz", x=rng.standard_normal((24, 1, 6, 6)).astype(np.float32),
             labels=rng.integers(0, 3, 24))
    ok(cli("train", tmp_path / "art", "--data", tmp_path / "d.npz", "--batch-size", "8", "--no-progress"))
    trained = _params(tmp_path / "art" / "run" / "checkpoint")
    assert not np.array_equal(trained["bn.running_mean"], np.zeros(4))     # updated as statistics, not trained


# 3. Ctrl-C during the first (cold) run ----------------------------------------------------------------------

def test_ctrl_c_during_a_cold_run_stops_cleanly_and_resumes(digits, tmp_path):
    env = cold_cache(tmp_path)            # nothing compiled yet: the first step compiles
    out = tmp_path / "run"
    args = [sys.executable, "-m", "edgetrain", "train", str(digits / "art"), "--data", str(digits / "train.npz"),
            "-o", str(out), "--epochs", "3", "--no-progress"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **env))
    first = proc.stdout.readline()        # printed once Ctrl-C is handled, just before the first (compiling) step
    assert first.startswith("training 200 samples"), first
    time.sleep(0.5)                       # kernels compiling: a cold cache takes seconds
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted at epoch" in stderr
    state = CheckpointState.load_checkpoint(out / "checkpoint")
    assert state.properties["edgetrain.step_in_epoch"] >= 1 or state.properties["edgetrain.epoch"] >= 1
    r = ok(cli("train", digits / "art", "--data", digits / "train.npz", "-o", out, "--epochs", "3", "--resume",
               "--no-progress", env=env))                          # the cache left behind is consistent
    assert "epoch 3/3" in r.stdout


# 4. eval: the trained checkpoint by default, metrics, JSON ----------------------------------------------------

def test_eval_defaults_to_the_trained_checkpoint_and_reports_accuracy(digits, shared, tmp_path):
    art = tmp_path / "art"
    ok(cli("artifacts", shared / "models" / "digits.onnx", "-o", art))
    untrained = ok(cli("eval", art, "--data", digits / "test.npz"))
    assert "untrained" in untrained.stdout
    ok(cli("train", art, "--data", digits / "train.npz", "--epochs", "5", "--lr", "0.01", "--no-progress"))
    r = ok(cli("eval", art, "--data", digits / "test.npz", "--json", tmp_path / "m.json"))
    assert f"checkpoint: {art / 'run' / 'checkpoint'}" in r.stdout
    metrics = json.loads((tmp_path / "m.json").read_text())
    # the accuracy agrees with a numpy forward pass of the trained parameters (an outside computation)
    p = _params(art / "run" / "checkpoint")
    with np.load(digits / "test.npz") as z:
        x, y = z["input"], z["labels"]
    logits = np.maximum(x @ p["fc1.weight"].T + p["fc1.bias"], 0) @ p["fc2.weight"].T + p["fc2.bias"]
    assert metrics["accuracy"] == pytest.approx(float((logits.argmax(1) == y).mean()))
    top5 = (np.argsort(-logits, axis=1)[:, :5] == y[:, None]).any(1).mean()
    assert metrics["top5_accuracy"] == pytest.approx(float(top5))
    assert metrics["accuracy"] > 0.5 and "eval accuracy" in r.stdout


# 5. compile progress stays out of throughput -----------------------------------------------------------------

def test_first_run_reports_compiling_and_throughput_leaves_it_out(digits, tmp_path):
    env = cold_cache(tmp_path)
    r = ok(cli("train", digits / "art", "--data", digits / "train.npz", "-o", tmp_path / "run", "--epochs", "2",
               "--no-progress", env=env))
    first = next(line for line in r.stdout.splitlines() if line.startswith("epoch 1/2"))
    assert "first step" in first and "compiling" in first and "kernels" in first
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rates = {e: [s["samples_per_s"] for s in steps if s["kind"] == "step" and s["epoch"] == e][-1] for e in (1, 2)}
    setup = float(first.split("first step ")[1].split(" s")[0])
    assert setup > 0.5                   # a cold cache compiles for seconds ...
    assert rates[1] > 10 * 200 / setup   # ... which would make epoch 1 at most 200 / setup samples/s


def test_compile_watcher_clock_leaves_compile_time_out():
    from edgetrain.cli.progress import CompileWatcher, Progress
    watcher = CompileWatcher(Progress(1, enabled=False))
    t0 = watcher.clock()
    watcher.on_start(None)
    time.sleep(0.2)
    watcher.on_start(None)            # a nested compile (an inlined helper) is not counted twice
    watcher.on_end(None)
    watcher.on_end(None)
    assert watcher.count == 1 and watcher.seconds >= 0.2 and watcher.clock() - t0 < 0.1


# 6. errors, not tracebacks -------------------------------------------------------------------------------------

def test_out_of_range_labels_name_the_array_sample_and_value(digits, tmp_path):
    (x, y), _ = digits_split()
    y = y[:64].copy()
    y[37] = 12
    np.savez(tmp_path / "bad.npz", input=x[:64], labels=y)
    refused(cli("train", digits / "art", "--data", tmp_path / "bad.npz", "-o", tmp_path / "r"),
            "array 'labels' has value 12 at sample 37", "0 to 9")


@pytest.mark.parametrize("argv, phrase", [
    (["train", "{art}", "--data", "{train}", "--batch-size", "0"], "must be a positive integer"),
    (["train", "{art}", "--data", "{train}", "--lr", "-1"], "must be a positive number"),
    (["train", "{art}", "--data", "{text}"], "is not an .npz file"),
    (["export", "{art}", "-o", "{tmp}/missing/model.onnx"], "does not exist"),
])
def test_bad_input_gets_an_error_not_a_traceback(digits, tmp_path, argv, phrase):
    (tmp_path / "data.txt").write_text("1,2,3\n")
    names = {"art": digits / "art", "train": digits / "train.npz", "text": tmp_path / "data.txt", "tmp": tmp_path}
    refused(cli(*[a.format(**names) for a in argv]), phrase)


# 7. a model exported with a fixed batch ----------------------------------------------------------------------

def test_fixed_batch_model_skips_the_last_partial_batch_and_explains(tmp_path, shared):
    m = onnx.load(shared / "models" / "digits.onnx")
    for v in list(m.graph.input) + list(m.graph.output):
        if v.type.tensor_type.shape.dim:
            v.type.tensor_type.shape.dim[0].dim_value = 16
    onnx.save(m, tmp_path / "fixed.onnx")
    ok(cli("artifacts", tmp_path / "fixed.onnx", "-o", tmp_path / "art"))
    (x, y), _ = digits_split()
    np.savez(tmp_path / "d.npz", input=x[:100], labels=y[:100])                  # 6 batches of 16, 4 left over
    r = ok(cli("train", tmp_path / "art", "--data", tmp_path / "d.npz", "--batch-size", "16", "--no-progress"))
    assert "the last 4 sample(s) of each epoch are skipped" in r.stderr and "6 steps per epoch" in r.stdout
    refused(cli("train", tmp_path / "art", "--data", tmp_path / "d.npz", "--batch-size", "32", "--overwrite"),
            "fixed batch of 16", "dynamic_axes")


# 8. papercuts -------------------------------------------------------------------------------------------------

def test_version_module_entry_and_defaults_in_help():
    from edgetrain import __version__
    assert ok(cli("--version")).stdout.strip() == f"edgetrain {__version__}"
    help_text = ok(cli("train", "--help")).stdout
    assert "(default: 32)" in help_text and "(default: 0.001)" in help_text


def test_regression_loss_accepts_labels_named_as_the_readme_says(tmp_path, shared):
    ok(cli("artifacts", shared / "models" / "digits.onnx", "-o", tmp_path / "art", "--loss", "mse"))
    (x, _), _ = digits_split()
    np.savez(tmp_path / "d.npz", input=x[:64], labels=np.zeros((64, 10), np.float32))   # the input is 'target'
    ok(cli("train", tmp_path / "art", "--data", tmp_path / "d.npz", "--no-progress"))


def test_resume_refuses_another_batch_size_and_names_other_differences(digits, tmp_path):
    out = tmp_path / "run"
    ok(cli("train", digits / "art", "--data", digits / "train.npz", "-o", out, "--epochs", "1", "--no-progress"))
    refused(cli("train", digits / "art", "--data", digits / "train.npz", "-o", out, "--resume", "--epochs", "2",
                "--batch-size", "16"), "--batch-size 32", "says 16")
    r = ok(cli("train", digits / "art", "--data", digits / "train.npz", "-o", out, "--resume", "--epochs", "2",
               "--lr", "0.01", "--no-progress"))
    assert "--lr 0.01 differs from the run's 0.001" in r.stderr


def test_same_seed_same_run_with_dropout(tmp_path):
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [6, 3], rng.standard_normal(18).astype(np.float32).tolist())
    ratio = helper.make_tensor("ratio", TensorProto.FLOAT, [], [0.5])
    train_mode = helper.make_tensor("mode", TensorProto.BOOL, [], [True])
    nodes = [helper.make_node("Dropout", ["x", "ratio", "mode"], ["d"]), helper.make_node("MatMul", ["d", "w"], ["y"])]
    # ratio (a float initializer) gets no gradient: it stays a constant of the models, not a parameter
    g = helper.make_graph(nodes, "drop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], [w, ratio, train_mode])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "m.onnx")
    r = ok(cli("artifacts", tmp_path / "m.onnx", "-o", tmp_path / "art", "--loss", "mse"))
    assert "no gradient reaches them: ratio" in r.stdout
    np.savez(tmp_path / "d.npz", x=rng.standard_normal((32, 6)).astype(np.float32),
             target=rng.standard_normal((32, 3)).astype(np.float32))
    runs = []
    for k, seed in enumerate((5, 5, 6)):
        out = tmp_path / f"run{k}"
        ok(cli("train", tmp_path / "art", "--data", tmp_path / "d.npz", "-o", out, "--seed", seed, "--no-progress"))
        runs.append(_params(out / "checkpoint")["w"])
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2])


def test_demo_leaves_nothing_behind_and_reports_a_consistent_peak(tmp_path):
    env = {"TMPDIR": str(tmp_path)}
    r = ok(cli("demo", "--epochs", "1", "--no-progress", env=env))
    assert not list(tmp_path.iterdir())
    line = next(x for x in r.stdout.splitlines() if "process: RSS" in x)
    now, peak = (float(part.split()[0]) for part in (line.split("RSS ")[1], line.split("peak ")[1]))
    assert peak >= now


def test_reduce_prints_its_summary_once(monkeypatch, capsys, tmp_path):
    from edgetrain.minimal_build import runtime

    from edgetrain.cli import main

    class Fake:
        wheel = tmp_path / "x.whl"

        def summary(self):
            return "trimmed runtime: SUMMARY"

    def build(folders, out, batch_sizes, rebuild_command, log):
        log(Fake().summary())
        return Fake()
    monkeypatch.setattr(runtime, "build", build)
    from edgetrain.minimal_build import reduce as minimal_reduce

    from edgetrain.cli import reduce
    monkeypatch.setattr(minimal_reduce, "collect", lambda paths, dims: type("R", (), {"ops": [], "models": []}))
    monkeypatch.setattr(minimal_reduce, "write_configs", lambda required, out: ("a.config", "b.config"))
    monkeypatch.setattr(reduce, "write_artifacts", lambda paths, target: [tmp_path])
    assert main(["reduce", str(tmp_path), "-o", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.count("SUMMARY") == 1


# 9. the metrics log ------------------------------------------------------------------------------------------

def test_train_writes_a_metrics_log(digits, tmp_path):
    out = tmp_path / "run"
    ok(cli("train", digits / "art", "--data", digits / "train.npz", "--eval-data", digits / "test.npz", "-o", out,
           "--epochs", "2", "--lr", "0.01", "--no-progress"))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert len(steps) == 2 * 7 and [r["global_step"] for r in steps] == list(range(1, 15))
    assert all(r["lr"] == pytest.approx(0.01) for r in steps)
    assert len(epochs) == 2 and "eval_accuracy" in epochs[-1] and "eval_loss" in epochs[-1]
    # the epoch's train loss is the batch-size-weighted mean of its step losses
    sizes = [32] * 6 + [200 - 6 * 32]
    assert epochs[0]["train_loss"] == pytest.approx(np.average([r["loss"] for r in steps[:7]], weights=sizes))


def test_train_draws_its_curves_where_matplotlib_is_installed(digits, tmp_path):
    out = tmp_path / "run"
    ok(cli("train", digits / "art", "--data", digits / "train.npz", "--eval-data", digits / "test.npz", "-o", out,
           "--no-progress"))
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_profile_draws_a_memory_timeline(tmp_path, shared):
    """One box per arena buffer of each kind of step, placed by its planned offset; names escaped."""
    import xml.etree.ElementTree as ET

    m = onnx.load(shared / "models" / "digits.onnx")
    hostile = "<script>alert(1)</script>"
    relu = next(n for n in m.graph.node if n.op_type == "Relu")     # a value with a buffer (Gemm's sum is folded)
    renames = {relu.output[0]: hostile}
    for node in m.graph.node:
        node.input[:] = [renames.get(i, i) for i in node.input]
        node.output[:] = [renames.get(o, o) for o in node.output]
    onnx.save(m, tmp_path / "m.onnx")
    ok(cli("artifacts", tmp_path / "m.onnx", "-o", tmp_path / "art"))
    ok(cli("profile", tmp_path / "art", "--batch-size", "8", "--steps", "2", "--timeline", tmp_path / "t.svg"))
    text = (tmp_path / "t.svg").read_text()
    assert "<script>" not in text and "&lt;script&gt;" in text
    root = ET.fromstring(text)
    ns = "{http://www.w3.org/2000/svg}"
    panels = root.findall(f"{ns}g")
    assert len(panels) == 3                                          # train, eval, optimizer
    titles = [t.text for t in root.iter(f"{ns}title")]
    assert any(hostile in t for t in titles)                         # the name survives, as text
    refused(cli("profile", tmp_path / "art", "--timeline", tmp_path / "t.png"), "name an .svg or .html file")


def test_ops_lists_the_table_with_opsets_and_gradients():
    from edgetrain.ops import OP_TABLE
    out = ok(cli("ops")).stdout.splitlines()
    table = out[1:out.index("")]                   # the table; ops run through a function body follow
    rows = {tuple(line.split()[:2]): line.split() for line in table}
    assert len(rows) == len(OP_TABLE) and out[-1].startswith(f"{len(OP_TABLE)} ops")
    assert rows["Conv", "ai.onnx"][2:4] == ["11", "yes"] and rows["ReluGrad", "com.microsoft"][3] == "training"
    grads = ok(cli("ops", "--gradients")).stdout.splitlines()
    grads = grads[1:grads.index("")]
    assert all(line.split()[3] == "yes" for line in grads) and len(grads) == sum(
        op.vjp is not None for op in OP_TABLE.values())


def test_compile_progress_counts_against_the_planned_kernels():
    import io

    from edgetrain.cli.progress import CompileWatcher, Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    screen = Terminal()
    watcher = CompileWatcher(Progress(1, stream=screen), planned=lambda: 17)
    for _ in range(3):
        watcher.on_start(None)
        watcher.on_end(None)
    assert screen.getvalue().rstrip().endswith("compiling kernels 3/17 (first run; cached for later runs)")


def test_a_checkpoint_of_other_artifacts_is_named(digits, shared, tmp_path):
    _bn_cnn(tmp_path / "cnn.onnx")
    ok(cli("artifacts", tmp_path / "cnn.onnx", "-o", tmp_path / "cnn"))
    refused(cli("eval", digits / "art", "--data", digits / "test.npz", "--checkpoint", tmp_path / "cnn" / "checkpoint"),
            f"checkpoint '{tmp_path / 'cnn' / 'checkpoint'}' does not fit the training model")
