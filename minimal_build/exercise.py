"""Run an artifact folder once: a training step, an optimizer step, a second training step and an eval step.

The build runs it under the JIT to record what to compile (``record.py``), and again in the trimmed package, in
a process that cannot import numba or onnx, to check the result (``runtime.check_training``). So this module
imports only numpy and ``edgetrain.api`` (absolute imports: its source also runs outside this package).

Inputs are synthetic: random floats, zeros for integer inputs (in range as labels and token ids).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

MODEL_STEMS = ("training_model", "eval_model", "optimizer_model")


def artifact_files(folder) -> dict[str, Path]:
    """``{"training_model": path, ..., "checkpoint": path}``; an eval model is optional, the rest required."""
    from edgetrain.errors import EdgetrainError

    folder = Path(folder)
    found: dict[str, Path] = {}
    for stem in MODEL_STEMS:
        matches = sorted(p for p in folder.glob(f"{stem}.*") if p.is_file())
        if len(matches) > 1:
            raise EdgetrainError(f"artifact folder {folder} holds {len(matches)} {stem} files "
                                 f"({', '.join(p.name for p in matches)}); keep one")
        if matches:
            found[stem] = matches[0]
    if (folder / "checkpoint").is_file():
        found["checkpoint"] = folder / "checkpoint"
    missing = [k for k in ("training_model", "optimizer_model", "checkpoint") if k not in found]
    if missing:
        raise EdgetrainError(f"artifact folder {folder} has no {', '.join(missing)}: the trimmed runtime is built "
                             "from training artifacts (training_model, optimizer_model, checkpoint, eval_model)")
    return found


def has_symbolic_dims(folder) -> bool:
    from edgetrain.api import _load

    graph = _load(artifact_files(folder)["training_model"])
    return any(isinstance(d, str) for v in graph.inputs for d in (v.type.shape if v.type else ()))


def synthetic(value, batch: int, rng: np.random.Generator) -> np.ndarray:
    t = value.type
    shape = tuple(d if isinstance(d, int) else batch for d in t.shape)
    if np.issubdtype(t.dtype, np.floating):
        return rng.standard_normal(shape).astype(t.dtype)
    return np.zeros(shape, t.dtype)


def exercise(folder, batch: int) -> set[tuple[str, str]]:
    """Run the folder's models once at ``batch`` (symbolic dims); returns the (domain, op_type) of their nodes."""
    from edgetrain.api import CheckpointState, Module, Optimizer, _load
    from edgetrain.errors import EdgetrainError

    files = artifact_files(folder)
    state = CheckpointState.load_checkpoint(files["checkpoint"])
    module = Module(files["training_model"], state, files.get("eval_model"))
    optimizer = Optimizer(files["optimizer_model"], module)
    rng = np.random.default_rng(0)
    try:
        for training in ((True, False) if "eval_model" in files else (True,)):
            module.train(training)
            inputs = {v.name: v for v in module.graph().inputs}
            feeds = [synthetic(inputs[n], batch, rng) for n in module.input_names()]
            module(*feeds)
            if training:
                optimizer.step()
                module.lazy_reset_grad()
                module(*feeds)
    except EdgetrainError as e:
        raise type(e)(f"artifacts {folder} at batch size {batch}: {e}") from None
    return {(n.domain, n.op_type) for stem in MODEL_STEMS if stem in files for n in _load(files[stem]).nodes}
