"""Cold start: a program's kernels compile in two processes (edgetrain/codegen/parallel_compile.py)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

# six generated kernels (sources as codegen writes them: real files in the cache, loaded by codegen.load), each
# called on its own arrays; prints what compile_ahead did, what this process compiled and the results' bits
SCRIPT = r"""
import json, sys, numpy as np
from edgetrain import codegen
from edgetrain.codegen import parallel_compile
from edgetrain.kernels import _jit

mode = sys.argv[1]
if mode == "failing":
    parallel_compile.helper_command = lambda early=False: [sys.executable, "-c",
                                                           "import sys; sys.exit('helper says no')"]
if "helper_first" in mode:      # this process claims nothing before the helper has claimed a kernel
    import os, time
    claim = parallel_compile.claim

    def after_the_helper(folder, k):
        t = time.monotonic()
        while not os.listdir(folder) and time.monotonic() - t < 120:
            time.sleep(0.01)
        return claim(folder, k)
    parallel_compile.claim = after_the_helper
elif mode == "killed":       # dies part-way, wherever it is (a cache write included)
    command = parallel_compile.helper_command()
    command[2] = ("import os, threading; threading.Timer(float(os.environ['KILL_AFTER']), lambda: os._exit(9))"
                  ".start(); " + command[2])
    parallel_compile.helper_command = lambda early=False: command
SOURCE = '''import math
import numpy as np
from numba import njit


@njit(cache=True, nogil=True, error_model="numpy")
def kernel(a0, o0):
    n0, = o0.shape
    for i0 in range(n0):
        o0[i0] = math.exp(a0[i0] * np.float32({k})) + np.float32({k})
'''
if "early" in mode:                # as a training program's start does, before any kernel is bound
    parallel_compile.start_early()
calls = []
for k in range(6 if "early" not in mode else 2):
    fn = codegen.load(SOURCE.format(k=k + 1))
    x = np.linspace(-1, 1, 37, dtype=np.float32)
    calls.append((fn, (x, np.empty_like(x))))
calls.append(calls[0])                       # a kernel called twice is compiled once
compiled = []
with _jit.compile_listener(lambda: None, lambda: compiled.append(1)):
    report = parallel_compile.compile_ahead(calls)
    for fn, args in calls:
        fn(*args)
print(json.dumps({"report": report, "compiled": len(compiled), "stats": _jit.compile_stats(),
                  "bits": [args[1].view(np.uint32).tolist() for _, args in calls]}))
