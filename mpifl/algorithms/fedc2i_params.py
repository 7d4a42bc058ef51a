"""The config part of :mod:`mpifl.algorithms.fedc2i` (light: a config command imports it alone)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    """Hyper-parameters: the config section ``fedc2i``."""

    alpha: float = 5.0  # influence sensitivity; 0 = uniform weights (paper grid {0.5, 1, 2, 5, 10})
    # the paper's Table 3: none = full method; client_only = whole model by the influence vector;
    # class_only_local / class_only_global = classifier by the class matrix on local / averaged features
    ablation: Literal["none", "client_only", "class_only_local", "class_only_global"] = "none"

    def validate(self, cfg: Config) -> None:
        check(self.alpha >= 0 and math.isfinite(self.alpha), "alpha", self.alpha, "must be a finite number >= 0")


def check_config(cfg: Config) -> None:
    n = cfg.data.n_clients
    check(n >= 2, "data.n_clients", n, "fedc2i needs >= 2 clients (leave-one-out models)")
