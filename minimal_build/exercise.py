"""Run an artifact folder once: a training step, an optimizer step, a second training step and an eval step.

The build runs it under the JIT to record what to compile (``record.py``), and again in the trimmed package, in
a process that cannot import numba or onnx, to check the result (``runtime.check_training``). So this module
imports only numpy and edgetrain's public API (``api``, ``compact``, ``errors``, ``budget``; absolute imports:
its source also runs outside this package).

Inputs are synthetic: random floats, zeros for integer inputs (in range as labels and token ids). Their shapes
are either the ones a run fed (``feeds``: what the automatic build got from the process that trained, checked
here as data) or, without them, the declared ones with each symbolic dim named by a plain identifier set to a
batch size; a dim that is an expression of others (labels [N*T]) cannot be guessed, and is refused by name.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

MODEL_STEMS = ("training_model", "eval_model", "optimizer_model")
MODELS = {"train": True, "eval": False}     # a feeds mapping's keys -> Module.train(mode)
DTYPES = ("bool", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
          "uint64")
MAX_SETS = 8                 # shape sets per model a feeds mapping may hold
MAX_DIM = 1 << 31
MAX_FEED_BYTES = 1 << 31     # per shape set: what the build allocates for one step's inputs


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
    from edgetrain.compact import load_graph

    graph = load_graph(artifact_files(folder)["training_model"])
    return any(isinstance(d, str) for v in graph.inputs for d in (v.type.shape if v.type else ()))


def check_feeds(feeds, where: str) -> dict[str, list[dict[str, tuple[tuple[int, ...], str]]]]:
    """``feeds`` (JSON data: ``{"train"|"eval": [{input name: [shape, dtype name]}, ...]}``) checked, with shapes
    as tuples; an error names ``where`` and the entry."""
    from edgetrain import budget
    from edgetrain.errors import EdgetrainError

    def refuse(what):
        raise EdgetrainError(f"input shapes for {where}: {what}")
    if not isinstance(feeds, dict):
        refuse("not a mapping")
    checked = {}
    for model, sets in feeds.items():
        if model not in MODELS:
            refuse(f"unknown model {model!r} (expected {', '.join(MODELS)})")
        if not isinstance(sets, list) or len(sets) > MAX_SETS:
            refuse(f"{model}: not a list of at most {MAX_SETS} shape sets")
        checked[model] = []
        for k, inputs in enumerate(sets):
            if not isinstance(inputs, dict) or not inputs:
                refuse(f"{model} set {k}: not a mapping of input names")
            one, nbytes = {}, 0
            for name, entry in inputs.items():
                ok = (isinstance(name, str) and isinstance(entry, list) and len(entry) == 2
                      and isinstance(entry[0], list) and entry[1] in DTYPES
                      and all(type(d) is int and 0 <= d <= MAX_DIM for d in entry[0]))
                if not ok:
                    refuse(f"{model} set {k} input {name!r}: not [[dims 0..{MAX_DIM}], one of {', '.join(DTYPES)}]")
                shape = tuple(entry[0])
                nbytes += int(np.prod(shape, dtype=np.float64)) * np.dtype(entry[1]).itemsize
                one[name] = (shape, entry[1])
            if nbytes > MAX_FEED_BYTES:
                refuse(f"{model} set {k}: {nbytes} bytes of inputs, more than {MAX_FEED_BYTES}")
            budget.check(nbytes, budget.resolve(None), f"input shapes for {where}: {model} set {k}'s inputs")
            checked[model].append(one)
    return checked


def batch_dim(d) -> bool:
    """Whether a declared dim takes the batch size when no shapes are known: a symbolic one that is a name (or
    unnamed), not an expression such as ``64*N``."""
    return d is None or (isinstance(d, str) and d.replace(".", "_").isidentifier())


def synthetic_shape(value, batch: int, model: str) -> tuple[int, ...]:
    """``value``'s declared shape with ``batch`` for its symbolic dims (``model``: "training" or "eval")."""
    from edgetrain.errors import EdgetrainError

    t = value.type
    for k, d in enumerate(t.shape):
        if not isinstance(d, int) and not batch_dim(d):
            raise EdgetrainError(f"{model} model input '{value.name}' has dim {k} = '{d}', which a batch size cannot "
                                 "give: train from the folder once instead (the automatic warm set is built with "
                                 "the input shapes the run fed)")
    return tuple(d if isinstance(d, int) else batch for d in t.shape)


def synthetic(shape, dtype, rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    return np.zeros(shape, dtype)


def exercise(folder, batch: int = 1, feeds=None) -> set[tuple[str, str]]:
    """Run the folder's models once: at ``batch`` (symbolic dims), or with each shape set of ``feeds``
    (``check_feeds``'s result: the eval model runs only with the shapes it was fed, if any); returns the
    (domain, op_type) of their nodes."""
    from edgetrain.api import CheckpointState, Module, Optimizer
    from edgetrain.compact import load_graph
    from edgetrain.errors import EdgetrainError

    files = artifact_files(folder)
    state = CheckpointState.load_checkpoint(files["checkpoint"])
    module = Module(files["training_model"], state, files.get("eval_model"))
    optimizer = Optimizer(files["optimizer_model"], module)
    rng = np.random.default_rng(0)
    if feeds is None:
        runs = [(model, None) for model, training in MODELS.items() if training or "eval_model" in files]
        at = f"at batch size {batch}"
    else:
        runs = [(model, shapes) for model in MODELS for shapes in feeds.get(model, [])]   # training first
        at = "with the input shapes a run fed"
    try:
        for model, shapes in runs:
            training = MODELS[model]
            module.train(training)
            inputs = {v.name: v for v in module.graph().inputs}
            if shapes is None:
                name = "training" if training else "eval"
                shapes = {n: (synthetic_shape(inputs[n], batch, name), inputs[n].type.dtype)
                          for n in module.input_names()}
            elif set(shapes) != set(module.input_names()):
                raise EdgetrainError(f"the {'training' if training else 'eval'} model's inputs are "
                                     f"{module.input_names()}, the shapes name {sorted(shapes)}")
            feed = [synthetic(*shapes[n], rng) for n in module.input_names()]
            module(*feed)
            if training:
                optimizer.step()
                module.lazy_reset_grad()
                module(*feed)
    except EdgetrainError as e:
        raise type(e)(f"artifacts {folder} {at}: {e}") from None
    return {(n.domain, n.op_type) for stem in MODEL_STEMS if stem in files for n in load_graph(files[stem]).nodes}
