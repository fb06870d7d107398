"""Small models for 8x8 digits."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError

MODELS = ("mlp", "cnn")


def build(name: str, seed: int = 0) -> nn.Module:
    """The same initial weights on every worker (seeded).

    >>> sum(p.numel() for p in build("mlp").parameters())
    9610
    """
    torch.manual_seed(seed)
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                             nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))
    raise ConfigError(f"unknown model {name!r}: expected one of {', '.join(MODELS)}")
