"""``edgetrain.onnxblock``: onnxruntime.training.onnxblock's surface, built on edgetrain's IR.

    with onnxblock.base(model):
        ...
"""
from . import blocks, loss, optim
from ._builder import base, empty_base
from .checkpoint_utils import save_checkpoint
from .onnxblock import Block, ForwardBlock, TrainingBlock

__all__ = ["Block", "ForwardBlock", "TrainingBlock", "base", "blocks", "empty_base", "loss", "optim",
           "save_checkpoint"]
