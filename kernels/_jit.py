"""The one place that configures Numba: cache directory, threads, fastmath, and the jit decorator.

``NUMBA_DISABLE_JIT=1`` runs every kernel as plain Python (debugging, coverage). Kernels compile lazily
on first call and are cached on disk (``cache=True``), so a warm process compiles nothing.

The warm path (``_warm.py``): when ``edgetrain warm`` compiled a kernel set ahead of time for this installation
and machine, ``jit`` returns a ``WarmKernel`` that calls the set's exports, and Numba (~120 MB, ~0.5 s to
import) is not imported at all. A kernel called with argument types the set lacks, or a fused loop outside it,
imports Numba then and compiles as in a cold process. ``EDGETRAIN_NO_AOT=1`` switches the warm path off.
"""
from __future__ import annotations

import importlib
import os
from contextlib import contextmanager

from edgetrain import config

from . import _spin, _warm
from ._aot import AotKernel, fused_id

# Numba loads pickled code from its cache: the folder is created 0700 and checked like the generated kernels'
if "NUMBA_CACHE_DIR" not in os.environ:
    os.environ["NUMBA_CACHE_DIR"] = str(config.cache_folder("numba"))
else:
    config.secure_folder(os.environ["NUMBA_CACHE_DIR"])
os.environ.setdefault("NUMBA_NUM_THREADS", str(config.num_threads()))

# Reductions may reorder sums and fuse multiply-adds; no fastmath flag that changes NaN/inf semantics.
FASTMATH = frozenset({"contract", "reassoc", "nsz"})

_DISPATCHERS: list = []
_GENERATED: dict = {}        # fused-loop kernel id -> WarmKernel
_ON_LOAD: list = []          # callbacks(numba) that register Numba extensions (softmax's fast_exp)
_LISTENERS: list = []        # open compile_listener contexts: (on_start, on_end, registered listener or None)
_THREADS: list[int] = []     # the last set_num_threads while Numba was not loaded
_WARM = _warm.find()
numba = None                 # the numba module, once loaded


def load_numba():
    """Import and configure Numba (once): in a cold process when the kernels are imported, in a warm one at
    the first kernel call the warm set does not cover."""
    global numba
    if numba is None:
        nb = importlib.import_module("numba")
        importlib.import_module("numba.extending")      # what the _ON_LOAD callbacks use
        nb.config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]
        numba = nb
        for fn in _ON_LOAD:
            fn(nb)
        for entry in _LISTENERS:
            entry[2] = _register_listener(*entry[:2])
        if _THREADS:
            set_num_threads(_THREADS[-1])
    return numba


def when_numba_loads(fn):
    """Call ``fn(numba)`` when Numba is loaded (now, if it is): kernel modules register their Numba extensions
    (``@intrinsic``, ``@overload``) this way, so importing them does not import Numba."""
    _ON_LOAD.append(fn)
    if numba is not None:
        fn(numba)
    return fn


def _njit(f, fastmath: bool, inline: str):
    d = load_numba().njit(cache=True, nogil=True, fastmath=set(FASTMATH) if fastmath else False, inline=inline)(f)
    return register(d)


class WarmKernel(AotKernel):
    """A kernel of the warm set: its exports where they take the arguments, else Numba's dispatcher for it
    (made on first need; it also stands for this kernel inside other jitted functions that call it)."""

    def __init__(self, kernel_id: str, py_func=None, make_dispatcher=None):
        super().__init__(kernel_id, _WARM.kernels.get(kernel_id, []), lambda: _WARM.module, WarmKernel._jit,
                         py_func)
        self._make_dispatcher = make_dispatcher
        self._dispatcher = None

    @property
    def dispatcher(self):
        if self._dispatcher is None:
            self._dispatcher = self._make_dispatcher()
        return self._dispatcher

    def _jit(self, key: tuple):
        _warm.logger().info("edgetrain: %s: not in the warm kernel set, compiling with Numba",
                            self.describe(key))
        return self.dispatcher


def _typeof_warm(numba):
    """Jitted code that calls a warm kernel (compiled on the JIT fallback) calls its Numba dispatcher."""
    from numba.core.typing.typeof import typeof_impl

    typeof_impl.register(WarmKernel)(lambda val, c: typeof_impl(val.dispatcher, c))


