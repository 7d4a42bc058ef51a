"""The config part of :mod:`mpifl.algorithms.oracle` (light: a config command imports it alone)."""

from __future__ import annotations

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


def check_config(cfg: Config) -> None:
    p = cfg.data.partition
    check(p not in ("iid", "patho", "dirichlet"), "algorithm.name", "oracle",
          f"oracle needs true clusters: data.partition={p!r} records none; "
          "use clusters, noisy_clusters, permuted_clusters, domains, feature_shift or label_flip")
