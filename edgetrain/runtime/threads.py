"""Limit BLAS threads after numpy is loaded (environment variables only work before)."""
from __future__ import annotations

import ctypes

_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads", "MKL_Set_Num_Threads")
_found: list[list] = []      # [the thread setters of the BLAS libraries loaded at the first call], once looked up


def _setters() -> list:
    """The thread setters of the BLAS libraries loaded when first asked (numpy's, which edgetrain's GEMMs call,
    and any other then loaded: the environment variables edgetrain defaults at import reach them all alike).
    Looked up once: reading /proc/self/maps costs ~0.4 ms, a setter call ~1 us."""
    if not _found:
        try:
            with open("/proc/self/maps") as f:
                libs = {line.split()[-1] for line in f if "blas" in line.lower() or "mkl" in line.lower()}
        except OSError:
            return []
        setters = []
        for path in sorted(libs):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            setters += [getattr(lib, n) for n in _SETTERS if getattr(lib, n, None) is not None][:1]
        _found.append(setters)
    return _found[0]


def limit_blas_threads(n: int) -> bool:
    """Set the BLAS libraries' threads to ``n``; True if a setter was found. Set again on every call (each
    program's creation): anything else in the process may have changed the count since, and a GEMM's bits depend
    on it (OpenBLAS at 2 threads rounds the mlp's eval loss 2 ulps apart from 1 thread)."""
    setters = _setters()
    for setter in setters:
        setter(ctypes.c_int(n))
    return bool(setters)
