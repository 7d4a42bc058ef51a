"""The config part of :mod:`mpifl.algorithms.fedbabu` (light: a config command imports it alone)."""

from __future__ import annotations

from dataclasses import dataclass

from mpifl.errors import check


@dataclass
class Params:
    ft_epochs: int = 5  # fine-tuning epochs (whole model) before evaluation (paper: several tau; PFLlib: 10)

    def validate(self, cfg) -> None:
        check(self.ft_epochs >= 0, "ft_epochs", self.ft_epochs, "must be >= 0")
