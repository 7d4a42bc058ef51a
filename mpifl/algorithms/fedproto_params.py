"""The config part of :mod:`mpifl.algorithms.fedproto` (light: a config command imports it alone)."""

from __future__ import annotations

from dataclasses import dataclass

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    """Hyper-parameters: the config section ``fedproto``."""

    lam: float = 1.0  # weight of the prototype distance term (the authors' default)

    def validate(self, cfg: Config) -> None:
        check(0 <= self.lam < float("inf"), "lam", self.lam, "must be a finite number >= 0")
