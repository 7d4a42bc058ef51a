"""Partitions: the pool's samples -> per-client index sets and true clusters.

Every partition is seeded and records each client's true cluster (-1 where the
notion does not apply); no sample goes to two clients.
"""

from __future__ import annotations

import numpy as np

from ..config import ConfigError, DataConfig
from ..rng import GLOBAL, rng


def iid(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    perm = rng(seed, -1, GLOBAL, "partition").permutation(len(y))
    return list(np.array_split(perm, cfg.n_clients)), np.full(cfg.n_clients, -1)


def label_groups(n_classes: int, k: int, seed: int) -> list[np.ndarray]:
    """Split the labels into k disjoint groups of near-equal size, seeded."""
    labels = rng(seed, -1, GLOBAL, "label_groups").permutation(n_classes)
    return [np.sort(g) for g in np.array_split(labels, k)]


def clusters(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """K clusters with disjoint label sets; client c belongs to cluster c % K, and
    the samples of a cluster's labels are shared out evenly among its clients."""
    k, n = cfg.n_clusters, cfg.n_clients
    if k > n_classes:
        raise ConfigError(f"data.n_clusters={k} is not allowed with data.name={cfg.name!r}: "
                          f"clusters need disjoint label sets, so at most {n_classes} clusters")
    if k > n:
        raise ConfigError(f"data.n_clusters={k} is not allowed; must be <= data.n_clients ({n})")
    groups = label_groups(n_classes, k, seed)
    cluster_of = np.arange(n) % k
    parts: list[np.ndarray] = [np.empty(0, np.int64)] * n
    g = rng(seed, -1, GLOBAL, "partition")
    for c, labels in enumerate(groups):
        members = np.flatnonzero(cluster_of == c)
        pool = g.permutation(np.flatnonzero(np.isin(y, labels)))
        for m, part in zip(members, np.array_split(pool, len(members))):
            parts[m] = np.sort(part)
    return parts, cluster_of


PARTITIONS = {"iid": iid, "clusters": clusters}


def partition(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    return PARTITIONS[cfg.partition](y, n_classes, cfg, seed)
