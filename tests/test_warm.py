"""The full package's warm path (``edgetrain warm``, ``kernels/_warm.py``): a process whose kernels were compiled
ahead of time trains without importing Numba, exactly as the JIT does; a set under another key, or one whose
manifest was edited, is not used (the JIT runs instead, with the reason logged).

The oracle is the JIT itself, in a process with the warm path switched off (``EDGETRAIN_NO_AOT=1``): the
ahead-of-time kernels are compiled from the same source with the same options for the same CPU, so the losses
must be equal bit for bit.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.native

# Digits at batch 32 and 1 (AdamW), then an eval step; which heavy modules the process imported.
TRAIN = r"""
import json, sys
import numpy as np
from edgetrain.trainer import open_artifacts
from edgetrain.kernels import _jit
state, module, optimizer = open_artifacts(sys.argv[1])
rng = np.random.default_rng(0)
losses = []
for batch in (32, 32, 1, 32):
    x = rng.standard_normal((batch, 64)).astype(np.float32)
    y = rng.integers(0, 10, batch).astype(np.int64)
    losses.append(float(module(x, y)).hex())
    optimizer.step()
    module.lazy_reset_grad()
module.eval()
losses.append(float(module(x, y)).hex())
print(json.dumps({"losses": losses, "warm": _jit.warm_set() is not None,
                  "imported": sorted({m.split(".")[0] for m in sys.modules} & {"numba", "llvmlite"})}))
"""


def _env(cache, **env):
    """The suite's environment with the warm path on (conftest turns it off) and the kernel cache in ``cache``."""
    run_env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "EDGETRAIN_NO_AOT")}
    return dict(run_env, EDGETRAIN_CACHE_DIR=str(cache), **env)


def _run(art, cache, **env):
    run_env = _env(cache, **env)
    out = subprocess.run([sys.executable, "-c", TRAIN, str(art)], env=run_env, capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.fixture(scope="module")
def warmed(shared, tmp_path_factory):
    """A cache folder holding the warm kernel set of the digits artifacts (one AOT build: ~30 s)."""
    root = tmp_path_factory.mktemp("warm")
    cache, art = root / "cache", root / "digits"
    art.mkdir()
    for name in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint"):
        shutil.copyfile(shared / "ort_artifacts" / "digits" / name, art / name)   # only these: stray files refused
    env = _env(cache)
    out = subprocess.run([sys.executable, "-m", "edgetrain", "warm", str(art), "--batch-size", "1", "32"],
                         env=env, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-2000:]
    assert "warm kernel set" in out.stdout
    jit, _ = _run(art, cache, EDGETRAIN_NO_AOT="1")
    assert jit["imported"] == ["llvmlite", "numba"] and not jit["warm"]     # the oracle really is the JIT
    return art, cache, jit


def _copy(cache, tmp_path):
    """A copy of the warmed cache to tamper with (the module's fixture stays intact)."""
    shutil.copytree(cache, tmp_path / "cache", symlinks=True)
    sets = [p for p in (tmp_path / "cache" / "aot").iterdir() if (p / "manifest.json").is_file()]   # not status files
    return tmp_path / "cache", sets[0]


def test_a_warm_process_trains_as_the_jit_without_numba(warmed):
    art, cache, jit = warmed
    warm, _ = _run(art, cache)
    assert warm["warm"] and warm["imported"] == []
    assert warm["losses"] == jit["losses"]


def test_the_set_is_compiled_for_this_cpu(warmed):
    """The exports target this CPU as the JIT does (name and features): pycc's default is a generic CPU (on x86
    SSE2 only), whose loops run slower than the JIT's (no AVX2/FMA). Checked in the module's machine code:
    vector loops on 256-bit registers where this CPU has AVX2."""
    import llvmlite.binding as ll
    from numba.core.codegen import get_host_cpu_features

    _, cache, _ = warmed
    folder = next(p for p in (cache / "aot").iterdir() if (p / "manifest.json").is_file())
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["target_cpu"] == ll.get_host_cpu_name()
    assert manifest["cpu_features"] == get_host_cpu_features()
    objdump = shutil.which("objdump")
    if objdump is None or "+avx2" not in manifest["cpu_features"].split(","):
        pytest.skip("needs objdump and an x86 CPU with AVX2 to read the exports' machine code")
    module = next(folder.glob("_aot_kernels*"))
    code = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(module)], capture_output=True, text=True,
                          check=True).stdout
    assert "%ymm" in code


