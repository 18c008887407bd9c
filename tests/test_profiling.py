"""The memory profiler's own numbers, checked for consistency (no timing asserts).

Planned arenas against the naive sum, state bytes against the parameters onnx reads from the bench model and the
checkpoint ORT wrote, steady steps against growth (RSS, anonymous memory, tracemalloc), budgets against planning.
"""
import json
import re

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from edgetrain import checkpoint
from edgetrain.errors import InputError, MemoryBudgetError
from edgetrain.profiling import profile_artifacts

GROWTH_TOLERANCE = 64 * 1024     # a few pages: allocator and page-table noise, far below any arena or array
MLP_PARAMS = 235_146             # ANCHORS.md


@pytest.fixture(scope="module")
def mlp(shared):
    return profile_artifacts(shared / "ort_artifacts" / "mlp", batch_size=64, steps=10)


@pytest.fixture(scope="module")
def digits_artifacts(shared, tmp_path_factory):
    """edgetrain's own artifacts of the digits model: a symbolic batch dimension 'N'."""
    from edgetrain import artifacts
    out = tmp_path_factory.mktemp("digits_artifacts")
    ckpt = checkpoint.load(shared / "ort_artifacts" / "digits" / "checkpoint")
    artifacts.generate_artifacts(str(shared / "models" / "digits.onnx"), requires_grad=list(ckpt.trainable),
                                 frozen_params=list(ckpt.frozen), loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=out)
    return out


def test_planned_arenas_stay_within_the_naive_sum(mlp):
    assert [r.kind for r in mlp.reports] == ["train", "eval", "optimizer"]
    for r in mlp.reports:
        assert 0 < r.peak_live_bytes <= r.arena_bytes <= r.naive_bytes, r.kind
        sizes = [t["bytes"] for t in r.peak_tensors]
        assert sizes == sorted(sizes, reverse=True) and sum(sizes) <= r.peak_live_bytes
    train = mlp.reports[0]
    assert train.arena_bytes < train.naive_bytes      # the planner reuses something in a training step
    arenas = {r.kind: r.arena_bytes for r in mlp.reports}     # train and eval share the module's arena
    assert mlp.planned_bytes == (max(arenas["train"], arenas["eval"]) + arenas["optimizer"]
                                 + sum(r.constants_bytes for r in mlp.reports) + sum(mlp.state.values()))


def test_state_bytes_are_the_parameters_onnx_and_the_checkpoint_hold(shared, mlp):
    folder = shared / "ort_artifacts" / "mlp"
    forward = onnx.load(str(shared / "models" / "mlp.onnx")).graph.initializer
    from_onnx = sum(numpy_helper.to_array(t).nbytes for t in forward)
    ckpt = checkpoint.load(folder / "checkpoint")
    moments = [i.name for i in onnx.load(str(folder / "optimizer_model.onnx")).graph.input
               if i.name.endswith("order_moments")]
    assert len(moments) == 2                       # AdamW
    # gradients: the committed array and the spare a training step writes before it commits
    assert mlp.state == {"parameters": from_onnx, "gradients": 2 * from_onnx, "moments": 2 * from_onnx,
                         "frozen": sum(a.nbytes for a in ckpt.frozen.values())}
    assert from_onnx == MLP_PARAMS * 4 == sum(a.nbytes for a in ckpt.trainable.values())
    train, evaluation, optimizer = mlp.reports
    assert train.state == {"parameters": from_onnx, "gradients": from_onnx, "moments": 0, "frozen": 0}
    assert evaluation.state == {"parameters": from_onnx, "gradients": 0, "moments": 0, "frozen": 0}
    assert optimizer.state == mlp.state | {"gradients": from_onnx}


def test_kernel_breakdown_covers_every_call(mlp):
    for r in mlp.reports:
        assert len(r.kernel_times) == r.kernels and [k.index for k in r.kernel_times] == list(range(r.kernels))
        assert all(k.ms >= 0 and k.nodes and ":" in k.label for k in r.kernel_times)
        assert sum(r.by_op.values()) == pytest.approx(r.kernel_ms)
        assert set(r.by_op) == {k.label for k in r.kernel_times}
    train = mlp.reports[0]
    assert any("FusedMatMul" in k.label for k in train.kernel_times)
    assert "/Relu_Grad/ReluGrad_0" in {n for k in train.kernel_times for n in k.nodes}


