"""Cold start: a program's first run compiles its kernels in two processes at once.

Numba holds the GIL while it compiles, so threads would not help. Before a program's first run, the kernels it
calls directly (or through a launcher that lists them: ``kernel_calls``), and those of the programs already
bound that have not run yet (the optimizer's, bound before the first training step), that have no code for the
types of their bound arguments yet, are compiled by this process and a short-lived helper process (``HELPER``:
this process's Python and ``sys.path``) together: each takes the next kernel nobody has claimed yet (an
exclusive file create in a folder of claims), so a process that is done early (or the helper, late by its ~0.5 s
start) takes more, and they finish at most one kernel's compile apart whatever the kernels cost. The helper
compiles into the shared Numba disk cache; the run then loads its kernels from there (~3 ms a kernel). Numba's
code, and so every result, is the same as a serial compile's.

All signatures of one kernel go to one process, and every Numba cache save (index and data file) is made under
a lock on the cache folder: two processes saving overloads of one function would otherwise both pick the same
data file name. A helper that fails or is killed costs nothing but time: whatever it had not saved is compiled
here at the first call, as without it (Numba writes each cache file to a temporary name and renames it, so no
half-written entry is ever read). A helper pays only on a CPU nobody else uses: on a busy machine the two
processes share the same CPUs and their starts (~0.5 s each of Python, numpy, Numba) are lost, so by default it
runs only while the 1-minute load average leaves a CPU free. ``EDGETRAIN_COMPILE_WORKERS=1`` switches it off,
``=2`` on; it is always off on a single CPU, on the warm path (nothing compiles there) and under
``NUMBA_DISABLE_JIT``.
"""
from __future__ import annotations

import importlib
import os
import sys
import time

from .. import atomic, config

WORKERS_ENV = "EDGETRAIN_COMPILE_WORKERS"
MIN_KERNELS = 6     # below this the helper's start (~0.5 s: Python, numpy, Numba) costs more than it saves
HELPER_TIMEOUT_S = 900.0
LOCK_NAME = ".edgetrain-save.lock"


def workers() -> int:
    """Processes compiling at once: ``EDGETRAIN_COMPILE_WORKERS`` (1 switches the helper off, 2 on), else 2 when
    this process may run on two CPUs or more and the load average leaves one of them free."""
    explicit = os.environ.get(WORKERS_ENV, "").strip()
    if explicit:
        return max(1, int(explicit))
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0]     # this process counts in it too
    except OSError:
        busy = float(cpus)
    return 2 if cpus >= 2 and busy <= cpus - 1 else 1


def _logger():
    import logging

    return logging.getLogger("edgetrain.compile")


def kernel_calls(calls):
    """``calls`` with each launcher that says which kernels it calls (``fn.kernel_calls``: ``(kernel, args)``
    pairs, e.g. ``kernels.checked``, ``kernels.in_turn``) replaced by those, and theirs by theirs."""
    for fn, args in calls:
        inner = getattr(fn, "kernel_calls", None)
        if inner is None:
            yield fn, args
        else:
            yield from kernel_calls(inner)


_HANDED: set = set()      # (dispatcher, argument types) a compile_ahead of this process has compiled or had compiled


def pending(calls) -> list[tuple[object, tuple]]:
    """``(dispatcher, argument types)`` per Numba dispatcher among ``calls`` (``(fn, args)`` pairs) that has no
    code for its arguments yet and that no earlier ``compile_ahead`` handed out, in call order, each pair once."""
    seen, out = set(), []
    for fn, args in kernel_calls(calls):
        if not (hasattr(fn, "overloads") and hasattr(fn, "typeof_pyval") and hasattr(fn, "py_func")):
            continue      # a launcher (its kernels compile at the first call), a warm or trimmed kernel
        try:
            sig = tuple(fn.typeof_pyval(a) for a in args)
        except Exception:      # noqa: BLE001 - a value Numba cannot type fails at the call, with Numba's error
            continue
        if sig in fn.overloads or (id(fn), sig) in seen or (fn, sig) in _HANDED:
            continue
        seen.add((id(fn), sig))
        out.append((fn, sig))
    return out


def cost(fn, seen=None) -> int:
    """How long ``fn`` takes to compile, roughly: the bytecode of it and of the jitted functions it calls (inlined
    or compiled with it). Over the transformer's 15 library kernels it follows the measured compile times
    (0.2-1.4 s) but for two: SoftmaxCrossEntropy's gradient (its exp is a callee of another module, not counted)
    ranks low, AdamW (long straight-line code, cheap to optimize) high."""
    seen = set() if seen is None else seen
    code = fn.py_func.__code__
    total = len(code.co_code)
    for name in code.co_names:
        callee = fn.py_func.__globals__.get(name)
        if hasattr(callee, "py_func") and id(callee) not in seen:
            seen.add(id(callee))
            total += cost(callee, seen)
    return total


