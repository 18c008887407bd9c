"""Numba kernels, one module per op family (stems match ``edgetrain.ops``).

``_jit`` is imported first so it configures Numba (cache dir, threads) before any kernel module imports it.
"""
from . import _jit  # noqa: F401
