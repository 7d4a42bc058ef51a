"""Models by name, shapes inferred from the data."""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import ModelConfig


def mlp(in_shape: tuple[int, ...], n_classes: int, hidden: list[int]) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(in_shape)
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, n_classes))
    return nn.Sequential(*layers)


def build(cfg: ModelConfig, in_shape: tuple[int, ...], n_classes: int, seed: int) -> nn.Module:
    """Same seed -> same initial weights on every rank (one shared init)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if cfg.name == "mlp":
            return mlp(in_shape, n_classes, cfg.hidden)
    raise ValueError(cfg.name)  # config validation names the choices


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
