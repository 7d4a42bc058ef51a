"""The config part of :mod:`mpifl.algorithms.ditto` (light: a config command imports it alone)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    lam: float = 0.75  # pull lam of (lam/2)||v_k - w||^2 toward the global model (DPFL F.6: 0.75)
    personal_epochs: int = 0  # local epochs of the personal model per round; 0 = train.local_epochs

    def validate(self, cfg) -> None:
        check(self.lam >= 0 and math.isfinite(self.lam), "lam", self.lam, "must be a finite number >= 0")
        check(self.personal_epochs >= 0, "personal_epochs", self.personal_epochs,
              "must be >= 0 (0 = train.local_epochs)")


def held_rows(cfg: Config) -> int:
    """Parameter rows a client holds beyond its model and optimizer state: its personal model v_k and that
    model's optimizer state (``mpifl.run.memory`` adds them to the estimate a run is checked against at
    start)."""
    return 1 + cfg.train.state_rows