def by_kernel(jobs: list[tuple[object, tuple]]) -> list[tuple[object, list]]:
    """``(dispatcher, [signatures])`` per kernel of ``jobs``, the unit a process claims; the costliest first, so
    what is left for the end, when one process may wait for the other, is the cheap ones."""
    groups: dict[int, tuple[object, list]] = {}
    for fn, sig in jobs:
        groups.setdefault(id(fn), (fn, []))[1].append(sig)
    return sorted(groups.values(), key=lambda g: -cost(g[0]) * len(g[1]))


def claim(folder: str, k: int) -> bool:
    """True for exactly one of the processes that ask for job ``k`` (an exclusive create in ``folder``)."""
    return atomic.claim(os.path.join(folder, str(k)))


def compile_claimed(folder: str, groups, resolve=lambda fn: fn) -> int:
    """Compile each kernel of ``groups`` (``(kernel, [signatures])``) this process claims, in order; the
    signatures compiled."""
    done = 0
    for k, (fn, sigs) in enumerate(groups):
        if claim(folder, k):
            fn = resolve(fn)
            for sig in sigs:
                fn.compile(sig)
            done += len(sigs)
    return done


def _reference(fn):
    """How the helper finds ``fn``: ("source", generated source) or ("module", module name, qualified name)."""
    from . import source_of

    module = fn.py_func.__module__
    source = source_of(module)
    if source is not None:
        return ("source", source)
    return ("module", module, fn.py_func.__qualname__)


def _resolve(ref):
    if ref[0] == "source":
        from . import load       # the helper runs with the warm path off: Numba's dispatcher

        return load(ref[1])
    fn = importlib.import_module(ref[1])
    for part in ref[2].split("."):
        fn = getattr(fn, part)
    return fn


def lock_cache_saves(numba) -> bool:
    """Make Numba's cache saves (read index, pick a data file name, write both) one locked step across
    processes. False (and nothing changed) if this Numba has no ``IndexDataCacheFile.save``."""
    caching = importlib.import_module("numba.core.caching")
    cls = getattr(caching, "IndexDataCacheFile", None)
    save = getattr(cls, "save", None)
    if save is None:
        return False
    if getattr(save, "edgetrain_locked", False):
        return True

    def locked_save(self, key, data):
        with atomic.locked(os.path.join(os.environ["NUMBA_CACHE_DIR"], LOCK_NAME)):
            return save(self, key, data)
    locked_save.edgetrain_locked = True
    cls.save = locked_save
    return True


# The helper's sys.path is this process's (its one argument), set before it imports anything of edgetrain's: it
# imports the same package, and not whatever its working folder holds (``python -m``/``-c`` would put that first)
HELPER = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
          "from edgetrain.codegen.parallel_compile import _helper_main; sys.exit(_helper_main(sys.argv[2:]))")


def helper_command(early: bool = False) -> list[str]:
    import json

    return [sys.executable, "-c", HELPER, json.dumps([os.path.abspath(p) for p in sys.path])] + \
        (["early"] if early else [])


_EARLY: list = []        # a helper started before its jobs were known (start_early), for the next compile_ahead


def _start_helper(early: bool = False):
    import subprocess     # here, not at the top: a warm start imports this module and never compiles

    env = dict(os.environ, EDGETRAIN_NO_AOT="1", **{WORKERS_ENV: "1"})
    return subprocess.Popen(helper_command(early), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env)


def _holds_files(folder, depth: int = 2) -> bool:
    """Whether ``folder`` (missing: no) holds a file within ``depth`` levels (Numba's cache keeps its entries in
    one folder per source folder, made as soon as a kernel is decorated)."""
    try:
        with os.scandir(folder) as entries:
            for e in entries:
                if not e.is_dir(follow_symlinks=False) or depth > 1 and _holds_files(e.path, depth - 1):
                    return True
    except (FileNotFoundError, NotADirectoryError):
        return False
    return False


def first_compiles() -> bool:
    """Whether this looks like the first process to run edgetrain's kernels here: Numba's cache folder and the
    warm kernel sets' folder hold no file, so every kernel it calls compiles."""
    root = config.cache_dir()
    return not _holds_files(os.environ.get("NUMBA_CACHE_DIR") or root / "numba") and not _holds_files(root / "aot")


