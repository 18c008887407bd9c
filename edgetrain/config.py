"""Switches read from the environment, and where edgetrain keeps its kernel cache."""
import os
from pathlib import Path


def flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def fusion_enabled() -> bool:
    return not flag("EDGETRAIN_NO_FUSION")


def planner_enabled() -> bool:
    return not flag("EDGETRAIN_NO_PLANNER")


def debug() -> bool:
    return flag("EDGETRAIN_DEBUG")


def cache_dir() -> Path:
    """``EDGETRAIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/edgetrain``, else ``~/.cache/edgetrain``."""
    explicit = os.environ.get("EDGETRAIN_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgetrain"


def num_threads() -> int:
    """Threads for Numba and BLAS: ``EDGETRAIN_NUM_THREADS``, default 1 (threads only hurt on contended cores)."""
    return max(1, int(os.environ.get("EDGETRAIN_NUM_THREADS", "1")))
