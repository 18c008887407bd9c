"""numpy's BLAS as edgetrain uses it: its thread count, set after numpy is loaded (environment variables only
work before), and its single-precision GEMM's address, which ``kernels/_gemm_pool.py`` calls from native
threads (no GIL between blocks)."""
from __future__ import annotations

import ctypes

_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads", "MKL_Set_Num_Threads")
# cblas_sgemm under the names BLAS builds export it; a "64_" suffix marks 64-bit integer arguments (ILP64)
_SGEMM = ("scipy_cblas_sgemm64_", "cblas_sgemm64_", "scipy_cblas_sgemm", "cblas_sgemm")
_found: list[list] = []      # [the BLAS libraries loaded at the first call, numpy's first], once looked up


def _libraries() -> list:
    """The BLAS libraries loaded when first asked (numpy's, which edgetrain's GEMMs call, and any other then
    loaded: the environment variables edgetrain defaults at import reach them all alike), numpy's first.
    Looked up once: reading /proc/self/maps costs ~0.4 ms."""
    if not _found:
        try:
            with open("/proc/self/maps") as f:
                paths = {line.split()[-1] for line in f if "blas" in line.lower() or "mkl" in line.lower()}
        except OSError:
            paths = set()
        libs = []
        for path in sorted(paths, key=lambda p: ("numpy" not in p, p)):
            try:
                libs.append(ctypes.CDLL(path))
            except OSError:
                continue
        _found.append(libs)
    return _found[0]


def _setters() -> list:
    """The thread setter of each loaded BLAS library (a setter call costs ~1 us)."""
    return [s for lib in _libraries() for s in [getattr(lib, n) for n in _SETTERS if getattr(lib, n, None)][:1]]


def sgemm() -> tuple[int, bool] | None:
    """The address of numpy's BLAS ``cblas_sgemm`` and whether its integers are 64-bit, or None (no BLAS found
    that exports it: GEMMs then stay numpy calls)."""
    for lib in _libraries()[:1]:
        for name in _SGEMM:
            fn = getattr(lib, name, None)
            if fn is not None:
                return ctypes.cast(fn, ctypes.c_void_p).value, name.endswith("64_")
    return None


def limit_blas_threads(n: int) -> bool:
    """Set the BLAS libraries' threads to ``n``; True if a setter was found. Set again on every call (each
    program's creation): anything else in the process may have changed the count since, and a GEMM's bits depend
    on it (OpenBLAS at 2 threads rounds the mlp's eval loss 2 ulps apart from 1 thread)."""
    setters = _setters()
    for setter in setters:
        setter(ctypes.c_int(n))
    return bool(setters)
