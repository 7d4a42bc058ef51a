"""The config part of :mod:`mpifl.algorithms.pfedme` (light: a config command imports it alone)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    lam: float = 15.0  # lam of the Moreau envelope (paper's MNIST: 15; 0 = no pull, see the docstring)
    K: int = 5  # inner steps solving theta_i per batch (paper: 5)
    personal_lr: float = 0.1  # inner step size eta_p (authors' MNIST command: 0.1)
    beta: float = 1.0  # server mixing beta (paper: 1; beta = 1 takes the average itself)
    all_train: bool = True  # every client updates each round (the paper's); false: only the sampled (PFLlib)

    def validate(self, cfg: Config) -> None:
        check(self.lam >= 0 and math.isfinite(self.lam), "lam", self.lam, "must be a finite number >= 0")
        # K multiplies every batch's work and no epoch count sees it (the run-time estimate
        # reads *epochs keys): bounded here, so 10^18 is refused rather than run forever
        check(1 <= self.K <= 1000, "K", self.K, "must be an integer in [1, 1000]")
        check(self.personal_lr > 0 and math.isfinite(self.personal_lr), "personal_lr", self.personal_lr,
              "must be a finite number > 0")
        check(self.beta > 0 and math.isfinite(self.beta), "beta", self.beta, "must be a finite number > 0")


def held_rows(cfg: Config) -> int:
    """Parameter rows a client holds beyond its model and optimizer state: its personalized model theta_i
    (``mpifl.run.memory`` adds it to the estimate a run is checked against at start)."""
    return 1
