"""Switches read from the environment, and where edgetrain keeps its kernel cache."""
import os
import zlib
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


_SEED: list[int | None] = [None]


def set_seed(seed: int | None) -> None:
    """Seed every random op planned from now on (Dropout without its own seed attribute): runs repeat exactly.
    None (the default) draws fresh entropy per op, as onnxruntime does."""
    _SEED[0] = None if seed is None else int(seed)


def op_seed(node_name: str) -> list[int] | None:
    """The seed of a random op's generator: the run's seed and the node's name, so ops draw distinct streams."""
    if _SEED[0] is None:
        return None
    return [_SEED[0], zlib.crc32(node_name.encode())]
