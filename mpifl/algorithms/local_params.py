"""The config part of :mod:`mpifl.algorithms.local` (light: a config command imports it alone)."""

from __future__ import annotations

from dataclasses import dataclass

from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    # train only the clients sampled each round (algorithm.fraction), as FL-bench's Local-only
    # baseline does; false: every client every round
    sampled_only: bool = False

    def validate(self, cfg: Config) -> None:
        pass  # a bool: its type was checked while building