@pytest.mark.native
def test_steady_steps_do_not_grow(shared, mlp):
    """RSS and anonymous memory stay flat; USS (private pages) also moves when other processes map or unmap the
    libraries this one shares with them, so it gets a second measurement before being called growth."""
    for r in mlp.reports:
        assert r.rss_growth <= GROWTH_TOLERANCE, r
        assert r.anon_growth is None or r.anon_growth <= GROWTH_TOLERANCE, r
        assert r.py_bytes_per_step == 0, r          # the median steady step leaves nothing on the Python heap
        assert r.py_net_bytes <= 4096, r            # numpy's small-block caches may settle in the first steps
        assert r.rss_peak >= mlp.rss_baseline
    uss = {r.kind: r.uss_growth for r in mlp.reports if r.uss_growth is not None}
    if any(g > GROWTH_TOLERANCE for g in uss.values()):
        again = profile_artifacts(shared / "ort_artifacts" / "mlp", batch_size=64, steps=10)
        uss = {r.kind: min(uss[r.kind], r.uss_growth) for r in again.reports}
    assert all(g <= GROWTH_TOLERANCE for g in uss.values()), uss


@pytest.mark.native
def test_the_figures_see_a_step_that_leaks(digits_artifacts, monkeypatch):
    """The growth figures can fail: a module call that keeps 2 MB of numpy array shows on the Python heap, and
    one that keeps 2 MB of fresh private pages shows in memory (an array alone may land in heap memory an earlier
    test freed and that is still resident, which RSS cannot see: malloc's mmap threshold rises after large
    frees, so in the full suite even 2 MB arrays can come from the heap)."""
    import mmap

    from edgetrain.api import Module
    kept = []
    real = Module.__call__
    leak = 1 << 21

    def leaky(self, *inputs):
        pages = mmap.mmap(-1, leak, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)   # shared ones are not Anonymous
        pages.write(b"\x01" * leak)
        kept.extend((np.ones(leak // 4, np.float32), pages))
        return real(self, *inputs)

    monkeypatch.setattr(Module, "__call__", leaky)
    p = profile_artifacts(digits_artifacts, batch_size=8, steps=4)
    kept.clear()
    train, evaluation = p.reports[:2]
    assert train.py_bytes_per_step >= leak and evaluation.py_net_bytes >= 4 * leak
    # 3 cycles between the first and the last sample, each with a train and an eval call
    assert train.rss_growth >= 5 * leak and (train.anon_growth is None or train.anon_growth >= 5 * leak)


def test_without_memory_runs_times_steps_and_kernels_only(digits_artifacts, monkeypatch):
    """measure_memory=False (bench/train.py's breakdown of multi-second steps) runs no sampled or traced steps."""
    from edgetrain.api import Module
    calls = []
    real = Module.__call__

    def counted(self, *inputs):
        calls.append(1)
        return real(self, *inputs)

    monkeypatch.setattr(Module, "__call__", counted)
    p = profile_artifacts(digits_artifacts, batch_size=8, steps=3, measure_memory=False)
    train = p.reports[0]
    assert train.step_ms > 0 and train.by_op and train.kernel_ms > 0
    assert train.rss_peak == 0 and train.py_transient_bytes == 0
    # warm-up and timed steps of train and eval only: 2 kinds x (3 warm-up + 3 timed)
    assert len(calls) == 2 * (3 + 3)


def test_symbolic_batch_and_user_data(digits_artifacts, tmp_path):
    with pytest.raises(InputError, match=r"'input' is float\[N,64\].*batch size"):
        profile_artifacts(digits_artifacts, steps=2)
    p = profile_artifacts(digits_artifacts, batch_size=8, steps=2)
    assert p.batch_size == 8 and p.inputs == {"input": "float[8,64]", "labels": "int64[8]"}
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "batch.npz", input=rng.standard_normal((12, 64)), labels=rng.integers(0, 10, 12))
    p = profile_artifacts(digits_artifacts, steps=2, data=tmp_path / "batch.npz")
    assert p.inputs == {"input": "float[12,64]", "labels": "int64[12]"}
    np.savez(tmp_path / "wrong.npz", images=np.zeros((4, 64)))
    with pytest.raises(InputError, match="images"):
        profile_artifacts(digits_artifacts, batch_size=4, steps=2, data=tmp_path / "wrong.npz")


def test_synthetic_labels_index_the_classes(shared):
    from edgetrain.api import CheckpointState, Module
    from edgetrain.profiling import _feeds
    folder = shared / "ort_artifacts" / "transformer"
    module = Module(folder / "training_model.onnx", CheckpointState.load_checkpoint(folder / "checkpoint"))
    inputs, _ = _feeds(module, True, None, np.random.default_rng(0), {}, {}, "training model")
    feeds = dict(zip(module.input_names(), inputs))
    # tokens index Embedding(100, 64); labels the 4 classes of the head (ANCHORS.md)
    assert feeds["input"].max() < 100 and feeds["input"].max() > 4 and feeds["labels"].max() < 4
    assert len(np.unique(feeds["labels"])) > 1


def test_a_fixed_batch_is_not_silently_changed(shared):
    with pytest.raises(InputError, match="fixes the batch at 64"):
        profile_artifacts(shared / "ort_artifacts" / "mlp", batch_size=32, steps=2)


def test_budget_below_the_need_fails_before_any_step_naming_need_and_tensors(shared, mlp):
    folder = shared / "ort_artifacts" / "mlp"
    train = mlp.reports[0]
    # mlp's state (parameters and both gradient arrays) outweighs its arena: the store is refused first
    state = mlp.state["parameters"] + mlp.state["gradients"] + mlp.state["frozen"]
    with pytest.raises(MemoryBudgetError, match=f"state .* needs {state} bytes"):
        profile_artifacts(folder, batch_size=64, steps=2, max_memory=train.arena_bytes - 1)
    # cnn's arena outweighs its state: a budget between the two fails at planning, naming the arena's need
    with pytest.raises(MemoryBudgetError) as e:
        profile_artifacts(shared / "ort_artifacts" / "cnn", batch_size=32, steps=2, max_memory=2_000_000)
    text = str(e.value)
    assert re.search(r"training_model.onnx: .*needs an arena of \d+ bytes", text)
    # the tensors alive at the training peak are named, with their types
    assert re.search(r"largest tensors there: .*'[^']+' float\[32,", text)
    with pytest.raises(MemoryBudgetError, match=f"need {mlp.planned_bytes} bytes"):
        profile_artifacts(folder, batch_size=64, steps=2, max_memory=mlp.planned_bytes - 1)
    exact = profile_artifacts(folder, batch_size=64, steps=2, max_memory=mlp.planned_bytes)
    assert exact.planned_bytes == mlp.planned_bytes
    assert all(r.compiled == 0 for r in exact.reports)      # a warm process compiles nothing


def test_module_max_memory_fails_at_planning(shared):
    from edgetrain.api import CheckpointState, Module
    folder = shared / "ort_artifacts" / "cnn"
    module = Module(folder / "training_model.onnx", CheckpointState.load_checkpoint(folder / "checkpoint"),
                    max_memory=1_000_000)      # holds cnn's state (0.6 MB), not its arena (4 MB)
    with pytest.raises(MemoryBudgetError, match=r"needs an arena of \d+ bytes .*largest tensors there"):
        module(np.zeros((32, 1, 28, 28), np.float32), np.zeros(32, np.int64))


def test_cli_json_parses_back(digits_artifacts, capsys):
    from edgetrain.cli import main
    assert main(["profile", str(digits_artifacts), "--batch-size", "8", "--steps", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["batch_size"] == 8 and [r["kind"] for r in report["reports"]] == ["train", "eval", "optimizer"]
    assert all(r["arena_bytes"] <= r["naive_bytes"] for r in report["reports"])
    assert main(["profile", str(digits_artifacts), "--batch-size", "8", "--steps", "2", "--top", "2"]) == 0
    table = capsys.readouterr().out
    assert "train" in table and "top 2" in table
    assert main(["profile", str(digits_artifacts), "--batch-size", "8", "--max-memory", "1kB"]) == 2
    assert "budget of 1000 bytes" in capsys.readouterr().err     # the state is refused first: 29 kB


def test_sizes_parse_like_people_write_them():
    from edgetrain.cli.profile import parse_size
    assert parse_size("64MB") == 64_000_000 and parse_size("1.5GB") == 1_500_000_000
    assert parse_size("512KiB") == 512 * 1024 and parse_size("4096") == 4096 and parse_size("2 mib") == 2 << 20
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")


def test_training_model_alone(digits_artifacts, tmp_path):
    import shutil
    for name in ("training_model.onnx", "checkpoint"):
        shutil.copy(digits_artifacts / name, tmp_path / name)
    p = profile_artifacts(tmp_path, batch_size=4, steps=2)
    assert [r.kind for r in p.reports] == ["train"] and p.state["moments"] == 0
    with pytest.raises(InputError, match="no training_model.onnx"):
        profile_artifacts(tmp_path / "nowhere", batch_size=4)
