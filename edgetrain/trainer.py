"""Epoch loops over in-memory arrays with ``edgetrain.api``: what the CLI's train/eval/demo commands share.

Arrays are given in the model's user-input order (e.g. ``[images, labels]``); the last batch of an epoch may be
smaller (the module plans that shape once and caches it).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import compact
from .errors import EdgetrainError, InputError


@dataclass
class StepInfo:
    epoch: int               # 0-based
    step: int                # 1-based within the epoch
    steps_per_epoch: int
    loss: float              # this step's loss
    mean_loss: float         # mean over the epoch so far, weighted by batch size
    samples_per_s: float     # over the epoch so far


def check_arrays(arrays: Sequence[np.ndarray], names: Sequence[str]) -> int:
    """The common number of samples (first dimension) of ``arrays``, one per named model input."""
    if len(arrays) != len(names):
        raise InputError(f"the model takes {len(names)} input(s) {list(names)}, got {len(arrays)} array(s)")
    sizes = {name: (a.shape[0] if a.ndim else None) for name, a in zip(names, arrays)}
    if len(set(sizes.values())) != 1 or None in sizes.values():
        raise InputError(f"inputs must share their first (sample) dimension, got {sizes}")
    return next(iter(sizes.values()))


def check_indices(module, arrays: Sequence[np.ndarray]) -> None:
    """Every label within the classes of its loss and every token id within its embedding table, checked over the
    whole data set before training: the error names the array, the sample and the value."""
    bounds = module.index_bounds()
    for name, a in zip(module.input_names(), arrays):
        if name not in bounds:
            continue
        bound, ignored = bounds[name]
        bad = (a < 0) | (a >= bound)
        if ignored is not None:
            bad &= a != ignored
        if bad.any():
            where = np.argwhere(bad)[0]
            value = a[tuple(where)]
            at = f"sample {where[0]}" + (f", position {tuple(int(i) for i in where[1:])}" if len(where) > 1 else "")
            raise InputError(f"array '{name}' has value {value} at {at}: valid values are 0 to {bound - 1}"
                             + (f" (or {ignored}, ignored)" if ignored is not None else "")
                             + f"; {int(bad.sum())} value(s) are out of range")


def batches(n: int, batch_size: int, rng: np.random.Generator | None) -> Iterator[np.ndarray]:
    """Sample indices per batch: a permutation drawn from ``rng``, or in order when ``rng`` is None."""
    if batch_size < 1:
        raise InputError(f"batch size must be >= 1, got {batch_size}")
    order = rng.permutation(n) if rng is not None else np.arange(n)
    for start in range(0, n, batch_size):
        yield order[start:start + batch_size]


def train_epoch(module, optimizer, arrays: Sequence[np.ndarray], batch_size: int, epoch: int = 0,
                rng: np.random.Generator | None = None, scheduler=None, skip_steps: int = 0,
                on_step: Callable[[StepInfo], None] | None = None, drop_last: bool = False,
                clock: Callable[[], float] = time.perf_counter) -> float:
    """One pass over ``arrays``: forward+backward, optimizer step, scheduler step, gradient reset per batch.

    ``skip_steps`` batches are drawn but not run (resuming mid-epoch with the same ``rng`` state);
    ``drop_last``: a last batch smaller than ``batch_size`` is not run (models exported with a fixed batch);
    ``clock``: the time base of samples/s (the CLI's leaves kernel compilation out).
    Returns the mean loss of the steps run, weighted by batch size.
    """
    n = check_arrays(arrays, module.input_names())
    module.train()
    steps = n // batch_size if drop_last else -(-n // batch_size)
    total = seen = 0.0
    start = clock()
    for step, idx in enumerate(batches(n, batch_size, rng), 1):
        if step > steps:
            break
        if step <= skip_steps:
            continue
        out = module(*(np.ascontiguousarray(a[idx]) for a in arrays))
        loss = float(out[0] if isinstance(out, list) else out)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        module.lazy_reset_grad()
        total += loss * len(idx)
        seen += len(idx)
        if on_step is not None:
            on_step(StepInfo(epoch, step, steps, loss, total / seen, seen / max(clock() - start, 1e-9)))
    return total / seen if seen else float("nan")


def evaluate(module, arrays: Sequence[np.ndarray], batch_size: int, drop_last: bool = False) -> float:
    """Mean eval-model loss over ``arrays`` (batch losses weighted by batch size); leaves the module in eval mode."""
    return evaluate_metrics(module, arrays, batch_size, drop_last)["loss"]


LOSS_PROPERTY = "edgetrain.loss"     # checkpoint property `edgetrain artifacts` records: which loss trains it


def evaluate_metrics(module, arrays: Sequence[np.ndarray], batch_size: int, drop_last: bool = False,
                     loss: str | None = None) -> dict:
    """The eval loss and, when the eval model also outputs the model's predictions (artifacts made with
    ``additional_output_names``, as ``edgetrain artifacts`` makes them), the metrics that fit ``loss``
    (crossentropy: accuracy and top-5 accuracy; bcewithlogits: accuracy at logit 0; mse, l1: MSE and MAE; None:
    told from the labels). Leaves the module in eval mode."""
    module.eval()
    names = module.input_names()
    n = check_arrays(arrays, names)
    total = count = 0.0
    sums: dict[str, float] = {}
    for idx in batches(n, batch_size, None):
        if drop_last and len(idx) < batch_size:
            break
        out = module(*(np.ascontiguousarray(a[idx]) for a in arrays))
        outs = out if isinstance(out, list) else [out]
        total += float(outs[0]) * len(idx)
        count += len(idx)
        if len(outs) > 1:
            for key, value in _batch_metrics(outs[1], arrays[-1][idx], loss).items():
                sums[key] = sums.get(key, 0.0) + value
    metrics = {"loss": total / count if count else float("nan"), "samples": int(count)}
    metrics.update({k: v / count for k, v in sums.items()})
    return metrics


def _batch_metrics(pred: np.ndarray, target: np.ndarray, loss: str | None) -> dict[str, float]:
    """Sums over the batch (divided by the sample count later) of the metrics that fit ``loss`` and ``target``."""
    if target.dtype.kind in "iu" and pred.ndim == target.ndim + 1:          # class labels, class axis 1
        classes = np.moveaxis(pred, 1, -1)
        hits = {"accuracy": (classes.argmax(-1) == target)}
        if classes.shape[-1] > 5:
            top5 = np.argpartition(-classes, 5, axis=-1)[..., :5]
            hits["top5_accuracy"] = (top5 == target[..., None]).any(-1)
        return {k: float(v.reshape(len(target), -1).mean(axis=1).sum()) for k, v in hits.items()}
    if pred.shape != target.shape:
        return {}
    err = (pred.astype(np.float64) - target).reshape(len(target), -1)
    out = {"mse": float((err ** 2).mean(axis=1).sum()), "mae": float(np.abs(err).mean(axis=1).sum())}
    if loss == "bcewithlogits":                                           # logits thresholded at 0
        out["accuracy"] = float(((pred > 0) == (target > 0.5)).reshape(len(target), -1).mean(axis=1).sum())
    return out


MODEL_FILES = ("training_model", "eval_model", "optimizer_model")
MODEL_SUFFIXES = (".onnx", compact.SUFFIX, ".ort")     # the first present wins


def artifact_files(folder) -> dict[str, Path | None]:
    """The artifact files in ``folder`` (``checkpoint`` and each model as .onnx, compact .etm or ORT-format .ort;
    None if absent)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"artifact folder '{folder}' does not exist")
    found: dict[str, Path | None] = {"checkpoint": folder / "checkpoint"}
    for stem in MODEL_FILES:
        found[stem] = next((folder / f"{stem}{s}" for s in MODEL_SUFFIXES if (folder / f"{stem}{s}").exists()), None)
    missing = [name for name in ("checkpoint", "training_model") if not (found[name] and found[name].exists())]
    if missing:
        raise InputError(f"artifact folder '{folder}' has no {' or '.join(missing)} (run `edgetrain artifacts` first)")
    return found


def open_artifacts(folder, checkpoint=None, optimizer: bool = True):
    """(CheckpointState, Module, Optimizer or None) for an artifact folder; ``checkpoint`` overrides its own."""
    from .api import CheckpointState, Module, Optimizer

    files = artifact_files(folder)
    path = checkpoint or files["checkpoint"]
    state = CheckpointState.load_checkpoint(path)
    try:
        module = Module(files["training_model"], state, files["eval_model"])
    except EdgetrainError as e:     # a checkpoint from other artifacts: say which files disagree
        if "checkpoint" not in str(e):
            raise
        raise type(e)(f"checkpoint '{path}' does not fit the training model '{files['training_model']}': {e}") \
            from None
    opt = None
    if optimizer:
        if files["optimizer_model"] is None:
            raise InputError(f"artifact folder '{folder}' has no optimizer model")
        opt = Optimizer(files["optimizer_model"], module)
    return state, module, opt
