"""The config part of :mod:`mpifl.algorithms.lg_fedavg` (light: a config command imports it alone)."""

from __future__ import annotations

from dataclasses import dataclass

from mpifl.errors import check


@dataclass
class Params:
    global_layers: int = 1  # last layers averaged (1: the classifier, as PFLlib's; all the model's: FedAvg)

    def validate(self, cfg) -> None:
        check(self.global_layers >= 1, "global_layers", self.global_layers, "must be >= 1")
