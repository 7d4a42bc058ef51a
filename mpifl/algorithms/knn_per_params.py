"""The config part of :mod:`mpifl.algorithms.knn_per` (light: a config command imports it alone)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    """Hyper-parameters: the config section ``knn_per``."""

    k: int = 10  # neighbours of a query in the client's datastore (DPFL F.6)
    lam: float = 0.5  # weight of the kNN prediction in the interpolation (DPFL F.6)
    temperature: float = 1.0  # kernel exp(-d^2 / temperature) over the neighbours

    def validate(self, cfg: Config) -> None:
        check(1 <= self.k <= 10_000, "k", self.k, "must be in [1, 10000]")
        check(0 <= self.lam <= 1, "lam", self.lam, "must be in [0, 1]")
        check(self.temperature > 0 and math.isfinite(self.temperature), "temperature", self.temperature,
              "must be a finite number > 0")
