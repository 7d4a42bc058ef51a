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


def dirichlet(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int, min_size: int = 10) -> Partition:
    """Per class, proportions ~ Dir(alpha) over the clients (DPFL's Dir(0.1)).

    As in NIID-Bench, a client already above the mean size gets no more of the
    class being dealt, and the whole deal is redrawn until every client holds
    at least ``min_size`` samples (each client needs a train/val/test split).
    """
    n, alpha = cfg.n_clients, cfg.dirichlet_alpha
    if len(y) < min_size * n:
        raise ConfigError(f"data.n_clients={n} is not allowed with data.name={cfg.name!r}: the dirichlet "
                          f"partition needs >= {min_size} samples per client and the pool has {len(y)}")
    g = rng(seed, -1, GLOBAL, "partition")
    by_class = [np.flatnonzero(y == c) for c in range(n_classes)]
    for _ in range(1000):
        parts: list[list[int]] = [[] for _ in range(n)]
        for idx in by_class:
            idx = g.permutation(idx)
            q = g.dirichlet(np.full(n, alpha))
            q = q * np.array([len(pt) < len(y) / n for pt in parts])
            q = q / q.sum()
            cuts = (np.cumsum(q) * len(idx)).astype(int)[:-1]
            for i, chunk in enumerate(np.split(idx, cuts)):
                parts[i].extend(chunk.tolist())
        if min(len(pt) for pt in parts) >= min_size:
            return Partition([np.sort(np.array(pt, np.int64)) for pt in parts], np.full(n, -1))
    raise ConfigError(f"data.dirichlet_alpha={alpha!r} is not allowed with data.n_clients={n}: no draw gave "
                      f"every client {min_size} samples; use a larger alpha or fewer clients")


def patho(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int) -> Partition:
    """Pathological: each client holds ``classes_per_client`` distinct classes
    (DPFL's Patho(3)), drawn at random; a class's samples are shared out evenly
    among the clients holding it."""
    n, s = cfg.n_clients, cfg.classes_per_client
    if s > n_classes:
        raise ConfigError(f"data.classes_per_client={s} is not allowed with data.name={cfg.name!r}: "
                          f"it has {n_classes} classes")
    g = rng(seed, -1, GLOBAL, "partition")
    held = [np.sort(g.choice(n_classes, s, replace=False)) for _ in range(n)]
    parts: list[list[int]] = [[] for _ in range(n)]
    for c in range(n_classes):
        holders = [i for i in range(n) if c in held[i]]
        if not holders:
            continue
        pool = g.permutation(np.flatnonzero(y == c))
        for i, chunk in zip(holders, np.array_split(pool, len(holders))):
            parts[i].extend(chunk.tolist())
    return Partition([np.sort(np.array(pt, np.int64)) for pt in parts], np.full(n, -1))


PARTITIONS = {"iid": iid, "clusters": clusters, "feature_shift": feature_shift, "dirichlet": dirichlet,
              "patho": patho}


def partition(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int) -> Partition:
    return PARTITIONS[cfg.partition](y, n_classes, cfg, seed)
