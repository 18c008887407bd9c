"""A second process loads every kernel from the disk cache and compiles nothing."""
import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json, sys, numpy as np, edgetrain
from edgetrain.kernels import _jit
sess = edgetrain.InferenceSession(sys.argv[1])
shape = [d if isinstance(d, int) else 4 for d in sess.get_inputs()[0].shape]
sess.run(None, {"input": np.ones(shape, np.float32)})
print(json.dumps(_jit.compile_stats()))
"""


@pytest.mark.native
def test_second_process_hits_the_kernel_cache(shared, tmp_path):
    env = dict(os.environ, EDGETRAIN_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("NUMBA_CACHE_DIR", None)
    model = str(shared / "models" / "cnn.onnx")

    def run():
        out = subprocess.run([sys.executable, "-c", SCRIPT, model], env=env, capture_output=True, text=True,
                             check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    cold = run()
    warm = run()
    assert cold["misses"] > 0 and cold["hits"] == 0
    assert warm["misses"] == 0 and warm["hits"] == cold["misses"]
    assert any(p.name.startswith("fused_") for p in (tmp_path / "cache" / "gen").iterdir())


SLICE = """
import json, numpy as np
from edgetrain.kernels import _jit
numba = _jit.load_numba()
from numba.core import event
compiled = []
class Listener(event.Listener):
    def on_start(self, e):
        pass
    def on_end(self, e):
        compiled.append(e.data["dispatcher"].py_func.__module__)
event.register("numba:compile", Listener())

@numba.njit
def assign(a, b):
    a[1:4] = b

assign(np.zeros(5), np.ones(3))
try:
    assign(np.zeros(5), np.ones(2))
    message = None
except ValueError as e:
    message = str(e)
print(json.dumps({"message": message, "compiled": compiled}))
"""


@pytest.mark.native
def test_slice_assignment_compiles_without_numbas_string_formatting():
    """kernels/_jit.py gives Numba's CPU target the plain slice-assignment error: a cold process compiling a
    kernel with ``a[i:j] = b`` then compiles no unicode helpers for the message (0.6 s instead of 2.7 s for a
    one-line kernel); a mismatch is still refused."""
    out = subprocess.run([sys.executable, "-c", SLICE], capture_output=True, text=True, check=True, timeout=300)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["message"] == "cannot assign slice from input of different size"
    # the kernel and the constant raise, nothing of numba.cpython (unicode, str, repr: ~25 helpers before)
    assert sorted(got["compiled"]) == ["__main__", "numba.np.arrayobj"]
