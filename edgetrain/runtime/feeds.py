"""Feeds checked against a graph's declared inputs: the concrete types a plan is made for."""
from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..ir import TensorType, Value
from ..ir.dtypes import ORT_TYPE_NAME


def bind_feeds(inputs: list[Value], feeds: dict[str, np.ndarray], where: str) -> dict[str, TensorType]:
    """Check feeds against declared inputs; return the concrete type of each, symbolic dims bound."""
    names = {v.name for v in inputs}
    extra = [k for k in feeds if k not in names]
    if extra:
        raise InputError(f"{where}: unexpected input(s) {extra}; expected: "
                         + ", ".join(f"'{v.name}' {v.type}" for v in inputs))
    bound: dict[str, int] = {}
    types = {}
    for v in inputs:
        if v.name not in feeds:
            raise InputError(f"{where}: missing input '{v.name}' (expected {v.type})")
        x = feeds[v.name]
        if isinstance(x, np.generic):       # a numpy scalar (np.float32(2)) is a 0-d tensor, as onnxruntime takes it
            x = np.asarray(x)
        if not isinstance(x, np.ndarray):
            raise InputError(f"{where}: input '{v.name}' must be a numpy array (expected {v.type}), "
                             f"got {type(x).__name__}")
        if x.dtype != v.type.dtype:
            raise InputError(f"{where}: input '{v.name}' has element type {ORT_TYPE_NAME.get(x.dtype, x.dtype)}, "
                             f"expected {v.type}")
        if x.ndim != len(v.type.shape):
            raise InputError(f"{where}: input '{v.name}' has shape {x.shape}, expected {v.type} (rank mismatch)")
        for d, (want, got) in enumerate(zip(v.type.shape, x.shape)):
            if isinstance(want, int) and want != got:
                raise InputError(f"{where}: input '{v.name}' has shape {x.shape}, expected {v.type} (dim {d})")
            if isinstance(want, str):
                if bound.setdefault(want, got) != got:
                    raise InputError(f"{where}: input '{v.name}' dim {d} ('{want}') is {got}, but '{want}' is "
                                     f"{bound[want]} in another input")
        types[v.name] = TensorType(x.dtype, x.shape)
    return types
