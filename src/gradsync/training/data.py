"""The handwritten digits data set that ships inside scikit-learn (nothing is downloaded)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Split:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def digits(seed: int = 0, test_fraction: float = 0.2) -> Split:
    """8x8 digit images scaled to [0, 1], split into train and test the same way on every worker.

    >>> s = digits()
    >>> tuple(s.x_train.shape), tuple(s.x_test.shape)
    ((1438, 1, 8, 8), (359, 1, 8, 8))
    """
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(data.target, dtype=torch.long)
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(round(len(y) * (1 - test_fraction)))
    train, test = order[:cut], order[cut:]
    return Split(x[train], y[train], x[test], y[test])


def batches(n: int, batch_size: int, epoch: int, seed: int = 0) -> list[np.ndarray]:
    """The global batches of one epoch, in an order every worker computes alike."""
    order = np.random.default_rng(seed * 100_003 + epoch).permutation(n)
    return [order[i:i + batch_size] for i in range(0, n - batch_size + 1, batch_size)]


def shard(batch: np.ndarray, rank: int, workers: int) -> np.ndarray:
    """This worker's part of a global batch (every worker gets a near-equal share)."""
    return batch[rank::workers]