"""


def _run(tmp_path, mode: str, workers: str = "2", cache: str = "cache", **env):
    env = dict(os.environ, EDGETRAIN_CACHE_DIR=str(tmp_path / cache), EDGETRAIN_COMPILE_WORKERS=workers,
               EDGETRAIN_NO_AOT="1", **env)
    env.pop("NUMBA_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    """The kernels compiled one after another in one process (the helper switched off)."""
    return _run(tmp_path_factory.mktemp("serial"), "plain", workers="1")[0]


@pytest.mark.native
def test_the_kernels_compile_in_two_processes_with_the_same_bits(tmp_path, serial):
    parallel, _ = _run(tmp_path, "helper_first")
    here, helper = parallel["report"]["here"], parallel["report"]["helper"]
    assert here >= 1 and helper >= 1 and here + helper == 6
    assert parallel["report"]["helper_failed"] is None
    # this process compiled what it claimed; the helper's kernels came from the disk cache
    assert parallel["compiled"] == here and parallel["stats"]["misses"] == here
    assert parallel["stats"]["hits"] == helper
    assert serial["report"]["helper"] == 0 and serial["compiled"] == 6
    assert parallel["bits"] == serial["bits"]
    x = np.linspace(-1, 1, 37, dtype=np.float32)   # and the kernels compute what they say
    for k, bits in enumerate(serial["bits"][:6]):
        got = np.array(bits, np.uint32).view(np.float32)
        np.testing.assert_allclose(got, np.exp(x * np.float32(k + 1)) + np.float32(k + 1), rtol=1e-6)


@pytest.mark.native
def test_in_a_first_process_the_helper_starts_early_and_takes_any_number_of_kernels(tmp_path, serial):
    got, _ = _run(tmp_path, "early helper_first")
    assert got["report"]["early"] and got["report"]["helper"] >= 1       # 2 kernels: fewer than MIN_KERNELS
    assert got["report"]["here"] + got["report"]["helper"] == 2 and got["bits"][:2] == serial["bits"][:2]
    later, _ = _run(tmp_path, "early")         # the same cache, not empty now: no early start
    assert not later["report"]["early"] and later["report"]["helper"] == 0 and later["bits"] == got["bits"]


def test_first_compiles_looks_at_numba_cache_and_warm_sets(tmp_path, monkeypatch):
    from edgetrain.codegen import parallel_compile

    monkeypatch.setenv("EDGETRAIN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    assert parallel_compile.first_compiles()
    (tmp_path / "numba").mkdir()
    assert parallel_compile.first_compiles()
    (tmp_path / "numba" / "kernels_0123").mkdir()      # as Numba makes it when a kernel is decorated
    (tmp_path / "aot" / "key").mkdir(parents=True)
    assert parallel_compile.first_compiles()
    (tmp_path / "aot" / "key" / "manifest.json").write_text("{}")
    assert not parallel_compile.first_compiles()
    (tmp_path / "aot" / "key" / "manifest.json").unlink()
    (tmp_path / "numba" / "kernels_0123" / "matmul._gemm_nn-1.py311.nbi").write_bytes(b"")
    assert not parallel_compile.first_compiles()
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert parallel_compile.first_compiles()


@pytest.mark.native
def test_a_failing_helper_falls_back_to_compiling_here(tmp_path, serial):
    got, err = _run(tmp_path, "failing")
    assert "helper says no" in got["report"]["helper_failed"]
    assert "compile helper process failed" in err
    assert got["compiled"] == 6 and got["bits"] == serial["bits"]


@pytest.mark.native
def test_a_killed_helper_leaves_no_entry_a_later_process_would_misread(tmp_path, serial):
    # killed while compiling or saving (its first kernel is done ~0.5 s after its start here)
    got, _ = _run(tmp_path, "killed", KILL_AFTER="0.8")
    failed = got["report"]["helper_failed"]
    assert failed is None or failed.startswith("exit 9")     # None: it finished before the timer
    later, _ = _run(tmp_path, "plain")         # same cache: loads what was saved, compiles the rest
    assert got["bits"] == serial["bits"] == later["bits"]
    assert later["stats"]["hits"] + later["stats"]["misses"] == 6


def test_pending_lists_each_kernel_and_signature_once_and_a_kernel_is_claimed_whole(tmp_path):
    from edgetrain import codegen
    from edgetrain.codegen import parallel_compile

    src = ("import numpy as np\nfrom numba import njit\n\n\n"
           "@njit(cache=True, nogil=True, error_model=\"numpy\")\n"
           "def kernel(a0, o0):\n    o0[0] = a0[0] + np.float32({k})\n")
    f, g = codegen.load(src.format(k=101)), codegen.load(src.format(k=102))
    x32, x64 = np.zeros(2, np.float32), np.zeros(2, np.float64)
    calls = [(f, (x32, x32)), (g, (x32, x32)), (f, (x64, x64)), (f, (x32.copy(), x32)), (print, (1,))]
    jobs = parallel_compile.pending(calls)
    assert [(fn, len(sig)) for fn, sig in jobs] == [(f, 2), (g, 2), (f, 2)]
    groups = parallel_compile.by_kernel(jobs)      # f first: two signatures to compile
    assert [(fn, len(sigs)) for fn, sigs in groups] == [(f, 2), (g, 1)]
    assert parallel_compile.claim(str(tmp_path), 0) and not parallel_compile.claim(str(tmp_path), 0)


def test_the_costliest_kernels_are_claimed_first():
    """What is left for the end, when one process may wait for the other, is the cheapest compiles."""
    from edgetrain import codegen
    from edgetrain.codegen import parallel_compile

    head = "import numpy as np\nfrom numba import njit\n\n\n@njit(cache=True, nogil=True, error_model=\"numpy\")\n"
    small = codegen.load(head + "def kernel(a0, o0):\n    o0[0] = a0[0] + np.float32(104)\n")
    large = codegen.load(head + "def kernel(a0, o0):\n" + "".join(
        f"    for i in range(o0.shape[0]):\n        o0[i] = a0[i] * np.float32({k})\n" for k in range(6)))
    x = (np.zeros(2, np.float32),) * 2
    assert parallel_compile.cost(large) > 3 * parallel_compile.cost(small)
    for order in ([(small, x), (large, x)], [(large, x), (small, x)]):
        assert [fn for fn, _ in parallel_compile.by_kernel(parallel_compile.pending(order))] == [large, small]


def test_a_launcher_that_lists_its_kernels_has_them_compiled_ahead():
    """``kernels.checked`` (SoftmaxCrossEntropy, Gather, ...) and LayerNormalization's launchers run their
    kernels inside a closure; ``kernel_calls`` names them, so the helper can take them too."""
    from edgetrain import codegen
    from edgetrain.codegen import parallel_compile
    from edgetrain.kernels import checked

    src = ("import numpy as np\nfrom numba import njit\n\n\n"
           "@njit(cache=True, nogil=True, error_model=\"numpy\")\n"
           "def kernel(a0, o0):\n    o0[0] = a0[0] + np.float32({k})\n")
    f = codegen.load(src.format(k=103))
    x = np.zeros(2, np.float32)
    run, args = checked(f, (x, x), None, 0, x, "anything")
    assert args == () and [(fn, len(sig)) for fn, sig in parallel_compile.pending([(run, args)])] == [(f, 2)]


def test_the_helper_runs_only_when_a_cpu_is_free(monkeypatch):
    from edgetrain.codegen import parallel_compile

    monkeypatch.delenv("EDGETRAIN_COMPILE_WORKERS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(os, "getloadavg", lambda: (2.5, 0.0, 0.0))
    assert parallel_compile.workers() == 2
    monkeypatch.setattr(os, "getloadavg", lambda: (3.5, 0.0, 0.0))
    assert parallel_compile.workers() == 1
    monkeypatch.setenv("EDGETRAIN_COMPILE_WORKERS", "2")
    assert parallel_compile.workers() == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setenv("EDGETRAIN_COMPILE_WORKERS", "")
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert parallel_compile.workers() == 1


def test_cache_saves_wait_for_the_lock_another_process_holds(tmp_path):
    """Numba's cache saves run under ``atomic.locked`` on the cache folder's lock file (a second open file
    description, as another process has, cannot take it meanwhile)."""
    import fcntl

    from edgetrain import atomic
    from edgetrain.codegen import parallel_compile
    from edgetrain.kernels import _jit

    assert parallel_compile.lock_cache_saves(_jit.load_numba())
    from numba.core import caching

    assert getattr(caching.IndexDataCacheFile.save, "edgetrain_locked", False)
    path = tmp_path / "lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        with atomic.locked(path):
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


@pytest.mark.parametrize("name", ["mobilenet", "transformer"])
def test_a_first_step_compiles_nothing_that_was_not_compiled_ahead(shared, tmp_path, monkeypatch, name):
    """Every kernel a training step and the optimizer's update call, including those inside launchers (batch
    norm's four, a conv's im2col then GEMM, a GEMM then its bias loop, layer norm's rows, AdamW's update), is
    one ``compile_ahead`` hands out at the first program's run: none gets a new signature at its call. Here
    compile_ahead compiles what it would hand out in this process (a Numba cache hit where cached)."""
    from edgetrain import artifacts, checkpoint
    from edgetrain.api import CheckpointState, Module, Optimizer
    from edgetrain.codegen import parallel_compile
    from edgetrain.kernels import _jit

    snapshots = []

    def compile_here(calls):
        for fn, sig in parallel_compile.pending(calls):
            fn.compile(sig)
        if not snapshots:        # after the first program's: the optimizer's program is bound by then
            snapshots.append({d: len(d.overloads) for d in _jit.dispatchers()})
        return {}
    monkeypatch.setattr(parallel_compile, "compile_ahead", compile_here)
    ckpt = checkpoint.load(shared / "ort_artifacts" / name / "checkpoint")
    artifacts.generate_artifacts(str(shared / "models" / f"{name}.onnx"), requires_grad=list(ckpt.trainable),
                                 frozen_params=list(ckpt.frozen), loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    module = Module(str(tmp_path / "training_model.onnx"), state)
    optimizer = Optimizer(str(tmp_path / "optimizer_model.onnx"), module)
    rng = np.random.default_rng(0)
    shape = {"mobilenet": (16, 3, 32, 32), "transformer": (8, 32)}[name]      # the models' fixed batches
    feed = rng.integers(0, 100, shape) if name == "transformer" else rng.standard_normal(shape, np.float32)
    module.train()
    module(feed, rng.integers(0, 4, shape[0]))
    optimizer.step()
    grown = sorted(f"{d.py_func.__module__}.{d.py_func.__qualname__}" for d in _jit.dispatchers()
                   if len(d.overloads) > snapshots[0].get(d, 0))
    assert snapshots
    assert not grown, grown
