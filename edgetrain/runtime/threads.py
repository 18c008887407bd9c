"""Limit BLAS threads after numpy is loaded (environment variables only work before)."""
from __future__ import annotations

import ctypes

_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads", "MKL_Set_Num_Threads")
_done: set[int] = set()


def limit_blas_threads(n: int) -> bool:
    """Call the loaded BLAS's thread setter; True if one was found. Runs once per thread count."""
    if n in _done:
        return True
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "blas" in line.lower() or "mkl" in line.lower()}
    except OSError:
        return False
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter(ctypes.c_int(n))
                _done.add(n)
                return True
    return False
