"""The config part of :mod:`mpifl.algorithms.cfl` (light: a config command imports it alone)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    """Hyper-parameters: the config section ``cfl``."""

    eps1: float = 0.4  # split only if the cluster's mean update norm is below this (reference code: 0.4)
    eps2: float = 1.6  # ... and its largest client update norm above this (reference code: 1.6)
    warmup_rounds: int = 20  # no split before this round (reference code: after round 20)
    min_size: int = 2  # only clusters with more members than this split (reference code: 2)
    # single: the paper's optimal bipartition (exact); complete: its reference code's heuristic
    linkage: Literal["single", "complete"] = "single"

    def validate(self, cfg: Config) -> None:
        check(self.eps1 > 0 and np.isfinite(self.eps1), "eps1", self.eps1, "must be a finite number > 0")
        check(self.eps2 > 0 and np.isfinite(self.eps2), "eps2", self.eps2, "must be a finite number > 0")
        check(self.warmup_rounds >= 0, "warmup_rounds", self.warmup_rounds, "must be >= 0")
        check(self.min_size >= 1, "min_size", self.min_size, "must be >= 1 (a split needs two members)")
