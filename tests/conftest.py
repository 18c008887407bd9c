import os
from pathlib import Path

import numpy as np
import pytest

# ../shared beside the repository holds the bench models and ORT's artifacts (CI clones it there too).
SHARED = Path(os.environ.get("EDGETRAIN_SHARED", Path(__file__).resolve().parents[2] / "shared"))
BENCH_MODELS = ["cnn", "digits", "mlp", "mobilenet", "transformer"]

# No test process (nor any process a test starts) builds the warm kernel set in the background on its way out
# (minimal_build/autowarm.py): tests/test_autowarm.py switches it back on where it is the subject.
os.environ["EDGETRAIN_NO_AUTOWARM"] = "1"
# Nor does a program's first run start a compile helper (edgetrain/codegen/parallel_compile.py: it would start
# whenever the load average leaves a CPU free, so which tests pay a helper's start would depend on the machine's
# load): tests/test_parallel_compile.py sets EDGETRAIN_COMPILE_WORKERS itself where it is the subject.
os.environ["EDGETRAIN_COMPILE_WORKERS"] = "1"
# Nor does any test process load a warm kernel set from the user's cache folder (a set built there by an earlier
# bench or scratch run would serve the suite instead of the JIT it tests): tests/test_warm.py and
# tests/test_autowarm.py drop this in the processes where the warm set is the subject.
os.environ["EDGETRAIN_NO_AOT"] = "1"


@pytest.fixture(scope="session")
def shared() -> Path:
    if not (SHARED / "models").is_dir():
        pytest.fail(f"the shared folder with bench models is missing at {SHARED} (set EDGETRAIN_SHARED)")
    return SHARED


def random_feed(value, rng: np.random.Generator, dims: dict | None = None) -> np.ndarray:
    """A random array for a NodeArg-like (name, shape, type string) or an ir.Value."""
    shape = [d if isinstance(d, int) else (dims or {}).get(d, 8) for d in value.shape]
    if "int64" in value.type:
        high = 100 if value.name == "input" else 4   # transformer tokens < 100; labels < 4 (its head has 4 classes)
        return rng.integers(0, high, shape).astype(np.int64)
    return rng.standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="session")
def ort():
    """ONNX Runtime 1.19.2 in its own venv (tests/ort119.py); skipped, visibly, only without python3.11."""
    import ort119
    try:
        ort119.ensure()
    except ort119.Unavailable as e:
        pytest.skip(f"ORT 1.19.2 interop: {e}")
    return ort119


def _shared_files() -> set[str]:
    return {str(p.relative_to(SHARED)) for p in SHARED.rglob("*") if p.is_file()} if SHARED.is_dir() else set()


def pytest_sessionstart(session):
    session.config.shared_files_at_start = _shared_files()


def pytest_sessionfinish(session, exitstatus):
    """The suite never writes into ../shared: a stray file there (ORT saving a model beside its source, say)
    makes artifact folders read later refuse it, so the order of tests would decide what passes."""
    new = sorted(_shared_files() - getattr(session.config, "shared_files_at_start", set()))
    if new:
        print(f"\nthe tests wrote into {SHARED}: {', '.join(new[:10])}", flush=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
