"""The config part of :mod:`mpifl.algorithms.perfedavg` (light: a config command imports it alone)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    """Hyper-parameters: the config section ``perfedavg``."""

    variant: Literal["fo", "hf"] = "fo"  # first-order MAML, or Hessian-free (finite-difference HVP)
    alpha: float = 0.01  # inner (personalisation) step size (DPFL appendix F.6)
    beta: float = 0.0  # outer step size; 0 = train.lr (PFLlib's choice)
    delta: float = 0.001  # hf: finite-difference step of the Hessian-vector product

    def validate(self, cfg: Config) -> None:
        check(0 < self.alpha < math.inf, "alpha", self.alpha, "must be a finite number > 0")
        check(0 <= self.beta < math.inf, "beta", self.beta, "must be a finite number >= 0 (0 = train.lr)")
        check(0 < self.delta < math.inf, "delta", self.delta, "must be a finite number > 0")
