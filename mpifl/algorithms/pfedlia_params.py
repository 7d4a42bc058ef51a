"""The config part of :mod:`mpifl.algorithms.pfedlia` (light: a config command imports it alone)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    """Hyper-parameters: the config section ``pfedlia``."""

    mode: Literal["central", "p2p"] = "central"  # OPTICS at a center, or 2-means per client
    warmup_rounds: int = 20  # FedAvg rounds before the one-off clustering (paper: 20)
    fraction: float = 0.1  # clients sampled per round, warm-up and after (paper: 10%)
    lia_epochs: int = 20  # epochs on the one LIA batch from theta_0 (paper: 20)
    lia_batch: int = 64  # samples of the LIA batch (all of a smaller training split)
    min_samples: int = 2  # OPTICS min_samples (central); its noise become singletons
    # OPTICS xi: least relative reachability jump that bounds a cluster. sklearn's
    # 0.05 with min_samples=2 cuts true clusters into pairs (2-NN distances of
    # influence rows fluctuate by tens of percent inside a cluster)
    xi: float = 0.7
    # distance between influence rows for OPTICS (central; neither source names one).
    # Eq. 1 sums over D_i^val, so a row's scale grows with the client's validation
    # size (noisy_clusters clients hold 3 labels, not 2): cosine compares the rows'
    # direction only; correlation also centres each row. euclidean (sklearn's default)
    # stays the default: on very clean clusters cosine distances inside a cluster are
    # ~1e-3 and xi's relative-jump rule can split them (tests/algorithms/test_pfedlia.py)
    metric: Literal["euclidean", "cosine", "correlation"] = "euclidean"

    def validate(self, cfg: Config) -> None:
        n = cfg.data.n_clients
        check(self.warmup_rounds >= 0, "warmup_rounds", self.warmup_rounds, "must be >= 0")
        check(0 < self.fraction <= 1, "fraction", self.fraction, "must be in (0, 1]")
        check(self.lia_epochs >= 1, "lia_epochs", self.lia_epochs, "must be >= 1")
        check(self.lia_batch >= 1, "lia_batch", self.lia_batch, "must be >= 1")
        check(0 < self.xi < 1, "xi", self.xi, "must be in (0, 1)")
        check(2 <= self.min_samples <= max(2, n), "min_samples", self.min_samples,
              f"must be in [2, data.n_clients] (n_clients is {n})")


def check_config(cfg: Config) -> None:
    w, R = cfg.pfedlia.warmup_rounds, cfg.run.rounds
    check(w < R, "warmup_rounds", w, f"must be < run.rounds ({R}) so that the clustering round happens")


def selection_samples(p: Params, n_train: np.ndarray, n_val: np.ndarray) -> np.ndarray:
    """Per client, the samples its clustering is computed on: its validation split
    (the influences I(i, j) of Eq. 1 are validation losses), which Local never uses."""
    return np.asarray(n_val)
