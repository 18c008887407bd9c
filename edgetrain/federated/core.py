"""Federated learning's numbers without Flower: data partitions, one node's local training and the global model.

Flower (``edgetrain.federated.apps``) only moves what these produce; everything here is numpy and
``edgetrain.api``, so it is tested in process and reused by the tests' own numpy FedAvg.

Parameters travel as ONE flat float buffer, the trainable parameters in the training model's order
(``Module.get_contiguous_parameters(trainable_only=True)``, a copy); a node loads one with
``Module.copy_buffer_to_parameters``. Nothing loops over tensors in Python.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import atomic
from ..api import CheckpointState
from ..errors import InputError
from ..trainer import LOSS_PROPERTY, evaluate_metrics, open_artifacts, train_epoch

ROUND_PROPERTY = "edgetrain.federated.round"     # checkpoint property: the last round folded into this model
PARAMETERS_KEY = "parameters"                    # the one Array a reply's ArrayRecord holds


def dirichlet_partition(labels: np.ndarray, num_partitions: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Sample indices of each of ``num_partitions`` non-IID partitions: every label's samples are split by
    proportions drawn from Dirichlet(``alpha``) (small alpha: each node sees few labels). Deterministic in
    ``seed``; partitions are disjoint and cover every sample; none is left empty."""
    if num_partitions < 1:
        raise InputError(f"num-partitions must be >= 1, got {num_partitions}")
    if not alpha > 0:
        raise InputError(f"dirichlet-alpha must be > 0, got {alpha}")
    if len(labels) < num_partitions:
        raise InputError(f"{len(labels)} samples cannot fill {num_partitions} partitions")
    rng = np.random.default_rng([seed, num_partitions])
    parts: list[list[np.ndarray]] = [[] for _ in range(num_partitions)]
    for label in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == label))
        cuts = (np.cumsum(rng.dirichlet(np.full(num_partitions, alpha)))[:-1] * len(idx)).astype(np.int64)
        for p, chunk in enumerate(np.split(idx, cuts)):
            parts[p].append(chunk)
    out = [np.sort(np.concatenate(p)) for p in parts]
    # a node with no data cannot report a weight: give it one sample from the largest partition
    for p in range(num_partitions):
        if out[p].size == 0:
            big = max(range(num_partitions), key=lambda q: out[q].size)
            out[p], out[big] = out[big][:1], out[big][1:]
    return out


def digits_partition(partition_id: int, num_partitions: int, alpha: float, seed: int):
    """This node's share of the bundled digits: (train arrays, test arrays), each ``[images, labels]``; the
    test split is partitioned with the same Dirichlet draw, so a node's test labels follow its train labels."""
    from ..data import digits_split

    if not 0 <= partition_id < num_partitions:
        raise InputError(f"partition-id {partition_id} is outside 0..{num_partitions - 1}")
    (x_tr, y_tr), (x_te, y_te) = digits_split(seed=seed)
    tr = dirichlet_partition(y_tr, num_partitions, alpha, seed)[partition_id]
    te = dirichlet_partition(y_te, num_partitions, alpha, seed)[partition_id]
    return [x_tr[tr], y_tr[tr]], [x_te[te], y_te[te]]


def load_npz(path, names: list[str]) -> list[np.ndarray]:
    """Arrays named after the model's inputs from an ``.npz`` (no pickles)."""
    with np.load(os.fspath(path), allow_pickle=False) as z:
        missing = [n for n in names if n not in z.files]
        if missing:
            raise InputError(f"data file '{path}' has no array(s) {missing} (it holds {sorted(z.files)}; the "
                             f"model takes {names})")
        return [z[n] for n in names]


def check_parameters(values: np.ndarray, size: int, dtype: np.dtype) -> str | None:
    """Why ``values`` cannot be a parameter buffer of ``size`` elements of ``dtype``; None when it can."""
    if values.dtype != dtype:
        return f"dtype {values.dtype}, expected {np.dtype(dtype)}"
    if values.ndim != 1 or values.size != size:
        return f"shape {list(values.shape)}, expected [{size}]"
    bad = np.size(values) - int(np.count_nonzero(np.isfinite(values)))
    if bad:
        return f"{bad} non-finite value(s) (NaN or inf)"
    return None


@dataclass
class LocalResult:
    parameters: np.ndarray        # the new flat buffer (a copy)
    num_examples: int             # samples seen per epoch: FedAvg's weight
    loss: float                   # mean training loss of the last local epoch
    metrics: dict                 # eval metrics on the node's test data, when it has some


