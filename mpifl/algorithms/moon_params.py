"""The config part of :mod:`mpifl.algorithms.moon` (light: a config command imports it alone)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    mu: float = 1.0  # weight of the contrastive term (paper: 1 on CIFAR-100/Tiny-ImageNet, 5 on CIFAR-10; 0 = FedAvg)
    tau: float = 0.5  # temperature of the contrastive term (paper: 0.5)

    def validate(self, cfg: Config) -> None:
        check(self.mu >= 0 and math.isfinite(self.mu), "mu", self.mu, "must be a finite number >= 0")
        check(self.tau > 0 and math.isfinite(self.tau), "tau", self.tau, "must be a finite number > 0")


def held_rows(cfg: Config) -> int:
    """Parameter rows a client holds beyond its model and optimizer state: its previous local model (the
    contrastive term's negative) (``mpifl.run.memory`` adds it to the estimate a run is checked against at
    start)."""
    return 1
