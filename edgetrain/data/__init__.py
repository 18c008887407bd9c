"""Data shipped inside the package: the demo's digits MLP and scikit-learn's 8x8 digits images.

``digits.npz`` holds the 1,797 images (uint8 pixels 0..16) and labels of scikit-learn's copy of the UCI optical
handwritten digits test set (E. Alpaydin, C. Kaynak, 1998; CC BY 4.0), taken from scikit-learn's
``datasets/data/digits.csv.gz``. scikit-learn itself is not a dependency.
"""
from __future__ import annotations

from importlib import resources

import numpy as np


def digits() -> tuple[np.ndarray, np.ndarray]:
    """(images float32 [1797, 64] scaled to [0, 1], labels int64 [1797])."""
    with resources.files(__name__).joinpath("digits.npz").open("rb") as f, np.load(f) as z:
        return z["images"].astype(np.float32) / 16.0, z["labels"].astype(np.int64)


def digits_split(test_fraction: float = 0.2, seed: int = 0):
    """A seeded shuffle split: ((x_train, y_train), (x_test, y_test)); 0.2 gives 1,437 / 360 as the reference."""
    x, y = digits()
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(np.ceil(test_fraction * len(y)))
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def digits_model() -> bytes:
    """The forward-only digits MLP (64-32-10 ReLU, dynamic batch axis ``N``) as ONNX bytes."""
    return resources.files(__name__).joinpath("digits_mlp.onnx").read_bytes()
