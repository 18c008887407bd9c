"""The one place that configures Numba: cache directory, threads, fastmath, and the jit decorator.

``NUMBA_DISABLE_JIT=1`` runs every kernel as plain Python (debugging, coverage). Kernels compile lazily
on first call and are cached on disk (``cache=True``), so a warm process compiles nothing.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

from edgetrain import config

# Numba loads pickled code from its cache: the folder is created 0700 and checked like the generated kernels'
if "NUMBA_CACHE_DIR" not in os.environ:
    os.environ["NUMBA_CACHE_DIR"] = str(config.cache_folder("numba"))
else:
    config.secure_folder(os.environ["NUMBA_CACHE_DIR"])
os.environ.setdefault("NUMBA_NUM_THREADS", str(config.num_threads()))

import numba  # noqa: E402

numba.config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]

# Reductions may reorder sums and fuse multiply-adds; no fastmath flag that changes NaN/inf semantics.
FASTMATH = frozenset({"contract", "reassoc", "nsz"})

_DISPATCHERS: list = []


def jit(fn=None, *, fastmath: bool = False, inline: str = "never"):
    """``numba.njit(cache=True, nogil=True)`` and registration for ``compile_stats``."""
    def wrap(f):
        d = numba.njit(cache=True, nogil=True, fastmath=set(FASTMATH) if fastmath else False, inline=inline)(f)
        register(d)
        return d
    return wrap(fn) if fn is not None else wrap


def register(dispatcher):
    if hasattr(dispatcher, "stats"):
        _DISPATCHERS.append(dispatcher)
    return dispatcher


def dispatchers() -> list:
    """Every jitted function edgetrain has registered (the minimal build records what ran)."""
    return list(_DISPATCHERS)


def compile_stats() -> dict[str, int]:
    """Signatures compiled in this process (``misses``) and loaded from the disk cache (``hits``)."""
    hits = misses = 0
    for d in _DISPATCHERS:
        hits += sum(d.stats.cache_hits.values())
        misses += sum(d.stats.cache_misses.values())
    return {"hits": hits, "misses": misses, "kernels": len(_DISPATCHERS)}


def set_num_threads(n: int):
    numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))


@contextmanager
def compile_listener(on_start, on_end):
    """Call ``on_start()`` / ``on_end()`` around every kernel Numba compiles (loads from the disk cache are not
    compiles) while the context is open."""
    from numba.core import event

    class Listener(event.Listener):
        def on_start(self, e):
            on_start()

        def on_end(self, e):
            on_end()

    listener = Listener()
    event.register("numba:compile", listener)
    try:
        yield
    finally:
        event.unregister("numba:compile", listener)
