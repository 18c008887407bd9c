"""Ops that only training graphs use: gradient accumulation (and, later, the optimizer updates)."""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from .base import NodeContext, OpDef


def _accumulator(ctx: NodeContext):
    buffer, value = ctx.type(0), ctx.type(1)
    if buffer.shape != value.shape or buffer.dtype != value.dtype:
        raise ctx.error(f"buffer {buffer} and value {value} must have one type")
    if ctx.has_input(2) and (ctx.type(2).dtype != np.bool_ or ctx.type(2).size != 1):
        raise ctx.error(f"overwrite flag must be bool[1], got {ctx.type(2)}")
    return [TensorType(np.bool_, (1,)), buffer][:max(1, len(ctx.node.outputs))]


OPS = (
    OpDef("InPlaceAccumulatorV2", _accumulator, domain="com.microsoft", since=1, kernel="training.accumulate",
          deterministic=False,
          doc="buffer = value if overwrite else buffer + value, in place in input 0; outputs (done flag, "
              "optional updated buffer)"),
)
