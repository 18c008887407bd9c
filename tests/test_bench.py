"""bench/train.py end to end on digits (--quick), so the training benchmark harness cannot rot unnoticed.

Checks what the harness reports, against ORT 1.19.2 and torch (not against edgetrain): every system ran and
reported numbers, and they all start from the same loss (same weights, same batch); never timings.
"""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "train.py"


@pytest.mark.native
@pytest.mark.slow
@pytest.mark.ort119
def test_training_bench_quick_run_on_digits(ort, tmp_path):
    out = subprocess.run([sys.executable, str(BENCH), "--quick", "--models", "digits", "--out",
                          str(tmp_path / "RESULTS.md"), "--json", str(tmp_path / "results.json")],
                         check=False, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads((tmp_path / "results.json").read_text())
    rows = found["table"]["digits"]
    assert found["systems"] == ["edgetrain", "edgetrain@ort", "ort", "ort@edgetrain", "torch"]
    for name in ("edgetrain", "edgetrain@ort", "ort", "torch"):
        row = rows[name]
        assert row.get("error") is None, f"{name}: {row.get('error')}"
        assert row["ms"] > 0 and row["p10"] <= row["ms"] <= row["p90"] and row["rss"] > 0 and row["start"] > 0
    assert "ms" in rows["ort@edgetrain"] or rows["ort@edgetrain"]["error"]   # numbers, or ORT's refusal
    for name in ("edgetrain", "edgetrain@ort"):
        assert rows[name]["cold"] > 0 and rows[name]["cold_error"] is None
    assert rows["edgetrain"]["profile"]["by_op"], "no per-kernel breakdown"
    ort_loss = rows["ort"]["loss_first"]
    for name in ("edgetrain", "edgetrain@ort", "torch"):
        assert rows[name]["loss_first"] == pytest.approx(ort_loss, rel=1e-5), name
    # same update rule as ORT (HF AdamW) on the same batch: the last of the 25 steps agrees too
    assert rows["edgetrain"]["loss_last"] == pytest.approx(rows["ort"]["loss_last"], rel=1e-3, abs=1e-5)
    report = (tmp_path / "RESULTS.md").read_text()
    assert "| digits | ort | " in report and "## Targets" in report
    assert "| digits | edgetrain | " in out.stdout


# -- bench/workloads.py: each realistic job, at its test size, exports, makes artifacts and trains one step ---------
def _workloads():
    spec = importlib.util.spec_from_file_location("bench_workloads", BENCH.parent / "workloads.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


WORKLOADS = _workloads()


@pytest.mark.parametrize("name", WORKLOADS.NAMES)
def test_workload_makes_artifacts_and_its_first_step_is_torchs(name, tmp_path):
    """The tiny workload through edgetrain's generate_artifacts and one AdamW step: the first loss is torch's on
    the same module (frozen parts in inference mode) and the step moves the weights torch gives a gradient and the
    running statistics of BatchNorm in training mode, nothing else."""
    torch = pytest.importorskip("torch")
    import onnx

    from edgetrain import artifacts
    from edgetrain.api import CheckpointState, Module, Optimizer
    w = WORKLOADS.build(name, tiny=True)
    WORKLOADS.export(w, tmp_path / "model.onnx")
    initializers = [i.name for i in onnx.load(str(tmp_path / "model.onnx")).graph.initializer]
    trainable, frozen = WORKLOADS.params(w, initializers)
    assert trainable
    art = tmp_path / "artifacts"
    artifacts.generate_artifacts(str(tmp_path / "model.onnx"), requires_grad=trainable, frozen_params=frozen,
                                 loss=artifacts.LossType[w.loss], optimizer=artifacts.OptimType.AdamW,
                                 artifact_directory=art)
    assert {p.name for p in art.iterdir()} >= {"training_model.onnx", "optimizer_model.onnx", "checkpoint"}
    loss_fn = {"CrossEntropyLoss": torch.nn.functional.cross_entropy, "MSELoss": torch.nn.functional.mse_loss}
    torch_loss = loss_fn[w.loss](w.model(torch.from_numpy(w.x)), torch.from_numpy(w.y))
    torch_loss.backward()
    expected = float(torch_loss)
    # weights whose gradient is not zero (a bias right before a BatchNorm in training mode gets exactly none)
    live = {n for n, p in w.model.named_parameters() if p.grad is not None and float(p.grad.abs().max()) > 1e-6}
    statistics = {f"{m}.{s}" for m, mod in w.model.named_modules()
                  if isinstance(mod, torch.nn.BatchNorm2d) and mod.training for s in ("running_mean", "running_var")}

    state = CheckpointState.load_checkpoint(art / "checkpoint")
    module = Module(art / "training_model.onnx", state)
    optimizer = Optimizer(art / "optimizer_model.onnx", module)
    before = {n: np.array(state.parameters[n].data) for n in trainable + frozen}
    module.train()
    loss = float(module(w.x, w.y))
    optimizer.step()
    module.lazy_reset_grad()
    assert loss == pytest.approx(expected, rel=1e-4, abs=1e-5)
    moved = {n for n, a in before.items() if not np.array_equal(a, state.parameters[n].data)}
    # the weights with a gradient move, and the running statistics of BatchNorm in training mode; nothing else
    assert live and live | statistics <= moved <= set(trainable) | statistics


def _bench_train(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("bench_train", BENCH)
    train = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, train)       # its dataclasses look their module up there
    spec.loader.exec_module(train)
    return train


def test_workloads_section_replaces_its_own_and_keeps_the_rest(tmp_path, monkeypatch):
    """bench/RESULTS.md holds the bench models' report and the workloads' section: each run rewrites only its own."""
    train = _bench_train(monkeypatch)
    path = tmp_path / "RESULTS.md"
    path.write_text("# Training benchmark\n| mlp | ort |\n")
    train.write_section(path, ["# Realistic workloads", "| gpt | old |"])
    train.write_section(path, ["# Realistic workloads", "| gpt | new |"])
    text = path.read_text()
    assert text.startswith("# Training benchmark\n| mlp | ort |\n") and "| gpt | new |" in text
    assert "old" not in text and text.count(train.SECTION[0]) == 1
    assert train.kept_section(path).endswith(train.SECTION[1]) and "| gpt | new |" in train.kept_section(path)


def test_targets_pair_edgetrain_and_ort_round_by_round(monkeypatch):
    """The targets' "same round" column: edgetrain's ms over ORT's in each round both ran (a round one of them
    failed or skipped is left out), median and range; the speed target itself stays the ratio of the medians."""
    train = _bench_train(monkeypatch)
    runs = lambda ms: [{"ms": v, "round": r, "p10": v, "p90": v, "peak_rss_mb": 40, "import_rss_mb": 30,
                        "built_rss_mb": 35, "first_s": 0.3, "loss_first": 1.0, "loss_last": 0.5, "steps": 9}
                       for r, v in ms.items()]
    rows = train.summarize({"edgetrain": {"runs": runs({0: 1.0, 1: 3.0, 2: 1.2, 3: 9.0})},
                            "ort": {"runs": runs({0: 2.0, 1: 3.0, 2: 1.0})}})
    assert train.paired_ratios(rows["edgetrain"], rows["ort"]) == [0.5, 1.0, 1.2]
    line = train.targets_table({"mlp": rows})[2]
    assert line.startswith("| mlp | 1.05 | 1.00 (0.50-1.20) | ") and line.endswith("| memory, start |")


@pytest.mark.native
@pytest.mark.slow
@pytest.mark.ort119
def test_workloads_quick_run_at_test_size(ort, tmp_path):
    """bench/train.py --workloads end to end on the tiny gpt (labels [N*T], dynamic batch, tied embeddings) and
    lstm: ORT 1.19.2 and torch agree with edgetrain's first loss where it trains, and a refusal is reported as
    such, not as a crash."""
    out = subprocess.run([sys.executable, str(BENCH), "--workloads", "gpt", "lstm", "--tiny", "--quick", "--out",
                          str(tmp_path / "RESULTS.md"), "--json", str(tmp_path / "results.json")],
                         check=False, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads((tmp_path / "results.json").read_text())
    assert found["systems"] == ["edgetrain", "ort", "torch"]
    gpt = found["table"]["gpt"]
    for name in ("edgetrain", "ort", "torch"):
        assert gpt[name].get("error") is None, f"{name}: {gpt[name].get('error')}"
        assert gpt[name]["loss_first"] == pytest.approx(gpt["ort"]["loss_first"], rel=1e-5), name
    assert gpt["edgetrain"]["loss_last"] == pytest.approx(gpt["ort"]["loss_last"], rel=1e-3, abs=1e-5)
    assert gpt["edgetrain"]["profile"]["by_op"], "no per-kernel breakdown"
    lstm = found["table"]["lstm"]
    assert lstm["ort"].get("error") is None and lstm["torch"].get("error") is None
    assert lstm["edgetrain"].get("error") is None and "ms" in lstm["edgetrain"], lstm["edgetrain"]
    report = (tmp_path / "RESULTS.md").read_text()
    assert "| gpt | ort | " in report and "## Workload targets" in report
