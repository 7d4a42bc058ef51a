"""The config part of :mod:`mpifl.algorithms.fedper` (light: a config command imports it alone)."""

from __future__ import annotations

from dataclasses import dataclass

from mpifl.errors import check


@dataclass
class Params:
    personal_layers: int = 1  # last layers kept by each client (K_P; 1: the classifier, as PFLlib's; 0 = FedAvg)

    def validate(self, cfg) -> None:
        check(self.personal_layers >= 0, "personal_layers", self.personal_layers, "must be >= 0 (0 = FedAvg)")
