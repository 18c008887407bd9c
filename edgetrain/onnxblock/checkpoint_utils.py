"""``save_checkpoint(parameters, path, nominal_checkpoint=False)`` as onnxblock has it."""
from __future__ import annotations

import os


def checkpoint_of(parameters, nominal_checkpoint: bool = False):
    """An edgetrain.checkpoint.Checkpoint holding (trainable, frozen) TensorProtos."""
    from .. import checkpoint
    from ..onnx_io import tensor_value

    trainable, frozen = parameters
    return checkpoint.Checkpoint(trainable={t.name: tensor_value(t) for t in trainable},
                                 frozen={t.name: tensor_value(t) for t in frozen}, is_nominal=nominal_checkpoint)


def save_checkpoint(parameters, path_to_checkpoint: str | os.PathLike, nominal_checkpoint: bool = False) -> None:
    """Write (trainable, frozen) TensorProtos as an ORT-compatible checkpoint (atomically)."""
    from .. import checkpoint
    checkpoint.save(checkpoint_of(parameters, nominal_checkpoint), path_to_checkpoint)
