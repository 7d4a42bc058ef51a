"""The config part of :mod:`mpifl.algorithms.fedprox` (light: a config command imports it alone)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    mu: float = 0.1  # proximal weight mu of (mu/2)||w - w_global||^2 (DPFL F.6: 0.1)

    def validate(self, cfg: Config) -> None:
        check(self.mu >= 0 and math.isfinite(self.mu), "mu", self.mu, "must be a finite number >= 0")
