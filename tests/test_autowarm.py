"""The warm kernel set built by default (``kernels/_autowarm.py`` decides and starts, ``minimal_build/autowarm.py``
builds): a process that ran an artifact folder under the JIT starts a background build of its warm set; a later
process trains from it without importing Numba, with the JIT's losses bit for bit (the oracle: the JIT process
itself); a build cut off halfway is never used; ``EDGETRAIN_NO_AUTOWARM=1`` starts nothing.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgetrain.minimal_build import autowarm

# Three AdamW steps on x of the shape argv[2] gives and labels over its leading dims (argv[3] classes), then an
# eval step; prints the losses, whether the warm set was used and whether Numba was imported.
TRAIN = r"""
import json, sys
import numpy as np
from edgetrain.api import CheckpointState, Module, Optimizer
from edgetrain.kernels import _jit
art, x_shape, classes = sys.argv[1], [int(d) for d in sys.argv[2].split(",")], int(sys.argv[3])
state = CheckpointState.load_checkpoint(art + "/checkpoint")
module = Module(art + "/training_model.onnx", state, art + "/eval_model.onnx")
optimizer = Optimizer(art + "/optimizer_model.onnx", module)
rng = np.random.default_rng(0)
losses = []
for _ in range(3):
    x = rng.standard_normal(x_shape).astype(np.float32)
    y = rng.integers(0, classes, int(np.prod(x_shape[:-1])))
    losses.append(float(module(x, y)).hex())
    optimizer.step()
    module.lazy_reset_grad()
module.eval()
losses.append(float(module(x, y)).hex())
print(json.dumps({"losses": losses, "warm": _jit.warm_set() is not None, "numba": "numba" in sys.modules}))
"""


def _tiny_artifacts(folder: Path) -> Path:
    """A 4 -> 3 Gemm classifier (batch fixed at 2): the smallest set of kernels a training run has."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgetrain import artifacts

    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(3, np.float32), "b")
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folder.mkdir()
    artifacts.generate_artifacts(model, requires_grad=["w", "b"], loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=folder)
    onnx.checker.check_model(onnx.load(str(folder / "training_model.onnx")))
    return folder


def _env(cache: Path, **extra) -> dict:
    env = dict(os.environ, EDGETRAIN_CACHE_DIR=str(cache), **extra)
    for k in ("NUMBA_CACHE_DIR", "EDGETRAIN_NO_AOT", *(() if autowarm.OPT_OUT in extra else (autowarm.OPT_OUT,))):
        env.pop(k, None)
    return env


