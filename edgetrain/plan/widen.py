"""Stage 2b: carried element types (float16) become their carrier (float32) for the kernels.

Numba has no float16 arithmetic on CPU, so a float16 tensor is stored and computed in float32 inside a plan,
as many runtimes do on hardware without float16 units. Its value is rounded to float16 where ONNX makes a float16
value observable: a Cast to float16 rounds (through a float16 scratch, ``kernels.tensor.cast``), and an output
declared float16 is converted when the program returns it (``Program``). Intermediate results keep float32's
precision, so they are at least as accurate as a float16 computation. Shape rules and folding ran on the
declared types before this pass (``specialize``), so a model is checked as written. The ml_dtypes types (bfloat16,
float8, int4, ...) are carried the same way; only Cast and ops that move values take them (``ir.dtypes``).
"""
from __future__ import annotations

import numpy as np

from .. import budget
from ..ir import TensorType
from ..ir.dtypes import CARRIED, carrier
from .specialize import Specialized, carried_context


def widen(spec: Specialized, max_memory: int | None = None) -> Specialized:
    """``spec`` with every carried value in its carrier type; ``spec.declared`` keeps the declared element type
    of the graph inputs and outputs that changed (the program converts them)."""
    narrow = {name for name, t in spec.types.items() if isinstance(t, TensorType) and t.dtype in CARRIED}
    if not narrow:
        return spec
    grown = sum(np.asarray(c).size * carrier(np.asarray(c).dtype).itemsize
                for name, c in spec.consts.items() if name in narrow)
    budget.check(grown, max_memory, "constants widened to float32 (from float16 or another carried type)")
    edges = set(spec.input_names) | set(spec.output_names)
    spec.declared = {name: spec.types[name].dtype for name in narrow & edges}
    for name in narrow:
        t = spec.types[name]
        spec.types[name] = TensorType(carrier(t.dtype), t.shape)
        if name in spec.consts:
            spec.consts[name] = np.asarray(spec.consts[name]).astype(carrier(spec.consts[name].dtype))
    for b in spec.nodes:
        b.ctx = carried_context(b.ctx, spec.consts)
    return spec