class LocalNode:
    """One node: the training artifacts and its local data. ``train`` starts from the parameters it is sent."""

    def __init__(self, artifacts_dir, train_arrays, test_arrays=None):
        self.state, self.module, self.optimizer = open_artifacts(artifacts_dir)
        self.train_arrays, self.test_arrays = list(train_arrays), test_arrays
        self.size = self.module.get_parameters_size(trainable_only=True)
        self.dtype = np.dtype(self.module.get_contiguous_parameters(trainable_only=True).dtype)
        self.loss_kind = dict(self.state.properties).get(LOSS_PROPERTY)

    def load(self, parameters: np.ndarray) -> None:
        reason = check_parameters(parameters, self.size, self.dtype)
        if reason is not None:
            raise InputError(f"received parameters rejected: {reason}")
        self.module.copy_buffer_to_parameters(parameters, trainable_only=True)

    def train(self, parameters: np.ndarray, epochs: int, batch_size: int, learning_rate: float | None = None,
              seed: int = 0, server_round: int = 0, node_seed: int = 0, proximal_mu: float = 0.0) -> LocalResult:
        """``epochs`` local epochs from ``parameters``. FedProx (``proximal_mu`` > 0): after each optimizer step
        the parameters take the proximal step w <- (w + lr mu w_global) / (1 + lr mu), the closed-form minimiser
        of mu/2 |w - w_global|^2 plus the distance to the step's result (a decoupled proximal term: the loss
        graph stays the artifacts')."""
        self.load(parameters)
        if learning_rate is not None and learning_rate > 0:
            self.optimizer.set_learning_rate(learning_rate)
        scheduler = None
        if proximal_mu > 0:
            scheduler = _Proximal(self.module, parameters, self.optimizer.get_learning_rate() * proximal_mu)
        loss = float("nan")
        for epoch in range(epochs):
            rng = np.random.default_rng([seed, node_seed, server_round, epoch])
            loss = train_epoch(self.module, self.optimizer, self.train_arrays, batch_size, epoch, rng,
                               scheduler=scheduler)
        new = np.asarray(self.module.get_contiguous_parameters(trainable_only=True).numpy())
        metrics = self.evaluate_local(batch_size) if self.test_arrays is not None else {}
        return LocalResult(new, len(self.train_arrays[-1]), loss, metrics)

    def evaluate(self, parameters: np.ndarray, batch_size: int) -> dict:
        self.load(parameters)
        return self.evaluate_local(batch_size)

    def evaluate_local(self, batch_size: int) -> dict:
        return evaluate_metrics(self.module, self.test_arrays, batch_size, loss=self.loss_kind)


class _Proximal:
    """A scheduler-shaped hook (``train_epoch`` calls ``step()`` after each optimizer step) pulling the live
    parameter view toward the global ones."""

    def __init__(self, module, global_parameters: np.ndarray, lr_mu: float):
        self.view = module.get_contiguous_parameters(trainable_only=True, copy=False)
        self.anchor = np.array(global_parameters, dtype=self.view.dtype)
        self.lr_mu = lr_mu

    def step(self) -> None:
        self.view += self.lr_mu * self.anchor
        self.view /= 1.0 + self.lr_mu


class GlobalModel:
    """The server's model: starts from the artifacts' checkpoint, or from ``checkpoint`` when it exists and
    ``resume`` is set (then ``round`` is the last round it holds). ``save`` writes ORT's checkpoint format
    atomically (``edgetrain.atomic``), the round number in its properties, so a restart resumes after it."""

    def __init__(self, artifacts_dir, checkpoint, resume: bool = True):
        self.checkpoint = Path(checkpoint)
        use = self.checkpoint if resume and self.checkpoint.exists() else None
        self.state, self.module, _ = open_artifacts(artifacts_dir, checkpoint=use, optimizer=False)
        self.round = int(self.state.properties[ROUND_PROPERTY]) if use and ROUND_PROPERTY in self.state.properties \
            else 0
        self.size = self.module.get_parameters_size(trainable_only=True)
        self.dtype = np.dtype(self.module.get_contiguous_parameters(trainable_only=True).dtype)
        self.loss_kind = dict(self.state.properties).get(LOSS_PROPERTY)

    def parameters(self) -> np.ndarray:
        return np.asarray(self.module.get_contiguous_parameters(trainable_only=True).numpy())

    def update(self, parameters: np.ndarray) -> None:
        reason = check_parameters(parameters, self.size, self.dtype)
        if reason is not None:
            raise InputError(f"aggregated parameters rejected: {reason}")
        self.module.copy_buffer_to_parameters(parameters, trainable_only=True)

    def save(self, server_round: int) -> None:
        self.state.properties[ROUND_PROPERTY] = int(server_round)
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        CheckpointState.save_checkpoint(self.state, self.checkpoint)
        self.round = server_round

    def evaluate(self, arrays, batch_size: int = 512) -> dict:
        return evaluate_metrics(self.module, arrays, batch_size, loss=self.loss_kind)


def append_history(path, record: dict) -> None:
    """One JSON line per round in ``path`` (rewritten whole and atomically, so a kill never leaves half a line)."""
    path = Path(path)
    old = path.read_text() if path.exists() else ""
    atomic.write_text(path, old + json.dumps(record, sort_keys=True) + "\n")


def read_history(path) -> list[dict]:
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def make_digits_artifacts(folder) -> Path:
    """Training artifacts of the bundled digits MLP (cross-entropy, AdamW; the eval step also returns the logits,
    so evaluation reports accuracy) in ``folder``."""
    from .. import artifacts
    from ..data import digits_model

    folder = Path(folder)
    artifacts.generate_artifacts(digits_model(), requires_grad=["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
                                 loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
                                 artifact_directory=folder, additional_output_names=["output"])
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    state.properties[LOSS_PROPERTY] = "crossentropy"
    CheckpointState.save_checkpoint(state, folder / "checkpoint")
    return folder
