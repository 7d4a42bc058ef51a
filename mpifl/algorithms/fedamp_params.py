"""The config part of :mod:`mpifl.algorithms.fedamp` (light: a config command imports it alone)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    alpha: float = 1.0  # step alpha_k on the attention term (PFLlib's -alk; the paper tunes it)
    lam: float = 1.0  # weight lam of the attention term; prox weight lam/alpha (PFLlib's -lam; 0 = local)
    # distance scale of A(x) = 1 - exp(-x/sigma) (the paper tunes it; PFLlib's -sg 1 makes
    # xi_ii < 0 on close models: 100 keeps xi_ii >= 0 at zero distance up to 101 clients a round)
    sigma: float = 100.0

    def validate(self, cfg: Config) -> None:
        check(self.alpha > 0 and math.isfinite(self.alpha), "alpha", self.alpha, "must be a finite number > 0")
        check(self.lam >= 0 and math.isfinite(self.lam), "lam", self.lam, "must be a finite number >= 0")
        check(self.sigma > 0 and math.isfinite(self.sigma), "sigma", self.sigma, "must be a finite number > 0")
