"""The config part of :mod:`mpifl.algorithms.fedavgm` (light: a config command imports it alone)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    """Hyper-parameters: the config section ``fedavgm``."""

    lr: float = 1.0  # server learning rate eta_s (1 with momentum 0: FedAvg)
    momentum: float = 0.9  # server momentum beta

    def validate(self, cfg: Config) -> None:
        check(self.lr > 0 and math.isfinite(self.lr), "lr", self.lr, "must be a finite number > 0")
        check(0 <= self.momentum < 1, "momentum", self.momentum, "must be in [0, 1)")
