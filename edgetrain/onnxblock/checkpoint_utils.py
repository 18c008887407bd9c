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


def load_checkpoint_to_model(path_to_checkpoint: str | os.PathLike, model) -> None:
    """Overwrite, in place, the initializers of ``model`` (an onnx.ModelProto) that the checkpoint holds
    (trainable and frozen) with the checkpoint's values, as ORT's function of that name does."""
    from .. import checkpoint
    from ..errors import EdgetrainError
    from ..onnx_io import tensor_proto
    ckpt = checkpoint.load(path_to_checkpoint)
    if ckpt.is_nominal:
        raise EdgetrainError(f"checkpoint '{os.fspath(path_to_checkpoint)}' is nominal: it holds no parameter "
                             "values to load into a model")
    values = ckpt.parameters
    for k, init in enumerate(model.graph.initializer):
        if init.name in values:
            value = values[init.name]
            if tuple(init.dims) != value.shape:
                raise EdgetrainError(f"initializer '{init.name}' is {list(init.dims)} in the model but "
                                     f"{list(value.shape)} in checkpoint '{os.fspath(path_to_checkpoint)}'")
            model.graph.initializer[k].CopyFrom(tensor_proto(init.name, value))
