"""The state store: one model's parameters, gradient buffers and optimizer moments.

Each kind lives in one contiguous array, tensors in the training model's parameter order, so the training
program reads parameters and accumulates gradients through views, the optimizer updates everything in one
pass over flat arrays, and ``get_contiguous_parameters`` is one copy (or, opted into, a view). Frozen parameters
(batch-norm running statistics, frozen layers) are separate arrays.

Gradients have two arrays (slots): ``grads`` is the committed one; a training step writes the other and
``commit_gradients`` swaps them, so a refused step never touches the committed gradients
(``edgetrain.runtime.step``).
"""
from __future__ import annotations

import math

import numpy as np

from .. import budget, pages
from ..errors import EdgetrainError
from ..ir import TensorType
from ..ir.dtypes import CARRIED, ORT_TYPE_NAME


def planned_nbytes(trainable: dict[str, TensorType], frozen: dict[str, TensorType]) -> int:
    """Bytes a store for parameters of these declared types takes (before optimizer moments): parameters, two
    gradient arrays, frozen copies. Dims are checked (integers >= 0, an exact size), so a model's declared
    shapes can be weighed against the memory budget before anything is allocated."""
    sizes = {}
    for name, t in (trainable | frozen).items():
        if not isinstance(t, TensorType):
            raise EdgetrainError(f"parameter '{name}' is declared as {t}, not a tensor")
        sizes[name] = budget.checked_shape(t.shape, t.dtype.itemsize, f"parameter '{name}'")
    return 3 * sum(sizes[n] for n in trainable) + sum(sizes[n] for n in frozen)


class StateStore:
    @staticmethod
    def names_of(arrays: dict[str, np.ndarray], shown: int = 5) -> str:
        names = list(arrays)
        more = f" and {len(names) - shown} more" if len(names) > shown else ""
        return ", ".join(f"'{n}'" for n in names[:shown]) + more

    def __init__(self, trainable: dict[str, np.ndarray], frozen: dict[str, np.ndarray]):
        dtypes = {a.dtype for a in trainable.values()}
        if len(dtypes) > 1:
            raise EdgetrainError(f"trainable parameters must share one element type, got {sorted(map(str, dtypes))}")
        self.dtype = dtypes.pop() if dtypes else np.dtype(np.float32)
        if self.dtype in CARRIED:     # kernels have no float16 arithmetic; inference carries it in float32
            raise EdgetrainError(f"trainable parameters {self.names_of(trainable)} are {ORT_TYPE_NAME[self.dtype]}: "
                                 "edgetrain trains float32/float64 parameters only; convert them to float32")
        self.names = list(trainable)
        self.shapes = {n: tuple(a.shape) for n, a in trainable.items()}
        sizes = [math.prod(self.shapes[n]) for n in self.names]     # shapes of arrays: ints
        self.offsets = dict(zip(self.names, np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int).tolist()))
        self.size = int(sum(sizes))
        # on 4 KiB pages: faster to fill than numpy's huge pages where free memory goes back to a host (pages.py)
        self.params = pages.zeros(self.size, self.dtype)
        self.grad_slots = (pages.zeros(self.size, self.dtype), pages.zeros(self.size, self.dtype))
        self.slot = 0                 # which of grad_slots holds the committed gradients
        self.grads = self.grad_slots[0]
        self.moments: list[np.ndarray] = []
        for n, a in trainable.items():
            np.copyto(self.param(n), a)
        self.frozen = {n: np.array(a, order="C") for n, a in frozen.items()}
        self.step = 0                 # optimizer steps taken
        self.has_gradients = False    # a training step ran since the store was made (or reset)

    def _view(self, flat: np.ndarray, name: str) -> np.ndarray:
        off = self.offsets[name]
        shape = self.shapes[name]
        return flat[off: off + math.prod(shape)].reshape(shape)

    def param(self, name: str) -> np.ndarray:
        return self._view(self.params, name)

    def grad(self, name: str, slot: int | None = None) -> np.ndarray:
        """The committed gradient of ``name``, or its view in gradient slot ``slot``."""
        return self._view(self.grads if slot is None else self.grad_slots[slot], name)

    def commit_gradients(self, accumulate: bool) -> None:
        """The spare slot (a step's gradients) becomes the committed one; ``accumulate``: plus the old sums."""
        spare = self.grad_slots[1 - self.slot]
        if accumulate:
            np.add(spare, self.grads, out=spare)
        self.slot = 1 - self.slot
        self.grads = spare
        self.has_gradients = True

    def moment(self, k: int, name: str) -> np.ndarray:
        return self._view(self.moments[k], name)

    def ensure_moments(self, count: int) -> None:
        while len(self.moments) < count:
            self.moments.append(pages.zeros(self.size, self.dtype))

    def nbytes(self) -> int:
        return (self.params.nbytes + sum(g.nbytes for g in self.grad_slots) + sum(m.nbytes for m in self.moments)
                + sum(a.nbytes for a in self.frozen.values()))
