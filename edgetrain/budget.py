"""The memory budget: how many bytes one allocation that a file can size may take, checked before it happens.

A model or checkpoint decides the size of constant folding results, of the state store and of the arena; a
hostile one can ask for gigabytes in a few hundred bytes. Every such allocation is checked against the
budget first and refused with a ``MemoryBudgetError`` that names what asked and how much.

The budget is the ``max_memory`` argument where one is given (InferenceSession, Module, ``edgetrain profile
--max-memory``); else ``EDGETRAIN_MAX_MEMORY`` (a size such as ``512MB``, ``1.5GiB`` or a number of bytes, or
``unlimited``); else half the memory available when it is read (``MemAvailable`` of ``/proc/meminfo``, capped
by the cgroup's limit; ``os.sysconf`` elsewhere).
"""
from __future__ import annotations

import math
import os
import re
from numbers import Integral

from .errors import MemoryBudgetError, ShapeError

ENV = "EDGETRAIN_MAX_MEMORY"
AVAILABLE_FRACTION = 0.5            # of the memory available: room for the rest of the process and the system
FALLBACK = 2 << 30                  # when no figure can be read at all
UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
         "kib": 2**10, "mib": 2**20, "gib": 2**30}
INT64_MAX = 2**63 - 1


def parse_size(text: str) -> int:
    """Bytes from '64MB', '1.5GB', '512KiB' or a plain count (kB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in UNITS:
        raise ValueError(f"'{text}' is not a size: write e.g. 64MB, 1.5GB, 512KiB or a number of bytes")
    return int(float(m.group(1)) * UNITS[unit])


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> int | None:
    """Bytes the cgroup (v2) still allows, when it sets a limit (containers, systemd slices)."""
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(0, int(limit) - used)


def _sysconf_available() -> int | None:
    for pages in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
        try:
            n = os.sysconf(pages) * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            continue
        if n > 0:
            return n
    return None


def available_memory() -> int:
    """Bytes of memory available to this process now (best figure the system gives; FALLBACK if none)."""
    figures = [f for f in (_meminfo_available() or _sysconf_available(), _cgroup_room()) if f is not None]
    return min(figures) if figures else FALLBACK


def default() -> int | None:
    """The budget when no ``max_memory`` is given: ``EDGETRAIN_MAX_MEMORY``, else half the available memory.

    None (no bound) only when ``EDGETRAIN_MAX_MEMORY=unlimited``."""
    text = os.environ.get(ENV, "").strip()
    if text.lower() == "unlimited":
        return None
    if text:
        try:
            return parse_size(text)
        except ValueError as e:
            raise MemoryBudgetError(f"{ENV}: {e}, or 'unlimited'") from None
    return int(available_memory() * AVAILABLE_FRACTION)


def resolve(max_memory: int | None) -> int | None:
    """``max_memory`` if given (bytes, >= 0), else ``default()``."""
    if max_memory is None:
        return default()
    if isinstance(max_memory, bool) or not isinstance(max_memory, Integral) or max_memory < 0:
        raise MemoryBudgetError(f"max_memory must be a number of bytes >= 0, got {max_memory!r}")
    return int(max_memory)


def format_bytes(n: float) -> str:
    """``2.51 MB``, or ``640 B`` below 10 kB: how plans, budgets and the timeline print sizes."""
    return f"{n / 1e6:.2f} MB" if n >= 10_000 else f"{int(n)} B"


def check(nbytes: int, max_memory: int | None, what: str) -> None:
    """Refuse an allocation of ``nbytes`` for ``what`` (e.g. "the state store of the training model") over
    the budget, before it happens."""
    if max_memory is not None and nbytes > max_memory:
        raise MemoryBudgetError(f"{what} needs {nbytes} bytes ({format_bytes(nbytes)}), over the memory budget of "
                                f"{max_memory} bytes ({format_bytes(max_memory)}); raise max_memory (or {ENV}) if this "
                                "is intended")


def checked_shape(shape, itemsize: int, what: str) -> int:
    """Bytes of a tensor of ``shape``: every dim an int >= 0 and the size within int64, else ShapeError naming
    ``what``. Exact (Python ints): a product that wraps around in int64 cannot slip through."""
    plain = all(type(d) is int and d >= 0 for d in shape)      # the common case, without the ABC checks
    if not plain and not all(isinstance(d, Integral) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ShapeError(f"{what} has shape {tuple(shape)}: every dim must be an integer >= 0")
    nbytes = math.prod(int(d) for d in shape) * itemsize
    if nbytes > INT64_MAX:
        raise ShapeError(f"{what} has shape {tuple(shape)}: {nbytes} bytes, beyond any memory")
    return nbytes
