"""The config part of :mod:`mpifl.algorithms.fedyogi` (light: a config command imports it alone)."""

from __future__ import annotations

from dataclasses import dataclass

from mpifl.algorithms.shared_params import AdaptiveParams


@dataclass
class Params(AdaptiveParams):
    """Hyper-parameters: the config section ``fedyogi``: FedAdam's keys, defaults and
    ranges (Yogi changes how v moves, not what it needs)."""

    # Yogi's v moves by (1 - beta2) Delta^2 toward Delta^2 each round (paper: 0.99)
    beta2: float = 0.99