def _train(art: Path, cache: Path, **extra) -> dict:
    out = subprocess.run([sys.executable, "-c", TRAIN, str(art), "2,4", "3"], env=_env(cache, **extra),
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _status(cache: Path, until, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = autowarm.read_status(cache / "aot" / autowarm.STATUS)
        if status is not None and until(status):
            return status
        time.sleep(0.2)
    raise AssertionError(f"no automatic build reached the state asked for in {timeout} s: {status}")


@pytest.mark.native
@pytest.mark.slow
@pytest.mark.skipif(autowarm.compiler_missing() is not None, reason="no C compiler / Python headers here")
def test_a_jit_run_builds_the_warm_set_for_the_next_process(tmp_path):
    art, cache = _tiny_artifacts(tmp_path / "tiny"), tmp_path / "cache"
    jit = _train(art, cache, **{autowarm.OPT_OUT: "1"})         # cold: compiles, and opted out
    assert jit["numba"] and not jit["warm"]
    time.sleep(2)
    assert not (cache / "aot" / autowarm.STATUS).exists() and not list((cache / "aot").glob("*/manifest.json"))

    first = _train(art, cache)                                   # starts the build on its way out
    assert first["losses"] == jit["losses"] and not first["warm"]
    running = _status(cache, lambda s: s["state"] == "running" and list((cache / "aot").glob(".stage-*")))
    assert running["folders"] == [str(art.resolve())]
    os.killpg(running["pid"], signal.SIGKILL)                     # cut off halfway: the staged set is not used
    cut = _train(art, cache)
    assert not cut["warm"] and cut["numba"] and cut["losses"] == jit["losses"]

    done = _status(cache, lambda s: s["state"] != "running" and s["pid"] != running["pid"])   # `cut` restarted it
    assert done["state"] == "done", done
    warm = _train(art, cache)
    assert warm["warm"] and not warm["numba"]
    assert warm["losses"] == jit["losses"]
    time.sleep(2)                                                 # a warm process asks for no new build
    assert autowarm.read_status(cache / "aot" / autowarm.STATUS) == done


def test_the_decision():
    a, b = "/art/a", "/art/b"
    assert autowarm.decide([a], jit_ran=False, warmed=[], failed=[]) == []      # the warm set served everything
    assert autowarm.decide([a, b], jit_ran=True, warmed=[a], failed=[]) == [b]
    assert autowarm.decide([a], jit_ran=True, warmed=[a, b], failed=[]) == []   # a kernel outside: not rebuilt
    assert autowarm.decide([a], jit_ran=True, warmed=[], failed=[a]) == []      # failed under this key before
    assert autowarm.decide([a, b], jit_ran=True, warmed=[], failed=[a]) == [a, b]


def test_switched_off_and_where_it_cannot_build(monkeypatch, tmp_path):
    assert os.environ.get(autowarm.OPT_OUT) == "1"                 # conftest: the suite never spawns builds
    assert not autowarm.enabled()
    monkeypatch.delenv(autowarm.OPT_OUT)
    monkeypatch.delenv("EDGETRAIN_NO_AOT")                         # conftest: no warm set serves the suite
    assert autowarm.enabled()
    monkeypatch.setenv("EDGETRAIN_NO_AOT", "1")                    # no warm path, nothing to build it for
    assert not autowarm.enabled()
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert "no C compiler" in autowarm.compiler_missing()
    assert autowarm.start(["/art/a"]) is None


def test_only_completeartifact_folders_are_built(shared, tmp_path):
    lone = tmp_path / "lone"
    lone.mkdir()
    digits = str(shared / "ort_artifacts" / "digits")
    (lone / "training_model.onnx").write_bytes((Path(digits) / "training_model.onnx").read_bytes())
    assert autowarm.artifact_folders([str(lone), digits]) == ([digits], [str(lone)])


def test_the_recording_runs_each_folder_unsplit_and_split(monkeypatch):
    """Ops above their thread-split thresholds call kernels with other signatures at 2 threads than at 1: the
    warm set records both (a set recorded at 1 thread sent cnn's 2-thread processes back to Numba)."""
    from edgetrain.minimal_build import record, warm

    seen = []
    monkeypatch.setattr(record, "has_symbolic_dims", lambda folder: True)
    monkeypatch.setattr(record, "exercise", lambda folder, batch: seen.append(
        (batch, os.environ.get("EDGETRAIN_NUM_THREADS"))) or set())
    monkeypatch.setattr(record, "collect_kernels", lambda: [])
    monkeypatch.setenv("EDGETRAIN_NUM_THREADS", "3")
    record.record([Path("/art/a")], [1, 32], warm.THREADS)
    assert seen == [(1, "1"), (32, "1"), (1, "2"), (32, "2")]
    assert os.environ["EDGETRAIN_NUM_THREADS"] == "3"


def _sequence_artifacts(folder: Path) -> Path:
    """x [N, T, 4] -> MatMul -> Reshape [N*T, 3]: the labels' only dim is a product of two symbolic dims, which
    no batch size gives (bench's gpt workload, small)."""
    from onnx import TensorProto, helper, numpy_helper

    from edgetrain import artifacts

    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([-1, 3], np.int64), "shape")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]),
                               helper.make_node("Reshape", ["h", "shape"], ["y"])], "sequence",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])], [w, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folder.mkdir()
    artifacts.generate_artifacts(model, requires_grad=["w"], loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=folder)
    return folder


@pytest.mark.native
@pytest.mark.skipif(autowarm.compiler_missing() is not None, reason="no C compiler / Python headers here")
def test_labels_of_a_product_dim_are_warmed_with_the_shapes_the_run_fed(tmp_path):
    art, cache = _sequence_artifacts(tmp_path / "sequence"), tmp_path / "cache"
    code = ["-c", TRAIN, str(art), "2,5,4", "3"]      # labels [N*T] = [10]
    run = lambda: json.loads(subprocess.run([sys.executable, *code], env=_env(cache), capture_output=True,  # noqa: E731
                                            text=True, check=True).stdout.strip().splitlines()[-1])
    jit = run()                                                   # the oracle: the JIT; starts the build on exit
    assert jit["numba"] and not jit["warm"]
    done = _status(cache, lambda s: s["state"] != "running")
    assert done["state"] == "done", done
    warm = run()
    assert warm["warm"] and not warm["numba"]                     # training and eval steps served by the set
    assert warm["losses"] == jit["losses"]


def test_a_module_records_the_shapes_it_was_fed(tmp_path):
    from edgetrain.api import CheckpointState, Module

    art = _sequence_artifacts(tmp_path / "sequence")
    module = Module(art / "training_model.onnx", CheckpointState.load_checkpoint(art / "checkpoint"),
                    art / "eval_model.onnx")
    for n, t in ((2, 5), (2, 5), (1, 7)):
        module(np.zeros((n, t, 4), np.float32), np.zeros(n * t, np.int64))
    module.eval()
    module(np.zeros((3, 2, 4), np.float32), np.zeros(6, np.int64))
    assert module.training_program.fed_shapes().by_model == {
        "train": [{"x": [[2, 5, 4], "float32"], "labels": [[10], "int64"]},
                  {"x": [[1, 7, 4], "float32"], "labels": [[7], "int64"]}],
        "eval": [{"x": [[3, 2, 4], "float32"], "labels": [[6], "int64"]}]}


def test_the_batch_size_path_names_the_input_it_cannot_shape(tmp_path):
    from edgetrain.errors import EdgetrainError
    from edgetrain.minimal_build.exercise import exercise

    art = _sequence_artifacts(tmp_path / "sequence")
    with pytest.raises(EdgetrainError, match=r"input 'labels' has dim 0 = 'N\*T', which a batch size cannot give"):
        exercise(art, 32)


@pytest.mark.parametrize("feeds, problem", [
    ([], "not a mapping"),
    ({"test": []}, "unknown model 'test'"),
    ({"train": [{}]}, "train set 0: not a mapping of input names"),
    ({"train": [{"x": [[2, -1], "float32"]}]}, "input 'x': not"),
    ({"train": [{"x": [[2, 3.0], "float32"]}]}, "input 'x': not"),
    ({"train": [{"x": [[2], "object"]}]}, "input 'x': not"),
    ({"train": [{"x": [[1 << 20, 1 << 20], "float32"]}]}, "bytes of inputs, more than"),
    ({"eval": [{"x": [[1], "int64"]}] * 9}, "at most 8 shape sets"),
])
def test_the_shapes_are_checked_as_data(feeds, problem):
    from edgetrain.errors import EdgetrainError
    from edgetrain.minimal_build.exercise import check_feeds

    with pytest.raises(EdgetrainError, match=f"input shapes for folder a: .*{problem}"):
        check_feeds(feeds, "folder a")
    good = {"train": [{"x": [[2, 5, 4], "float32"], "labels": [[10], "int64"]}]}
    assert check_feeds(good, "a") == {"train": [{"x": ((2, 5, 4), "float32"), "labels": ((10,), "int64")}]}


def test_the_shapes_are_checked_against_the_memory_budget(monkeypatch):
    from edgetrain.errors import MemoryBudgetError
    from edgetrain.minimal_build.exercise import check_feeds

    feeds = {"train": [{"x": [[64, 1024], "float32"]}]}          # 256 KiB of inputs
    monkeypatch.setenv("EDGETRAIN_MAX_MEMORY", "100kB")
    with pytest.raises(MemoryBudgetError, match="input shapes for folder a: train set 0's inputs needs 262144 bytes"):
        check_feeds(feeds, "folder a")
    monkeypatch.setenv("EDGETRAIN_MAX_MEMORY", "1MB")
    assert check_feeds(feeds, "folder a") == {"train": [{"x": ((64, 1024), "float32")}]}


def test_the_shapes_reach_the_build_process_as_json(monkeypatch):
    import subprocess as sp

    started = []
    from edgetrain.kernels import _autowarm       # where start() looks the compiler up

    monkeypatch.setattr(sp, "Popen", lambda cmd, **kw: started.append(cmd))
    monkeypatch.setattr(_autowarm, "compiler_missing", lambda: None)
    shapes = {"train": [{"x": [[2, 5, 4], "float32"]}], "eval": []}
    autowarm.start(["/art/a", "/art/b"], {"/art/a": shapes, "/art/b": {"train": [], "eval": []}, "/art/c": shapes})
    args = autowarm.parse_args(started[0][3:])
    assert args.folders == ["/art/a", "/art/b"] and args.feeds == {"/art/a": shapes}   # b ran nothing: batch sizes


def test_shapes_a_manifest_recorded_are_checked_before_a_rebuild_uses_them():
    from edgetrain.minimal_build import warm

    good = {"train": [{"x": [[2, 5, 4], "float32"]}]}
    said = []
    kept = warm.known_feeds({"/art/a": good, "/art/b": {"train": [{"x": [[2], "float32"]}]} | {"eval": 3},
                             "/art/gone": good}, ["/art/a", "/art/b", "/art/c"], said.append)
    assert kept == {"/art/a": {"train": [{"x": ((2, 5, 4), "float32")}]}}       # b at batch sizes, c never had shapes
    assert len(said) == 1 and "artifact folder /art/b" in said[0] and "running it at batch sizes" in said[0]
