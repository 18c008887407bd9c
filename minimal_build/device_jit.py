"""The trimmed runtime's ``edgetrain.kernels._jit``: kernels compiled ahead of time, looked up, never compiled.

``edgetrain reduce`` copies this file over the full package's ``kernels/_jit.py``. ``jit`` keeps the kernel
modules' source unchanged: instead of a Numba dispatcher it returns an ``AotKernel`` that calls the export
of ``_aot_kernels`` compiled for the arguments' types. Argument types are keyed as Numba types them
(dtype, ndim, layout, read-only for arrays; int64 / float64 / bool for Python scalars); the exports do not
check types themselves, so a call nobody compiled raises here instead of reaching native code.
"""
from __future__ import annotations

import hashlib
import importlib
import operator
from contextlib import contextmanager

import numpy as np

FASTMATH = frozenset({"contract", "reassoc", "nsz"})   # as in the full package (kernel modules import it)

_SCALAR_KEYS = {bool: "bool", int: "int64", float: "float64", type(None): "none", np.bool_: "bool"}
_SCALAR_KEYS.update({t: np.dtype(t).name for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                                   np.uint32, np.uint64, np.float32, np.float64)})
_WIDENS = {("int64", "int32"), ("int64", "int16"), ("int64", "int8"), ("int64", "uint8"), ("int64", "uint16"),
           ("int64", "uint32"), ("float64", "float32")}   # (compiled, given): conversions Numba makes safely

_KERNELS: list = []                 # every AotKernel made (compile_stats counts them)
_GENERATED: dict = {}               # fused-loop kernel id -> AotKernel
_MODULE = None                      # the extension module, imported on the first kernel call


def _build():
    """``edgetrain.trimmed`` (the build's manifest and errors), imported on use: only a trimmed package has it,
    and the type keys below are tested against Numba's in the full package."""
    from edgetrain import trimmed
    return trimmed


def value_key(v) -> str:
    """``float32[2C]``, ``int64[1A]ro``, ``int64``, ``bool``, ``(int64,int64)``: what Numba would type ``v`` as."""
    return key_text(_key(v))


def _key(v):
    """The fast form of ``value_key`` (this runs for every argument of every kernel call): arrays as
    (dtype, ndim, layout, writeable) (``dtype.name`` alone would cost microseconds), scalars as their name."""
    if type(v) is np.ndarray:
        f = v.flags
        return (v.dtype, v.ndim, "C" if f.c_contiguous else ("F" if f.f_contiguous else "A"), f.writeable)
    key = _SCALAR_KEYS.get(type(v))
    if key is not None:
        return key
    if isinstance(v, tuple):
        return "(" + ",".join(value_key(x) for x in v) + ")"
    return f"<{type(v).__name__}>"


def parse_key(text: str):
    """A manifest's argument key (``float32[2C]``) in the form ``_key`` computes."""
    if "[" not in text or text.startswith("("):
        return text
    dtype, rest = text.split("[", 1)
    dims, flags = rest.split("]", 1)
    return (np.dtype(dtype), int(dims[:-1]), dims[-1], flags != "ro")


def key_text(key) -> str:
    if isinstance(key, tuple):
        dtype, ndim, layout, writeable = key
        return f"{dtype.name}[{ndim}{layout}]" + ("" if writeable else "ro")
    return key


def _accepts(compiled, given) -> bool:
    """Whether an export compiled for ``compiled`` takes a value keyed ``given`` (Numba's safe conversions)."""
    if compiled == given or (compiled, given) in _WIDENS:
        return True
    if not (isinstance(compiled, tuple) and isinstance(given, tuple)):
        return False
    c_dtype, c_ndim, c_layout, c_writeable = compiled
    g_dtype, g_ndim, g_layout, g_writeable = given
    return (c_dtype == g_dtype and c_ndim == g_ndim and c_layout in ("A", g_layout)
            and (g_writeable or not c_writeable))


class AotKernel:
    """A kernel's ahead-of-time exports, chosen by the argument types of each call."""

    def __init__(self, kernel_id: str, py_func=None):
        self.kernel_id = kernel_id
        self.py_func = py_func
        self._exports = [(name, tuple(parse_key(k) for k in keys))
                         for name, keys in _build().manifest()["kernels"].get(kernel_id, [])]
        self._chosen: dict[tuple, object] = {}
        self._last: tuple = ((), None)   # the arguments of the last call (kept alive) and the export they took

    def __call__(self, *args):
        last_args, fn = self._last
        # the same objects as last time (a program calls with the same arena views every step): same types
        if len(args) != len(last_args) or not all(map(operator.is_, args, last_args)):
            key = tuple([_key(a) for a in args])
            fn = self._chosen.get(key)
            if fn is None:
                fn = self._chosen[key] = self._choose(key)
            self._last = (args, fn)
        return fn(*args)

    def _choose(self, key: tuple):
        for exact in (True, False):
            for name, keys in self._exports:
                if len(keys) == len(key) and all(c == g if exact else _accepts(c, g) for c, g in zip(keys, key)):
                    return getattr(_module(), name)
        built = "; ".join("(" + ", ".join(map(key_text, keys)) + ")" for _, keys in self._exports)
        raise _build().NotInBuildError(
            f"kernel {self.kernel_id} is not compiled in this trimmed edgetrain for arguments "
            f"({', '.join(map(key_text, key))}); it has {built or 'no signature'}. " + _build().rebuild_hint())

    def __repr__(self) -> str:
        return f"AotKernel({self.kernel_id!r}, {len(self._exports)} signatures)"


def _module():
    global _MODULE
    if _MODULE is None:
        _MODULE = importlib.import_module(f"edgetrain.kernels.{_build().manifest()['module']}")
    return _MODULE


def jit(fn=None, *, fastmath: bool = False, inline: str = "never"):
    """Stands where ``numba.njit`` stood: the kernel ``module.qualname`` from the ahead-of-time module."""
    def wrap(f):
        return register(AotKernel(f"{f.__module__}.{f.__qualname__}", f))
    return wrap(fn) if fn is not None else wrap


def register(kernel):
    _KERNELS.append(kernel)
    return kernel


def load_generated(source: str) -> AotKernel:
    """Stands where ``codegen.load`` stood: the fused loop compiled for ``source`` when the build ran it."""
    kernel_id = "fused:" + hashlib.sha256(source.encode()).hexdigest()[:24]
    loaded = _GENERATED.get(kernel_id)
    if loaded is None:
        if kernel_id not in _build().manifest()["kernels"]:
            body = source[source.index("def kernel"):].strip()
            raise _build().NotInBuildError(
                "the plan needs a fused element-wise loop that this trimmed edgetrain was not built with (a model, "
                f"op mix or batch size the build did not run):\n{body}\n" + _build().rebuild_hint())
        loaded = _GENERATED[kernel_id] = register(AotKernel(kernel_id))
    return loaded


def compile_stats() -> dict[str, int]:
    """Nothing compiles in a trimmed runtime: every kernel was compiled when it was built."""
    return {"hits": 0, "misses": 0, "kernels": len(_KERNELS)}


def set_num_threads(n: int):
    """The ahead-of-time kernels are serial; BLAS threads are set by ``runtime.threads``."""


@contextmanager
def compile_listener(on_start, on_end):
    """Nothing compiles on the device: every kernel was compiled ahead of time."""
    yield
