"""Run training artifacts under the JIT and record every kernel signature they use (the trimmed build's input).

Each artifact folder (training, eval and optimizer model plus checkpoint, in ONNX or compact form) runs its
training, optimizer and eval steps once per batch size asked for (``exercise.py``). Kernels are shape-generic,
so one run per batch size sees every signature; several sizes cover the fused loops whose collapsed rank
differs when a dimension is 1.

What is recorded: for every jitted function that ran (hand-written kernels and generated fused loops), its
Python function, its Numba options and the concrete signatures it was compiled for; and the (domain, op_type)
of every node of every model. Run this in a fresh process: signatures compiled earlier in the same process
would be recorded too.
"""
from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..kernels._aot import fused_id
from .exercise import exercise, has_symbolic_dims


@dataclass
class KernelUse:
    """One jitted function and the signatures a build must compile for it."""
    kernel_id: str             # "edgetrain.kernels.<family>.<name>", or "fused:<hash of the generated source>"
    py_func: object
    options: dict              # Numba target options (fastmath, error_model, ...), as the JIT compiled it
    signatures: list = field(default_factory=list)   # numba Signature objects (argument and return types)
    source: str | None = None  # generated source, for fused loops


@dataclass
class Recording:
    kernels: list[KernelUse]
    ops: set[tuple[str, str]]            # (domain, op_type) of every node in every model
    batch_sizes: dict[str, list[int]]    # artifact folder -> batch sizes it ran with
    feeds: dict[str, dict] = field(default_factory=dict)   # artifact folder -> the shape sets it ran with instead


def record(folders: list[Path], batch_sizes: list[int], threads=(None,), feeds=None) -> Recording:
    """Run every folder (at every batch size if its inputs have a symbolic dim, else once; or with its shape
    sets in ``feeds``, ``exercise.check_feeds``'s form keyed by folder) and collect.

    ``threads``: the ``EDGETRAIN_NUM_THREADS`` values to run each folder at (None: as this process has it).
    Above their size thresholds, ops split over threads call kernels with other signatures (per block, with
    scratch per slot) than a 1-thread run does; 1 and 2 cover both for any count."""
    feeds = feeds or {}
    ops: set[tuple[str, str]] = set()
    ran: dict[str, list[int]] = {}
    for folder in folders:
        shapes = feeds.get(str(folder))
        sizes = [] if shapes is not None or not has_symbolic_dims(folder) else list(batch_sizes)  # []: one run
        for n in threads:
            with _threads(n):
                if shapes is not None:
                    ops |= exercise(folder, feeds=shapes)
                    continue
                for batch in sizes or [1]:
                    ops |= exercise(folder, batch)
        ran[str(folder)] = sizes
    return Recording(collect_kernels(), ops, ran, {str(f): feeds[str(f)] for f in folders if str(f) in feeds})


@contextlib.contextmanager
def _threads(n: int | None):
    """``EDGETRAIN_NUM_THREADS`` set to ``n`` while planning and running (read at each plan and split)."""
    saved = os.environ.get("EDGETRAIN_NUM_THREADS")
    if n is not None:
        os.environ["EDGETRAIN_NUM_THREADS"] = str(n)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("EDGETRAIN_NUM_THREADS", None)
        else:
            os.environ["EDGETRAIN_NUM_THREADS"] = saved


def collect_kernels() -> list[KernelUse]:
    """Every jitted function compiled (or loaded from the cache) in this process, with its signatures."""
    from ..kernels import _jit

    uses: dict[str, KernelUse] = {}
    for d in _jit.dispatchers():
        if not d.overloads or d.targetoptions.get("inline") == "always":
            continue   # never ran, or inlined into its callers (never called from Python)
        f = d.py_func
        if f.__module__.startswith("edgetrain_gen_fused_"):
            source = Path(sys.modules[f.__module__].__file__).read_text()
            kid = fused_id(source)
        else:
            source, kid = None, f"{f.__module__}.{f.__qualname__}"
        use = uses.setdefault(kid, KernelUse(kid, f, dict(d.targetoptions), source=source))
        for cres in d.overloads.values():
            if cres.signature not in use.signatures:
                use.signatures.append(cres.signature)
    return sorted(uses.values(), key=lambda u: u.kernel_id)
