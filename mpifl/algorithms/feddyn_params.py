"""The config part of :mod:`mpifl.algorithms.feddyn` (light: a config command imports it alone)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    alpha: float = 0.01  # regulariser weight alpha (paper: tuned in {0.1, 0.01, 0.001}; 0 = FedAvg)

    def validate(self, cfg: Config) -> None:
        check(self.alpha >= 0 and math.isfinite(self.alpha), "alpha", self.alpha, "must be a finite number >= 0")
