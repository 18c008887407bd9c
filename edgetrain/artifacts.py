"""``generate_artifacts``: training, eval and optimizer models and the checkpoint, as ORT 1.19 writes them."""
from __future__ import annotations

import os
from enum import Enum
from pathlib import Path

from . import checkpoint, onnxblock
from .errors import EdgetrainError
from .onnx_io import load_model, save_model
from .onnxblock.checkpoint_utils import checkpoint_of


class LossType(Enum):
    MSELoss = 1
    CrossEntropyLoss = 2
    BCEWithLogitsLoss = 3
    L1Loss = 4


class OptimType(Enum):
    AdamW = 1
    SGD = 2


_LOSSES = {LossType.MSELoss: onnxblock.loss.MSELoss, LossType.CrossEntropyLoss: onnxblock.loss.CrossEntropyLoss,
           LossType.BCEWithLogitsLoss: onnxblock.loss.BCEWithLogitsLoss, LossType.L1Loss: onnxblock.loss.L1Loss}
_OPTIMIZERS = {OptimType.AdamW: onnxblock.optim.AdamW, OptimType.SGD: onnxblock.optim.SGD}


class _TrainingBlock(onnxblock.TrainingBlock):
    def __init__(self, loss: onnxblock.Block, additional_output_names):
        super().__init__()
        self._loss = loss
        self._additional = list(additional_output_names or [])

    def build(self, *inputs_to_loss):
        loss = self._loss(*inputs_to_loss)     # a name, or several (PassThrough: the model's outputs)
        names = (loss,) if isinstance(loss, str) else tuple(loss)
        return (*names, *self._additional) if self._additional or len(names) > 1 else names[0]


def _loss_block(loss) -> onnxblock.Block:
    if loss is None:
        return onnxblock.blocks.PassThrough()
    if isinstance(loss, LossType):
        return _LOSSES[loss]()
    if isinstance(loss, onnxblock.Block):
        return loss
    raise EdgetrainError(f"unknown loss {loss!r}: expected an edgetrain.artifacts.LossType or an "
                         "edgetrain.onnxblock.Block")


def _optimizer_block(optimizer) -> onnxblock.Block | None:
    if optimizer is None:
        return None
    if isinstance(optimizer, OptimType):
        return _OPTIMIZERS[optimizer]()
    if isinstance(optimizer, onnxblock.Block):
        return optimizer
    raise EdgetrainError(f"unknown optimizer {optimizer!r}: expected an edgetrain.artifacts.OptimType or an "
                         "edgetrain.onnxblock.optim block")


def generate_artifacts(model, requires_grad=None, frozen_params=None, loss=None, optimizer=None,
                       artifact_directory=None, prefix: str = "", ort_format: bool = False,
                       custom_op_library=None, additional_output_names=None, nominal_checkpoint: bool = False,
                       loss_input_names=None) -> None:
    """Write ``{prefix}training_model.onnx``, ``eval_model.onnx``, ``checkpoint`` (and ``nominal_checkpoint``,
    ``optimizer_model.onnx``) for ``model`` (a ModelProto or a path), with onnxruntime 1.19's arguments.

    ``requires_grad`` defaults to nothing, as in ORT: name the trainable initializers.
    """
    if ort_format:
        raise EdgetrainError("ort_format=True is not supported: edgetrain writes ONNX artifacts; the minimal build "
                             "(`edgetrain reduce`) makes the compact device format")
    if custom_op_library is not None:
        raise EdgetrainError("custom_op_library is not supported: edgetrain runs only the ops of its op table")
    if additional_output_names is not None and not isinstance(additional_output_names, list):
        raise EdgetrainError("additional_output_names must be a list of output names")
    requires_grad, frozen_params = list(requires_grad or []), list(frozen_params or [])
    overlap = set(requires_grad) & set(frozen_params)
    if overlap:
        raise EdgetrainError(f"parameters {sorted(overlap)} cannot be frozen and require a gradient at once")
    loss_block, optim = _loss_block(loss), _optimizer_block(optimizer)
    proto = load_model(model)
    block = _TrainingBlock(loss_block, additional_output_names)
    for name in requires_grad:
        block.requires_grad(name)
    for name in frozen_params:
        block.requires_grad(name, False)
    # build everything in memory first: an error leaves no half-written set of artifacts behind
    with onnxblock.base(proto) as accessor:
        outputs = [v.name for v in accessor.model.graph.output]
        if loss_input_names is not None:
            unknown = [n for n in loss_input_names if n not in outputs]
            if unknown:
                raise EdgetrainError(f"loss_input_names {unknown} are not outputs of the model: {outputs}")
            outputs = list(loss_input_names)
        block(*outputs)
        training_model, eval_model = block.to_model_proto()
        parameters = block.parameters()
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    files = {"training_model.onnx": training_model, "eval_model.onnx": eval_model,
             "checkpoint": checkpoint_of(parameters)}
    if nominal_checkpoint:
        files["nominal_checkpoint"] = checkpoint_of(parameters, nominal_checkpoint=True)
    if optim is not None:
        if not parameters[0]:
            raise EdgetrainError("an optimizer model needs trainable parameters: name them in requires_grad, or "
                                 "pass optimizer=None for artifacts without gradients")
        with onnxblock.empty_base(opset_version=opset):
            optim(parameters)
            files["optimizer_model.onnx"] = optim.to_model_proto()
    folder = Path(artifact_directory if artifact_directory is not None else os.getcwd())
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if name.endswith("checkpoint"):
            checkpoint.save(content, folder / f"{prefix}{name}")
        else:
            save_model(content, folder / f"{prefix}{name}")
