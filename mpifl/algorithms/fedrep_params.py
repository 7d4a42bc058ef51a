"""The config part of :mod:`mpifl.algorithms.fedrep` (light: a config command imports it alone)."""

from __future__ import annotations

from dataclasses import dataclass

from mpifl.errors import check


@dataclass
class Params:
    head_epochs: int = 10  # epochs of head training (body frozen) before the body's, per round (paper: 10)

    def validate(self, cfg) -> None:
        check(self.head_epochs >= 0, "head_epochs", self.head_epochs, "must be >= 0")
