"""Numba's disk cache is keyed by source file, and an entry names the module its kernel was compiled in: the
kernels import only as ``edgetrain.kernels`` (``kernels.rnn`` from the repository's root is refused), so every
path (a training process, the compile helper, the warm set's builds) writes entries the others load; an entry
naming a module a process cannot import (written by a scratch script) is compiled again instead of failing
the call."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.native

REPO = Path(__file__).resolve().parents[1]

# a GRU gate step of kernels/rnn.py (its cache entry names its module: it rebuilds the module's environment)
RNN = r"""
import importlib, json, sys
import numpy as np
rnn = importlib.import_module("edgetrain.kernels.rnn")
from edgetrain.kernels import _jit
f, h = np.zeros((2, 6), np.float32), np.zeros((2, 3), np.float32)
rnn._gru_gates(f, f, np.zeros(6, np.float32), np.zeros(6, np.float32), h, f.copy(), h.copy(), 0,
               np.ones(2, np.int32), 0)
print(json.dumps(_jit.compile_stats()))
"""

# ``total`` of MODULE, imported as the module named argv[2] with argv[1] on sys.path
CALL = r"""
import importlib, json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
m = importlib.import_module(sys.argv[2])
from edgetrain.kernels import _jit
print(json.dumps({"total": m.total(np.arange(4.0)), "stats": _jit.compile_stats()}))
"""
MODULE = """
import numpy as np

from edgetrain.kernels._jit import jit

SCALE = np.array([2.0])


@jit
def total(a):
    s = 0.0
    for v in a:
        s += v * SCALE[0]
    return s
"""


def _python(args, cache: Path, cwd: Path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), EDGETRAIN_NO_AOT="1")
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, check=False)


def test_the_kernels_load_only_as_edgetrain_kernels(tmp_path):
    cache = tmp_path / "numba"
    cache.mkdir(mode=0o700)
    top = _python(["-c", "import kernels.rnn"], cache, REPO)      # the repository's root is on sys.path here
    assert top.returncode != 0 and "imported as 'kernels': import them as edgetrain.kernels" in top.stderr
    assert not list(cache.rglob("*.nbi"))
    first = _python(["-c", RNN], cache, REPO)
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads(first.stdout)["misses"] == 1
    later = _python(["-c", RNN], cache, tmp_path)                 # another process, elsewhere: loads it
    assert later.returncode == 0, later.stderr[-3000:]
    assert json.loads(later.stdout) | {"kernels": 0} == {"hits": 1, "misses": 0, "kernels": 0}


def test_a_cache_entry_naming_a_module_gone_is_compiled_again(tmp_path):
    pkg = tmp_path / "scratch_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(MODULE)
    cache, elsewhere = tmp_path / "numba", tmp_path / "run"
    cache.mkdir(mode=0o700)
    elsewhere.mkdir()
    runs = [_python(["-c", CALL, str(where), name], cache, elsewhere)
            for where, name in ((tmp_path, "scratch_pkg.mod"), (pkg, "mod"), (pkg, "mod"))]
    assert all(r.returncode == 0 for r in runs), runs[1].stderr[-3000:]
    first, healed, after = (json.loads(r.stdout) for r in runs)
    assert first["total"] == healed["total"] == after["total"] == 12.0
    assert first["stats"]["misses"] == 1 and healed["stats"]["misses"] == 1     # compiled again, not raised
    assert "does not load (No module named 'scratch_pkg'); compiling it again" in runs[1].stderr
    assert after["stats"]["hits"] == 1 and after["stats"]["misses"] == 0          # the new entry replaced it