def test_a_set_under_another_key_is_not_used(warmed):
    """Any change the key covers (here one more NUMBA_ switch; kernel sources, versions and the CPU alike)
    makes the process look in another folder: it finds nothing there and compiles with Numba."""
    art, cache, jit = warmed
    other, err = _run(art, cache, NUMBA_EDGETRAIN_KEY_PROBE="1")
    assert not other["warm"] and "numba" in other["imported"]
    assert other["losses"] == jit["losses"]


def test_a_kernel_the_set_lacks_falls_back_to_the_jit(warmed, tmp_path):
    cache, folder = _copy(warmed[1], tmp_path)
    code = r"""
import sys, numpy as np
from edgetrain.kernels import _jit, training
assert _jit.warm_set() is not None and "numba" not in sys.modules
a = np.zeros(4)                                   # float64: the set has float32 only
w = np.ones(4)
training.adamw_update(w, a, a, a, np.ones(4), np.zeros(1, np.int64), a, a, 1, True)
print("numba" in sys.modules, w.tolist())
"""
    env = _env(cache)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("True")


@pytest.mark.parametrize("tamper, reason", [
    ("argkey", "does not match the digest"),
    ("export", "names export"),
    ("key", "another key"),
    ("module", "does not match the digest"),
])
def test_a_tampered_set_is_refused_with_the_reason(warmed, tmp_path, tamper, reason):
    art, cache, jit = warmed
    cache, folder = _copy(cache, tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    kid = next(k for k, e in manifest["kernels"].items() if e and e[0][1] and "float32" in e[0][1][0])
    if tamper == "argkey":       # a signature it was not compiled for: native code would misread memory
        manifest["kernels"][kid][0][1][0] = manifest["kernels"][kid][0][1][0].replace("float32", "float64")
    elif tamper == "export":     # another kernel's code under this kernel's id
        other = next(k for k in manifest["kernels"] if k != kid)
        manifest["kernels"][kid][0][0] = manifest["kernels"][other][0][0]
    elif tamper == "key":        # a set copied from another machine or version
        manifest["key"] = "0" * 32
    if tamper == "module":       # a module built from another manifest (the same set warmed with more kernels)
        manifest["kernels"]["edgetrain.kernels.training.extra"] = []
    (folder / "manifest.json").write_text(json.dumps(manifest))
    got, err = _run(art, cache)
    assert not got["warm"] and "numba" in got["imported"]
    assert "ignoring the warm kernel set" in err and reason in err, err[-2000:]
    assert got["losses"] == jit["losses"]


def test_the_key_follows_the_kernel_sources(monkeypatch):
    from pathlib import Path

    from edgetrain.kernels import _warm

    before = _warm.key()
    real = Path.read_bytes

    def edited(self):
        data = real(self)
        return data + b"\n# edited" if self.name == "softmax.py" and self.parent.name == "kernels" else data

    monkeypatch.setattr(Path, "read_bytes", edited)
    assert _warm.key() != before
    monkeypatch.undo()
    assert _warm.key() == before


def test_warm_writes_the_packages_bytecode():
    """``edgetrain warm`` (and the benchmarks) write the .pyc files pip writes for a wheel: without them (an
    editable install, PYTHONDONTWRITEBYTECODE) every process compiles the package from source."""
    import importlib.util

    import edgetrain.api
    from edgetrain.minimal_build.warm import compile_bytecode

    cached = Path(importlib.util.cache_from_source(edgetrain.api.__file__))
    cached.unlink(missing_ok=True)
    assert compile_bytecode()
    assert cached.is_file() and cached.stat().st_size > 1000
