"""Numba kernels, one module per op family (stems match ``edgetrain.ops``).

``_jit`` is imported first so it configures Numba (cache dir, threads) before any kernel module imports it.
"""
from . import _jit  # noqa: F401


def bindable(bind):
    """A launcher made from ``bind(*arrays) -> (fn, args)``: a program calls ``bind`` once with the arrays it
    planned (arena views, fixed per input shape) and then only ``fn(*args)`` each step, so views, reshapes and
    choices fixed by the shapes are made once; a direct call binds and runs."""
    def run(*arrays):
        fn, args = bind(*arrays)
        fn(*args)
    run.bind = bind
    return run


def checked(kernel, call, ctx, input_index: int, values, allowed: str):
    """``(fn, ())`` running ``kernel(*call)``, which returns -1 or the flat position of the first value of input
    ``input_index`` outside what ``allowed`` says; that one is refused, naming the node, tensor and value."""
    def run():
        bad = kernel(*call)
        if bad >= 0:
            raise ctx.bad_value(input_index, values, bad, allowed)
    return run, ()
