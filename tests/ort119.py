"""ONNX Runtime 1.19.2 (the last on-device training release) in its own venv, for interop tests.

ORT's training wheels stop at Python 3.11, so the tests never import ORT into their own process: ``ensure()``
creates (once, under a file lock) or reuses a venv made with python3.11 at ``~/.cache/edgetrain/ort119-venv``
(or ``$EDGETRAIN_ORT119_VENV``) holding the pins of ANCHORS.md, and ``run(snippet)`` executes Python in it and
returns what the snippet put in ``OUT`` (arrays travel as .npz, everything else as JSON).

The snippet runs with ``torch`` blocked (ORT's training package would otherwise import it) and with these
names bound: ``ort_api`` (``onnxruntime.training.api`` imported without the package's ``__init__``), ``ort``
(``onnxruntime``), ``np``, ``fbs`` (``fbs("Checkpoint").Checkpoint`` is the flatbuffer class ORT generated for
that table, from its wheel), ``ARGS`` (JSON-able inputs), ``ARRAYS`` (numpy inputs) and ``OUT`` (a dict to
fill).
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

PINS = ("onnxruntime-training-cpu==1.19.2", "onnx==1.17.0", "numpy==2.4.6", "protobuf")
VENV = Path(os.environ.get("EDGETRAIN_ORT119_VENV")
            or Path(os.path.expanduser("~")) / ".cache" / "edgetrain" / "ort119-venv")
_MARKER = ".edgetrain-ort119"   # written last: its content (the pins) says the venv is complete


class Unavailable(Exception):
    """No python3.11 on this machine, so ORT 1.19.2's training wheel cannot be installed."""


def find_python311() -> str:
    """Path of a Python 3.11 interpreter, or raise ``Unavailable``."""
    found = shutil.which("python3.11")
    if found:
        return found
    if sys.version_info[:2] == (3, 11):
        return getattr(sys, "_base_executable", sys.executable)
    raise Unavailable(f"python3.11 is not on PATH (this is Python {sys.version.split()[0]}); ORT 1.19.2's "
                      "training wheels exist only for Python <= 3.11")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def ensure(venv: Path = VENV) -> Path:
    """The venv's python, creating the venv first if it is missing or incomplete."""
    py = venv / "bin" / "python"
    marker = venv / _MARKER
    want = "\n".join(PINS)
    if py.exists() and marker.exists() and marker.read_text() == want:
        return py
    base = find_python311()
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)          # another test process may be building it right now
        if py.exists() and marker.exists() and marker.read_text() == want:
            return py
        shutil.rmtree(venv, ignore_errors=True)
        steps = [[base, "-m", "venv", str(venv)],
                 [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *PINS]]
        for cmd in steps:
            r = subprocess.run(cmd, check=False, env=_env(), capture_output=True, text=True, timeout=1800)
            if r.returncode != 0:
                raise RuntimeError(f"setting up the ORT 1.19.2 venv at {venv} failed: {' '.join(cmd)}\n"
                                   f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
        marker.write_text(want)
    return py


# Keeps torch out of the process and imports onnxruntime.training.api without the package's __init__ (which
# imports torch); binds ``ort``, ``ort_api`` and ``np``. bench/train.py starts its ORT workers with it too.
ORT_WITHOUT_TORCH = '''
import importlib, importlib.abc, importlib.util, json, os, sys, types

class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: ORT runs without torch here)")
        return None

sys.meta_path.insert(0, _NoTorch())
import numpy as np
import onnxruntime as ort
_pkg = os.path.dirname(importlib.util.find_spec("onnxruntime").origin)
_training = types.ModuleType("onnxruntime.training")    # skip the package __init__ (it imports torch)
_training.__path__ = [os.path.join(_pkg, "training")]
sys.modules["onnxruntime.training"] = _training
from onnxruntime.training import api as ort_api
'''

_PRELUDE = ORT_WITHOUT_TORCH + '''
sys.path.append(os.path.join(_pkg, "tools", "ort_format_model"))   # they import ort_flatbuffers_py.fbs.*

def fbs(table):
    return importlib.import_module("ort_flatbuffers_py.fbs." + table)

_io = sys.argv[1]
with open(os.path.join(_io, "args.json")) as _f:
    ARGS = json.load(_f)
ARRAYS = dict(np.load(os.path.join(_io, "arrays.npz")))
OUT = {}
'''

_EPILOGUE = '''
_arrays = {k: v for k, v in OUT.items() if isinstance(v, np.ndarray)}
np.savez(os.path.join(_io, "out.npz"), **_arrays)
with open(os.path.join(_io, "out.json"), "w") as _f:
    json.dump({k: v for k, v in OUT.items() if k not in _arrays}, _f)
'''


def run(snippet: str, args: dict | None = None, arrays: dict[str, np.ndarray] | None = None,
        timeout: float = 600, venv: Path = VENV) -> dict:
    """Run ``snippet`` in the ORT 1.19.2 venv; return its ``OUT`` (arrays as numpy, the rest from JSON)."""
    py = ensure(venv)
    with tempfile.TemporaryDirectory(prefix="ort119-") as io:
        Path(io, "args.json").write_text(json.dumps(args or {}))
        np.savez(Path(io, "arrays.npz"), **(arrays or {}))
        script = Path(io, "snippet.py")
        script.write_text(_PRELUDE + textwrap.dedent(snippet) + _EPILOGUE)
        r = subprocess.run([str(py), str(script), io], check=False, env=_env(), capture_output=True,
                           text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"the ORT 1.19.2 snippet failed (exit {r.returncode}):\n{r.stderr[-6000:]}")
        out = json.loads(Path(io, "out.json").read_text())
        with np.load(Path(io, "out.npz")) as npz:
            out.update({k: npz[k] for k in npz.files})
    return out


if __name__ == "__main__":   # python tests/ort119.py: build or check the venv, print ORT's version
    print(run("OUT['version'] = ort.__version__; OUT['torch'] = 'torch' in sys.modules")["version"])


_RUN_MODELS = '''
so = ort.SessionOptions()
so.intra_op_num_threads = 1
for k, m in enumerate(ARGS["models"]):
    feeds = {n: ARRAYS[f"{k}/{n}"] for n in ARGS["feeds"][k]}
    sess = ort.InferenceSession(ARRAYS[m].tobytes(), so, providers=["CPUExecutionProvider"])
    for j, o in enumerate(sess.run(None, feeds)):
        OUT[f"{k}/{j}"] = o
'''


def run_models(models_and_feeds) -> list[list[np.ndarray]]:
    """Outputs of each (ModelProto, feeds) under onnxruntime-training 1.19.2, one process for all."""
    arrays, names, feeds = {}, [], []
    for k, (m, f) in enumerate(models_and_feeds):
        arrays[f"model{k}"] = np.frombuffer(m.SerializeToString(), np.uint8)
        arrays.update({f"{k}/{n}": v for n, v in f.items()})
        names.append(f"model{k}")
        feeds.append(list(f))
    out = run(_RUN_MODELS, {"models": names, "feeds": feeds}, arrays)
    return [[out[f"{k}/{j}"] for j in range(sum(key.startswith(f"{k}/") for key in out))]
            for k in range(len(models_and_feeds))]
