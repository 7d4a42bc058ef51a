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


def held_rows(cfg: Config) -> int:
    """Parameter rows a client holds beyond its model and optimizer state: its last local gradient (FedDyn's
    linear term) (``mpifl.run.memory`` adds it to the estimate a run is checked against at start)."""
    return 1