def start_early() -> None:
    """Start the helper now, before any program is bound, when this is the first process to run kernels here
    (``first_compiles``) and a helper may run: its start (~0.5 s: Python, numpy, Numba) overlaps this process's
    loading and planning, and the first ``compile_ahead`` hands it its jobs (any number, it has started). It
    waits for them on its stdin; if none come it exits when this process closes that (or exits)."""
    if _EARLY or workers() < 2 or config.flag("NUMBA_DISABLE_JIT") or not first_compiles():
        return
    _EARLY.append(_start_helper(early=True))


def compile_ahead(calls) -> dict:
    """Compile the kernels ``calls`` will need, in two processes when it pays (see the module's docstring).
    Returns what happened: ``{"here": n, "helper": n, "helper_failed": reason or None, "seconds": s, "early":
    whether the helper had started early}``."""
    early = _EARLY.pop() if _EARLY else None
    report = {"here": 0, "helper": 0, "helper_failed": None, "seconds": 0.0, "early": early is not None}
    jobs = pending(calls) if early is not None or workers() >= 2 and not config.flag("NUMBA_DISABLE_JIT") else []
    if early is None and len({id(fn) for fn, _ in jobs}) < MIN_KERNELS:
        return report
    import pickle
    import subprocess

    from ..kernels import _jit

    if not jobs or not lock_cache_saves(_jit.load_numba()):
        if early is not None:
            early.stdin.close()      # nothing for it: it exits (reaped by subprocess at a later Popen)
        return report
    import shutil
    import tempfile

    t0 = time.perf_counter()
    groups = by_kernel(jobs)
    folder = tempfile.mkdtemp(prefix="edgetrain-claims-")
    refs = pickle.dumps([(_reference(fn), sigs) for fn, sigs in groups])     # Numba types: loaded after Numba
    payload = pickle.dumps((folder, refs))
    helper = early if early is not None else _start_helper()
    try:
        try:
            helper.stdin.write(payload)
            helper.stdin.close()
        except OSError:
            pass           # it died at once: its exit status says why
        helper.stdin = None      # sent: communicate() below only collects stderr
        report["here"] = compile_claimed(folder, groups)
        try:
            _, err = helper.communicate(timeout=HELPER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            helper.kill()
            _, err = helper.communicate()
            err = f"no result after {HELPER_TIMEOUT_S:.0f} s".encode()
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait()
        shutil.rmtree(folder, ignore_errors=True)
    theirs = len(jobs) - report["here"]
    if helper.returncode == 0:
        report["helper"] = theirs
    else:
        lines = [ln for ln in err.decode(errors="replace").splitlines() if ln.strip()]
        report["helper_failed"] = f"exit {helper.returncode}: {lines[-1] if lines else '(no message)'}"
        _logger().warning("edgetrain: the kernel compile helper process failed (%s); the %d kernel signatures "
                          "it had taken compile here instead", report["helper_failed"], theirs)
    if helper.returncode == 0:
        _HANDED.update(jobs)      # in the cache now: loaded at their first call, not handed out again
    report["seconds"] = time.perf_counter() - t0
    if config.debug():
        print(f"edgetrain: compiled {report['here']} kernels here and {report['helper']} in a helper process "
              f"in {report['seconds']:.2f} s", file=sys.stderr)
    return report


def _first_compile(numba) -> None:
    """What a process's first compiles pay once (Numba's CPU target and its array support: ~0.3-0.5 s), paid on a
    throw-away loop over an array (not cached)."""
    import numpy as np

    def total(a):
        s = a.dtype.type(0)
        for i in range(a.shape[0]):
            s += a[i] * a[i]
        return s
    numba.njit(total)(np.ones(2, np.float32))


def _helper_main(flags=()) -> int:
    """The helper process: Numba loaded first (its jobs may not be known yet: ``start_early``; then, while it
    waits, it pays Numba's one-time set-up too: ``_first_compile``), then compile the kernels of the pickled
    ``(claims folder, [(reference, [signatures]), ...])`` on stdin (from the parent's own ``compile_ahead``)
    that it claims in that folder, into the disk cache; nothing (stdin closed empty): exit."""
    import pickle

    from ..kernels import _jit     # configures Numba before the pickled Numba types import it

    numba = _jit.load_numba()
    if not lock_cache_saves(numba):
        print("edgetrain: this Numba has no IndexDataCacheFile.save to lock", file=sys.stderr)
        return 3
    if "early" in flags:
        _first_compile(numba)
    payload = sys.stdin.buffer.read()
    if not payload:
        return 0
    folder, jobs = pickle.loads(payload)    # noqa: S301 -- written by the parent edgetrain process
    compile_claimed(folder, pickle.loads(jobs), _resolve)     # noqa: S301
    return 0

