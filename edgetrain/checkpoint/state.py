"""What a checkpoint holds: parameters, optimizer groups, properties (plain data, no file format here)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import EdgetrainError

MOMENTUM_NAMES = ("momentum0", "momentum1")    # AdamW's first and second moments, as ORT names them


class CheckpointError(EdgetrainError):
    """A checkpoint is missing, truncated, corrupt, of another format or version, or cannot be written."""


@dataclass(eq=False)
class OptimizerGroup:
    """One optimizer group: ORT 1.19 writes a single group named ``"group0"``.

    Attributes
    ----------
    name : str
    step : int
        Optimizer steps taken (int64).
    initial_learning_rate : float
        Stored as float32: after a round trip it equals ``float(np.float32(value))``.
    states : dict[str, dict[str, np.ndarray]]
        Parameter name -> moment name (``"momentum0"``, ``"momentum1"``) -> array shaped like the parameter.
    """

    name: str = "group0"
    step: int = 0
    initial_learning_rate: float = 0.0
    states: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


@dataclass(eq=False)
class Checkpoint:
    """The content of an ORT 1.19 training checkpoint (``ODTC`` flatbuffer, version 2).

    Attributes
    ----------
    trainable : dict[str, np.ndarray]
        Parameters that receive gradients (``requires_grad_params``), in file order.
    frozen : dict[str, np.ndarray]
        Parameters without gradients (``frozen_params``), e.g. batch-norm running statistics.
    optimizer_groups : list[OptimizerGroup]
    properties : dict[str, int | float | str]
        User properties; floats are stored as float32, ints as int64.
    is_nominal : bool
        A nominal checkpoint names the parameters and their element types only; its arrays are empty 1-D
        arrays of the right dtype (shapes come from the training model). Writing one drops the data.

    Arrays read from a file are writable views into the file's bytes where the data are aligned (copies
    otherwise), so keeping any of them keeps the whole buffer alive.
    """

    trainable: dict[str, np.ndarray] = field(default_factory=dict)
    frozen: dict[str, np.ndarray] = field(default_factory=dict)
    optimizer_groups: list[OptimizerGroup] = field(default_factory=list)
    properties: dict[str, int | float | str] = field(default_factory=dict)
    is_nominal: bool = False

    @property
    def parameters(self) -> dict[str, np.ndarray]:
        """Trainable then frozen parameters, by name."""
        return {**self.trainable, **self.frozen}

    def nbytes(self) -> int:
        """Bytes of tensor data (parameters and optimizer moments)."""
        n = sum(a.nbytes for a in self.parameters.values())
        return n + sum(m.nbytes for g in self.optimizer_groups for s in g.states.values() for m in s.values())
