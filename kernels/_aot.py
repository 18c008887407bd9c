"""Calling kernels compiled ahead of time (``numba.pycc`` exports), without Numba: the dispatcher shared by the
trimmed runtime (``minimal_build/device_jit.py``) and the full package's warm path (``_warm.py``).

An ``AotKernel`` holds a kernel's exports, each with the argument types it was compiled for, and calls the one
that takes the arguments of a call. Argument types are keyed as Numba types them (dtype, ndim, layout,
read-only for arrays; int64 / float64 / bool for Python scalars); the exports do not check types themselves,
so a call no export takes goes to ``missing`` (an error, or the JIT) instead of reaching native code.
"""
from __future__ import annotations

import hashlib
import operator
import re

import numpy as np

FUSED_PREFIX = "fused:"
DIGEST_EXPORT = "edgetrain_manifest_digest"     # the warm path's module: the digest of its own manifest

_SCALAR_KEYS = {bool: "bool", int: "int64", float: "float64", type(None): "none", np.bool_: "bool"}
_SCALAR_KEYS.update({t: np.dtype(t).name for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                                   np.uint32, np.uint64, np.float32, np.float64)})
_WIDENS = {("int64", "int32"), ("int64", "int16"), ("int64", "int8"), ("int64", "uint8"), ("int64", "uint16"),
           ("int64", "uint32"), ("float64", "float32")}   # (compiled, given): conversions Numba makes safely


def fused_id(source: str) -> str:
    """The id of a generated kernel: a hash of its source only (the device has no Numba version to mix in)."""
    return FUSED_PREFIX + hashlib.sha256(source.encode()).hexdigest()[:24]


def export_name(kernel_id: str, k: int) -> str:
    """The C identifier of a kernel's ``k``-th signature: ``softmax__sce__0``, ``fused_<hash>__0``."""
    if kernel_id.startswith(FUSED_PREFIX):
        stem = "fused_" + kernel_id[len(FUSED_PREFIX):]
    else:
        family, name = kernel_id.removeprefix("edgetrain.kernels.").rsplit(".", 1)
        stem = f"{family}__{name}"
    return re.sub(r"\W", "_", stem) + f"__{k}"


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
    """A manifest's argument key (``float32[2C]``) in the form ``_key`` computes; ValueError/TypeError when it
    is not one."""
    if "[" not in text or text.startswith("("):
        return text
    dtype, rest = text.split("[", 1)
    dims, flags = rest.split("]", 1)
    if dims[-1] not in "CFA" or flags not in ("", "ro"):
        raise ValueError(f"not an array key: {text!r}")
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
    """A kernel's ahead-of-time exports, chosen by the argument types of each call.

    ``exports``: ``[(export name, [argument key, ...]), ...]``; ``module()``: the extension module holding them
    (imported on the first call); ``missing(kernel, key)``: what to call for argument types no export takes
    (it raises, or returns a callable)."""

    def __init__(self, kernel_id: str, exports, module, missing, py_func=None):
        self.kernel_id = kernel_id
        self.py_func = py_func
        self._exports = [(name, tuple(parse_key(k) for k in keys)) for name, keys in exports]
        self._module = module
        self._missing = missing
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

    def resolve(self, args: tuple):
        """The export (or fallback) that takes ``args``, for a caller that calls it with them every time
        (``kernels.direct``)."""
        key = tuple([_key(a) for a in args])
        fn = self._chosen.get(key)
        if fn is None:
            fn = self._chosen[key] = self._choose(key)
        return fn

    def _choose(self, key: tuple):
        for exact in (True, False):
            for name, keys in self._exports:
                if len(keys) == len(key) and all(c == g if exact else _accepts(c, g) for c, g in zip(keys, key)):
                    return getattr(self._module(), name)
        return self._missing(self, key)

    def describe(self, key: tuple) -> str:
        """What a call with ``key`` asked for and what the exports hold (for errors and logs)."""
        built = "; ".join("(" + ", ".join(map(key_text, keys)) + ")" for _, keys in self._exports)
        return (f"kernel {self.kernel_id} called with ({', '.join(map(key_text, key))}); "
                f"compiled ahead of time for {built or 'no signature'}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kernel_id!r}, {len(self._exports)} signatures)"
