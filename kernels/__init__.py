"""Numba kernels, one module per op family (stems match ``edgetrain.ops``).

``_jit`` is imported first so it configures Numba (cache dir, threads) before any kernel module imports it.
"""
if __name__ != "edgetrain.kernels":
    # Numba's disk cache is keyed by file, and its entries name the module: entries written under another name
    # (``kernels``, from the repository's root) fail to load in every later process with "No module named ..."
    raise ImportError(f"edgetrain's kernels were imported as '{__name__}': import them as edgetrain.kernels "
                      "(from edgetrain.kernels import rnn), the only name their Numba cache entries load under")

from . import _jit  # noqa: E402,F401


def bindable(bind):
    """A launcher made from ``bind(*arrays) -> (fn, args)``: a program calls ``bind`` once with the arrays it
    planned (arena views, fixed per input shape) and then only ``fn(*args)`` each step, so views, reshapes and
    choices fixed by the shapes are made once; a direct call binds and runs."""
    def run(*arrays):
        fn, args = bind(*arrays)
        fn(*args)
    run.bind = bind
    return run


def direct(fn, args: tuple):
    """What ``fn(*args)`` runs, callable without a dispatcher choosing it again: for a Numba dispatcher, the
    entry point it compiled (or loaded) for exactly these argument types; for a kernel of the warm set or the
    trimmed build (``_aot.AotKernel``), the export that takes them; else ``fn`` (not compiled yet, or no
    kernel).

    Numba's dispatcher types every argument of every call (~0.1-0.2 us an array), which is most of a small
    kernel's cost. Only for arguments bound once whose types never change: a program's arena views, constants
    and external arrays (updated in place, never rebound)."""
    resolve = getattr(fn, "resolve", None)
    if resolve is not None:
        fn = resolve(args)
    overloads = getattr(fn, "overloads", None)
    if not overloads:
        return fn
    cres = overloads.get(tuple(fn.typeof_pyval(a) for a in args))
    return fn if cres is None or cres.objectmode else cres.entry_point


def checked(kernel, call, ctx, input_index: int, values, allowed: str):
    """``(fn, ())`` running ``kernel(*call)``, which returns -1 or the flat position of the first value of input
    ``input_index`` outside what ``allowed`` says; that one is refused, naming the node, tensor and value.
    From the second call on ``kernel`` is called ``direct``; ``fn.kernel_calls`` names the call, so a program's
    first run can compile it ahead (``codegen.parallel_compile``)."""
    chosen = [kernel]

    def run():
        bad = chosen[0](*call)
        if bad >= 0:
            raise ctx.bad_value(input_index, values, bad, allowed)
        if chosen[0] is kernel:
            chosen[0] = direct(kernel, call)
    run.kernel_calls = ((kernel, call),)
    return run, ()


ROW_BLOCK = 1 << 18       # elements a block of rows holds at least: ~0.25 ms of a softmax or layer norm, above a
                          # hand-off between Python threads (0.1-0.2 ms: gpt's 65536-element layer norms in two
                          # blocks of 1<<15 took 0.28 ms a call against 0.06 whole)


def by_rows(calls, rows: int, row_size: int):
    """``(fn, args)`` running each ``kernel(*args)`` of ``calls`` (``(kernel, args, cut)``, in order) whose
    arguments marked in ``cut`` hold ``rows`` rows (of ``row_size`` elements) along their first axis that it
    computes independently of other rows (softmax rows, layer-norm rows): with intra-op threads
    (``edgetrain.parallel``) in blocks of at least ``ROW_BLOCK`` elements, each block every call on its slices;
    else the calls as they are. Slices of C-contiguous rows are C-contiguous: the same kernel signatures either
    way, and each row's numbers are the whole call's."""
    from edgetrain import parallel

    calls = [(kernel, tuple(args), tuple(cut)) for kernel, args, cut in calls]
    min_rows = max(1, ROW_BLOCK // max(1, row_size))
    if parallel.slots() < 2 or rows < 2 * min_rows:
        return in_turn([c[:2] for c in calls])
    chosen = [c[0] for c in calls]      # each kernel called direct from its second call (slices: same types)

    def work(_slot, lo, hi):
        for k, (kernel, args, cut) in enumerate(calls):
            part = tuple(a[lo:hi] if c else a for a, c in zip(args, cut))
            fn = chosen[k]
            fn(*part)
            if fn is kernel:
                chosen[k] = direct(kernel, part)

    def run():
        parallel.split(rows, work, min_rows)
    run.kernel_calls = tuple(c[:2] for c in calls)
    return run, ()


def in_turn(calls):
    """``(fn, args)`` running each ``kernel(*args)`` of ``calls`` in order, each called ``direct`` from its second
    run on (a launcher's several kernels: dispatching each call by its argument types costs ~1-3 us)."""
    calls = [(kernel, tuple(args)) for kernel, args in calls]
    if len(calls) == 1:
        return calls[0]
    chosen = [kernel for kernel, _ in calls]

    def run():
        for k, (kernel, args) in enumerate(calls):
            fn = chosen[k]
            fn(*args)
            if fn is kernel:
                chosen[k] = direct(kernel, args)
    run.kernel_calls = tuple(calls)
    return run, ()
