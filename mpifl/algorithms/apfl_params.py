"""The config part of :mod:`mpifl.algorithms.apfl` (light: a config command imports it alone)."""

from __future__ import annotations

from dataclasses import dataclass

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    """Hyper-parameters: the config section ``apfl``."""

    alpha: float = 0.5  # initial mixing weight alpha_i of the local model (authors' code: 0.5)
    adaptive: bool = True  # learn alpha_i by its gradient (the paper's adaptive APFL); false: fixed

    def validate(self, cfg: Config) -> None:
        check(0 <= self.alpha <= 1, "alpha", self.alpha, "must be in [0, 1]")


def held_rows(cfg: Config) -> int:
    """Parameter rows a client holds beyond its model and optimizer state: its local model v_i and that
    model's optimizer state (``mpifl.run.memory`` adds them to the estimate a run is checked against at
    start)."""
    return 1 + cfg.train.state_rows
