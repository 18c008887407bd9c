"""Gradient accumulation kernels. They write into their input buffer: the runtime binds that input to the
persistent gradient store, which is the point (onnxruntime aliases input 0 to output 1 the same way)."""
import numpy as np


def accumulate(ctx):
    n_in = len(ctx.node.inputs)

    def run(*args):
        buffer, value = args[0], args[1]
        overwrite = args[2] if n_in > 2 else None
        done, updated = args[n_in], (args[n_in + 1] if len(args) > n_in + 1 else None)
        if overwrite is not None and overwrite.reshape(-1)[0]:
            np.copyto(buffer, value)
        else:
            np.add(buffer, value, out=buffer)
        done[0] = True
        if updated is not None:
            np.copyto(updated, buffer)
    return run
