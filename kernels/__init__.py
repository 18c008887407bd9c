"""Numba kernels, one module per op family (stems match ``edgetrain.ops``); ``_jit`` configures Numba."""
