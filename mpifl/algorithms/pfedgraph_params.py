"""The config part of :mod:`mpifl.algorithms.pfedgraph` (light: a config command imports it alone)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    """Hyper-parameters: the config section ``pfedgraph``."""

    alpha: float = 0.8  # weight of ||A_i - p||^2 in the graph objective (authors' code: 0.8)
    lam: float = 0.01  # weight of the similarity regulariser in local training (authors' code: 0.01)

    def validate(self, cfg: Config) -> None:
        check(self.alpha > 0 and math.isfinite(self.alpha), "alpha", self.alpha,
              "must be a finite number > 0")
        check(self.lam >= 0 and math.isfinite(self.lam), "lam", self.lam, "must be a finite number >= 0")


def held_rows(cfg: Config) -> int:
    """Parameter rows a client holds beyond its model and optimizer state: its regulariser's direction c_i
    (``mpifl.run.memory`` adds it to the estimate a run is checked against at start)."""
    return 1
