"""The config part of :mod:`mpifl.algorithms.fesem` (light: a config command imports it alone)."""

from __future__ import annotations

from dataclasses import dataclass

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config
from mpifl.schema import sampled_count


@dataclass
class Params:
    """Hyper-parameters: the config section ``fesem``."""

    k: int = 0  # centres; 0 = the partition's true number of clusters

    def validate(self, cfg: Config) -> None:
        check(self.k >= 0, "k", self.k, "must be >= 1, or 0 for the partition's number of clusters")


NO_CLUSTERS = ("iid", "patho", "dirichlet")


def check_config(cfg: Config) -> None:
    k, part = cfg.fesem.k, cfg.data.partition
    check(k > 0 or part not in NO_CLUSTERS, "k", k,
          f"data.partition={part!r} records no true clusters: set fesem.k >= 1")
    m = sampled_count(cfg.algorithm.fraction, cfg.data.n_clients)
    check(k <= m, "k", k, f"must be <= the clients sampled per round ({m}): round 0 seeds the centres with them")
