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
