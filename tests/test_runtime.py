"""The runtime: steady-state runs allocate nothing, outputs are fresh copies, the CLI demo runs."""
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from conftest import random_feed

import edgetrain

pytestmark = pytest.mark.arm64   # also on the emulated arm64 stage (.ci/run, README "Platforms")


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "mobilenet"])
def test_steady_state_runs_allocate_nothing(shared, name):
    sess = edgetrain.InferenceSession(str(shared / "models" / f"{name}.onnx"))
    rng = np.random.default_rng(0)
    feeds = {i.name: random_feed(i, rng) for i in sess.get_inputs()}
    prog = sess.program(feeds)
    inputs = [feeds[i.name] for i in sess.get_inputs()]
    arena_bytes = prog.plan.arena_bytes
    tracemalloc.start()
    try:
        for _ in range(3):      # numpy and Numba fill small internal caches on the first traced calls
            prog.run(inputs)
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for _ in range(20):
            prog.run(inputs)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert current - base < 1024, f"20 runs kept {current - base} bytes"
    assert peak - base < max(4096, arena_bytes // 100), f"a run allocated {peak - base} bytes"


def test_outputs_survive_the_next_run(shared):
    sess = edgetrain.InferenceSession(str(shared / "models" / "digits.onnx"))
    a = np.ones((4, 64), np.float32)
    (ya,) = sess.run(None, {"input": a})
    kept = ya.copy()
    sess.run(None, {"input": -a})
    np.testing.assert_array_equal(ya, kept)


def test_get_inputs_and_outputs_mirror_onnxruntime(shared):
    import onnxruntime as ort
    path = str(shared / "models" / "digits.onnx")
    ours, theirs = edgetrain.InferenceSession(path), ort.InferenceSession(path)
    for a, b in [(ours.get_inputs(), theirs.get_inputs()), (ours.get_outputs(), theirs.get_outputs())]:
        assert [(x.name, x.shape, x.type) for x in a] == [(x.name, x.shape, x.type) for x in b]


def test_cli_plan(shared, capsys):
    from edgetrain.cli import main
    assert main(["plan", str(shared / "models" / "digits.onnx"), "--dim", "N=4"]) == 0
    assert "FusedMatMul" in capsys.readouterr().out
    assert main(["plan", str(shared / "models" / "missing.onnx")]) == 2



def test_each_program_sets_blas_to_one_thread_again(shared):
    """Another library may change BLAS's threads between two programs' creation (OpenBLAS's multithreaded GEMMs
    round the mlp's eval loss 2 ulps apart from one thread): every new program sets one thread again. The oracle
    is threadpoolctl (scikit-learn's), which both changes the count and reads it back."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    sess = edgetrain.InferenceSession(str(shared / "models" / "digits.onnx"))
    sess.run(None, {"input": np.ones((4, 64), np.float32)})              # a first program: one thread
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        sess.run(None, {"input": np.ones((5, 64), np.float32)})          # another shape: a new program
        counts = [i["num_threads"] for i in threadpoolctl.threadpool_info()    # numpy's: what the GEMMs call
                  if i["user_api"] == "blas" and "numpy" in i["filepath"]]
    if not counts:
        pytest.skip("numpy's BLAS is not one threadpoolctl finds by its path here")
    assert counts == [1], counts


@pytest.mark.native
def test_numpys_blas_gets_one_thread_when_another_blas_is_loaded():
    """With scipy's OpenBLAS loaded beside numpy's (scikit-learn, scipy imported first), the thread setter reached
    numpy's only in the processes whose string hashing ordered it first (a set of library paths): run under three
    hash seeds, each process reads numpy's BLAS back with threadpoolctl."""
    pytest.importorskip("scipy.linalg")
    pytest.importorskip("threadpoolctl")
    code = ("import numpy, scipy.linalg, threadpoolctl\n"
            "from edgetrain.blas import limit_blas_threads\n"
            "limit_blas_threads(1)\n"
            "print([i['num_threads'] for i in threadpoolctl.threadpool_info()\n"
            "       if i['user_api'] == 'blas' and 'numpy' in i['filepath']])\n")
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed, OPENBLAS_NUM_THREADS="2")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() in ("[1]", "[]"), (seed, out.stdout, out.stderr[-2000:])
