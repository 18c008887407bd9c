"""The trimmed runtime's ``edgetrain.kernels._jit``: kernels compiled ahead of time, looked up, never compiled.

``edgetrain reduce`` copies this file over the full package's ``kernels/_jit.py``. ``jit`` keeps the kernel
modules' source unchanged: instead of a Numba dispatcher it returns an ``AotKernel`` (``kernels/_aot.py``) that
calls the export of ``_aot_kernels`` compiled for the arguments' types; a call nobody compiled raises
``NotInBuildError`` instead of reaching native code.
"""
from __future__ import annotations

import importlib
from contextlib import contextmanager

from edgetrain.kernels._aot import AotKernel, fused_id, value_key  # noqa: F401  (value_key: the build tests compare)

FASTMATH = frozenset({"contract", "reassoc", "nsz"})   # as in the full package (kernel modules import it)

_KERNELS: list = []                 # every AotKernel made (compile_stats counts them)
_GENERATED: dict = {}               # fused-loop kernel id -> AotKernel
_MODULE = None                      # the extension module, imported on the first kernel call


def _build():
    """``edgetrain.trimmed`` (the build's manifest and errors), imported on use: only a trimmed package has it."""
    from edgetrain import trimmed
    return trimmed


def _not_in_build(kernel: AotKernel, key: tuple):
    raise _build().NotInBuildError(f"{kernel.describe(key)}: it is not compiled in this trimmed edgetrain for "
                                   "these arguments. " + _build().rebuild_hint())


def _kernel(kernel_id: str, py_func=None) -> AotKernel:
    return AotKernel(kernel_id, _build().manifest()["kernels"].get(kernel_id, []), _module, _not_in_build, py_func)


def _module():
    global _MODULE
    if _MODULE is None:
        _MODULE = importlib.import_module(f"edgetrain.kernels.{_build().manifest()['module']}")
    return _MODULE


def jit(fn=None, *, fastmath: bool = False, inline: str = "never"):
    """Stands where ``numba.njit`` stood: the kernel ``module.qualname`` from the ahead-of-time module."""
    def wrap(f):
        return register(_kernel(f"{f.__module__}.{f.__qualname__}", f))
    return wrap(fn) if fn is not None else wrap


def register(kernel):
    _KERNELS.append(kernel)
    return kernel


def load_generated(source: str) -> AotKernel:
    """Stands where ``codegen.load`` stood: the fused loop compiled for ``source`` when the build ran it."""
    kernel_id = fused_id(source)
    loaded = _GENERATED.get(kernel_id)
    if loaded is None:
        if kernel_id not in _build().manifest()["kernels"]:
            body = source[source.index("def kernel"):].strip()
            raise _build().NotInBuildError(
                "the plan needs a fused element-wise loop that this trimmed edgetrain was not built with (a model, "
                f"op mix or batch size the build did not run):\n{body}\n" + _build().rebuild_hint())
        loaded = _GENERATED[kernel_id] = register(_kernel(kernel_id))
    return loaded


def when_numba_loads(fn):
    """Nothing loads Numba here: the kernels' Numba extensions were compiled into them."""
    return fn


def compile_stats() -> dict[str, int]:
    """Nothing compiles in a trimmed runtime: every kernel was compiled when it was built."""
    return {"hits": 0, "misses": 0, "kernels": len(_KERNELS)}


def set_num_threads(n: int):
    """The ahead-of-time kernels are serial; BLAS threads are set by ``blas.limit_blas_threads``."""


@contextmanager
def compile_listener(on_start, on_end):
    """Nothing compiles on the device: every kernel was compiled ahead of time."""
    yield
