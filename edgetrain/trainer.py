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
from .errors import InputError


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


def batches(n: int, batch_size: int, rng: np.random.Generator | None) -> Iterator[np.ndarray]:
    """Sample indices per batch: a permutation drawn from ``rng``, or in order when ``rng`` is None."""
    if batch_size < 1:
        raise InputError(f"batch size must be >= 1, got {batch_size}")
    order = rng.permutation(n) if rng is not None else np.arange(n)
    for start in range(0, n, batch_size):
        yield order[start:start + batch_size]


def train_epoch(module, optimizer, arrays: Sequence[np.ndarray], batch_size: int, epoch: int = 0,
                rng: np.random.Generator | None = None, scheduler=None, skip_steps: int = 0,
                on_step: Callable[[StepInfo], None] | None = None) -> float:
    """One pass over ``arrays``: forward+backward, optimizer step, scheduler step, gradient reset per batch.

    ``skip_steps`` batches are drawn but not run (resuming mid-epoch with the same ``rng`` state).
    Returns the mean loss of the steps run, weighted by batch size.
    """
    n = check_arrays(arrays, module.input_names())
    module.train()
    steps = -(-n // batch_size)
    total = seen = 0.0
    start = time.perf_counter()
    for step, idx in enumerate(batches(n, batch_size, rng), 1):
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
            on_step(StepInfo(epoch, step, steps, loss, total / seen, seen / (time.perf_counter() - start)))
    return total / seen if seen else float("nan")


def evaluate(module, arrays: Sequence[np.ndarray], batch_size: int) -> float:
    """Mean eval-model loss over ``arrays`` (batch losses weighted by batch size); leaves the module in eval mode."""
    module.eval()
    n = check_arrays(arrays, module.input_names())
    total = 0.0
    for idx in batches(n, batch_size, None):
        out = module(*(np.ascontiguousarray(a[idx]) for a in arrays))
        total += float(out[0] if isinstance(out, list) else out) * len(idx)
    return total / n


MODEL_FILES = ("training_model", "eval_model", "optimizer_model")
MODEL_SUFFIXES = (".onnx", compact.SUFFIX)


def artifact_files(folder) -> dict[str, Path | None]:
    """The artifact files in ``folder`` (``checkpoint`` and each model as .onnx or compact .etm; None if absent)."""
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
    state = CheckpointState.load_checkpoint(checkpoint or files["checkpoint"])
    module = Module(files["training_model"], state, files["eval_model"])
    opt = None
    if optimizer:
        if files["optimizer_model"] is None:
            raise InputError(f"artifact folder '{folder}' has no optimizer model")
        opt = Optimizer(files["optimizer_model"], module)
    return state, module, opt
