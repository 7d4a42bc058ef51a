"""Partitions: the pool's samples -> per-client index sets and true clusters.

Every partition is seeded and records each client's true cluster (-1 where the
notion does not apply); no sample goes to two clients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..config import ConfigError, DataConfig
from ..rng import GLOBAL, rng


@dataclass
class Partition:
    parts: list[np.ndarray]  # per client: indices into the pool
    cluster: np.ndarray  # [N] true cluster / domain, -1 when none
    # per-client views of the data (feature shift, label flips): (client, array) -> array
    x_fn: Callable[[int, np.ndarray], np.ndarray] | None = None
    y_fn: Callable[[int, np.ndarray], np.ndarray] | None = None


def iid(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int) -> Partition:
    perm = rng(seed, -1, GLOBAL, "partition").permutation(len(y))
    return Partition(list(np.array_split(perm, cfg.n_clients)), np.full(cfg.n_clients, -1))


def label_groups(n_classes: int, k: int, seed: int) -> list[np.ndarray]:
    """Split the labels into k disjoint groups of near-equal size, seeded."""
    labels = rng(seed, -1, GLOBAL, "label_groups").permutation(n_classes)
    return [np.sort(g) for g in np.array_split(labels, k)]


def clusters(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int) -> Partition:
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
    return Partition(parts, cluster_of)


def noisy_clusters(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int, p_extra: float = 0.5,
                   n_extra: int = 1) -> Partition:
    """``clusters`` plus label noise (pFedLIA's noisy non-IID): with probability
    ``p_extra`` a client also gets ``n_extra`` random labels outside its cluster.

    Every label's samples are cut into equal shards, one per client holding that
    label (its cluster's members and the noisy clients that drew it), so an extra
    label weighs as much in a noisy client as each of its own labels does in a
    cluster member. Minimal version for pFedLIA; the data branch owns the full one.
    """
    k, n = cfg.n_clusters, cfg.n_clients
    if k < 2:
        raise ConfigError(f"data.n_clusters={k} is not allowed with data.partition='noisy_clusters'; "
                          "extra labels come from other clusters, so at least 2")
    base = clusters(y, n_classes, cfg, seed)  # validates k against labels and clients
    groups = label_groups(n_classes, k, seed)
    cluster_of = base.cluster
    holders: list[list[int]] = [[] for _ in range(n_classes)]
    for c in range(n):
        for lab in groups[cluster_of[c]]:
            holders[lab].append(c)
    for c in range(n):
        g = rng(seed, -1, c, "noisy_clusters")
        if g.random() < p_extra:
            outside = np.setdiff1d(np.arange(n_classes), groups[cluster_of[c]])
            for lab in g.choice(outside, min(n_extra, len(outside)), replace=False):
                holders[int(lab)].append(c)
    g = rng(seed, -1, GLOBAL, "partition")
    parts: list[list[np.ndarray]] = [[] for _ in range(n)]
    for lab in range(n_classes):
        pool = g.permutation(np.flatnonzero(y == lab))
        for c, shard in zip(holders[lab], np.array_split(pool, len(holders[lab]))):
            parts[c].append(shard)
    return Partition([np.sort(np.concatenate(p)) for p in parts], cluster_of)


def _domain_transform(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Domain k's view of inputs: the same labels seen through a different input
    transform (a stand-in for Digit-5's domains when they are not on disk)."""
    if k == 0:
        return x
    flat = x.reshape(len(x), -1) if x.ndim > 1 else x
    image = x.ndim >= 3  # [n, C, H, W]
    kind = (k - 1) % 4
    if kind == 0:  # mirror (images) / time reversal (signals)
        out = x[..., ::-1] if image else x[:, ::-1]
    elif kind == 1:  # inversion
        out = flat.max() + flat.min() - flat
    elif kind == 2:  # additive noise, fixed per domain
        out = flat + np.random.default_rng([seed, 17, k]).normal(0, 0.5 * flat.std(), flat.shape)
    else:  # blur: moving average along the last axis
        out = (x + np.roll(x, 1, -1) + np.roll(x, -1, -1)) / 3.0
    intensity = 1.0 + 0.1 * ((k - 1) // 4)  # domains past the fourth rescale too
    return (np.ascontiguousarray(out).reshape(x.shape) * intensity).astype(np.float32)


def feature_shift(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int) -> Partition:
    """K domains share all labels; client c is in domain c % K and sees its
    samples through domain c % K's input transform."""
    k, n = cfg.n_clusters, cfg.n_clients
    if k > n:
        raise ConfigError(f"data.n_clusters={k} is not allowed; must be <= data.n_clients ({n})")
    perm = rng(seed, -1, GLOBAL, "partition").permutation(len(y))
    cluster_of = np.arange(n) % k
    parts = [np.sort(p) for p in np.array_split(perm, n)]
    return Partition(parts, cluster_of, x_fn=lambda c, x: _domain_transform(x, int(cluster_of[c]), seed))


PARTITIONS = {"iid": iid, "clusters": clusters, "noisy_clusters": noisy_clusters, "feature_shift": feature_shift}


def partition(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int) -> Partition:
    return PARTITIONS[cfg.partition](y, n_classes, cfg, seed)
