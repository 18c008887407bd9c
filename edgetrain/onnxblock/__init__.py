"""``edgetrain.onnxblock``: onnxruntime.training.onnxblock's surface (ORT 1.19), on ``onnx.ModelProto``s checked
through edgetrain's IR.

    with onnxblock.base(model) as accessor:
        ...
        edited = accessor.model
"""
from contextlib import contextmanager

from . import blocks, loss, optim
from ._builder import ModelAccessor, base, empty_base
from .checkpoint_utils import load_checkpoint_to_model, save_checkpoint
from .onnxblock import Block, ForwardBlock, TrainingBlock


@contextmanager
def custom_op_library(custom_op_library_path):
    """ORT registers a custom-op library here; edgetrain runs only the ops of its own table."""
    raise NotImplementedError(f"custom op libraries ('{custom_op_library_path}') are not supported: edgetrain runs "
                              "only the ops of its op table (`edgetrain ops`)")
    yield


__all__ = ["Block", "ForwardBlock", "ModelAccessor", "TrainingBlock", "base", "blocks", "custom_op_library",
           "empty_base", "load_checkpoint_to_model", "loss", "optim", "save_checkpoint"]
