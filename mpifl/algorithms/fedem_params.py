"""The config part of :mod:`mpifl.algorithms.fedem` (light: a config command imports it alone)."""

from __future__ import annotations

from dataclasses import dataclass

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    """Hyper-parameters: the config section ``fedem``."""

    components: int = 4  # M shared component models (FedeRiCo ran FedEM with 4)

    def validate(self, cfg: Config) -> None:
        check(1 <= self.components <= 64, "components", self.components, "must be in [1, 64]")