def jit(fn=None, *, fastmath: bool = False, inline: str = "never"):
    """``numba.njit(cache=True, nogil=True)`` and registration for ``compile_stats``; on the warm path, a
    ``WarmKernel`` for ``module.qualname`` that makes that dispatcher only when a call needs it."""
    def wrap(f):
        if _WARM is None:
            return _njit(f, fastmath, inline)
        return WarmKernel(f"{f.__module__}.{f.__qualname__}", f, lambda: _njit(f, fastmath, inline))
    return wrap(fn) if fn is not None else wrap


def warm_generated(source: str, load):
    """A fused loop of the warm set, or None (then ``load(source)`` gives its dispatcher, as cold); ``load`` is
    also what a call with types the set lacks falls back to."""
    kernel_id = fused_id(source)
    if _WARM is None or kernel_id not in _WARM.kernels:
        return None
    if kernel_id not in _GENERATED:
        _GENERATED[kernel_id] = WarmKernel(kernel_id, None, lambda: load(source))
    return _GENERATED[kernel_id]


def warm_set():
    """The warm kernel set this process uses (``_warm.KernelSet``), or None."""
    return _WARM


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
    if numba is None:
        _THREADS[:] = [n]        # the warm set's kernels are serial; applied if Numba loads
        return
    numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))


def _register_listener(on_start, on_end):
    from numba.core import event

    class Listener(event.Listener):
        def on_start(self, e):
            on_start()

        def on_end(self, e):
            on_end()

    listener = Listener()
    event.register("numba:compile", listener)
    return listener


@contextmanager
def compile_listener(on_start, on_end):
    """Call ``on_start()`` / ``on_end()`` around every kernel Numba compiles (loads from the disk cache are not
    compiles) while the context is open; on the warm path, from when Numba loads, if it does."""
    entry = [on_start, on_end, _register_listener(on_start, on_end) if numba is not None else None]
    _LISTENERS.append(entry)
    try:
        yield
    finally:
        _LISTENERS.remove(entry)
        if entry[2] is not None:
            from numba.core import event

            event.unregister("numba:compile", entry[2])


def _plain_slice_errors(numba):
    """Array slice assignment (``out[a:b] = x``) compiles, per rank, Numba's CPU error path that formats both
    shapes into its ValueError: str/repr/join/concat of ints pull ~25 unicode helpers into every cold process's
    first compiles (measured: a one-line slice-assigning kernel compiles in 2.7 s with it, 0.6 s without, and
    1.8 s vs 0.2 s for the next rank). Planned shapes never mismatch there, so the CPU target takes the generic
    target's message ("cannot assign slice from input of different size"), whose body is a constant raise.
    Left as Numba has it if its internals differ from 0.60-0.68's."""
    arrayobj = importlib.import_module("numba.np.arrayobj")
    registry = importlib.import_module("numba.core.typing.templates").builtin_registry
    plain = getattr(arrayobj, "ol_raise_with_shape_context_generic", None)
    stub = getattr(arrayobj, "raise_with_shape_context", None)
    if plain is None or stub is None:
        return
    for fn, fn_type in registry.globals:
        if fn is stub:
            for template in getattr(fn_type, "templates", ()):
                if getattr(template, "metadata", {}).get("target") == "CPU" and hasattr(template, "_overload_func"):
                    template._overload_func = staticmethod(plain)


def _unloadable_cache_entries_recompile(numba):
    """A disk cache entry that names a module this process cannot import (written by a process that imported a
    kernel file under another name, e.g. ``kernels.rnn`` from the repository's root) is compiled again, with a
    warning, and the new entry replaces it; Numba would raise ModuleNotFoundError at the call instead. Left as
    Numba has it if its ``Cache.load_overload`` is not there."""
    caching = importlib.import_module("numba.core.caching")
    load = getattr(caching.Cache, "load_overload", None)
    if load is None or getattr(load, "edgetrain_guarded", False):
        return

    def guarded(self, sig, target_context):
        try:
            return load(self, sig, target_context)
        except ImportError as e:
            import logging

            f = getattr(self, "_py_func", None)
            logging.getLogger("edgetrain.compile").warning(
                "edgetrain: Numba's cache entry of %s does not load (%s); compiling it again",
                f"{f.__module__}.{f.__qualname__}" if f is not None else "a kernel", e)
            return None
    guarded.edgetrain_guarded = True
    caching.Cache.load_overload = guarded


when_numba_loads(_typeof_warm)
when_numba_loads(_plain_slice_errors)
when_numba_loads(_unloadable_cache_entries_recompile)
when_numba_loads(_spin.register)
if _WARM is None:
    load_numba()
