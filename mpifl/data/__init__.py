"""Federated data: dataset pool -> partition -> per-client train/val/test splits.

Every rank computes the same partition (it is cheap and seeded) and keeps the
samples of its own clients only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpifl.data import datasets
from mpifl.data.partition import Partition, PoolInfo, partition
from mpifl.errors import ConfigError
from mpifl.rng import GLOBAL, rng
from mpifl.schema import DataConfig

SPLITS = ("train", "val", "test")


@dataclass
class FederatedData:
    n_classes: int
    in_shape: tuple[int, ...]
    cluster: np.ndarray  # [N] true cluster / domain, -1 when unknown
    sizes: np.ndarray  # [N, 3] samples in train/val/test per client
    label_hist: np.ndarray  # [N, C] training labels per client
    x: np.ndarray  # samples of the local clients, concatenated
    y: np.ndarray
    # for local client k and split s: x[offsets[k, s]: offsets[k, s] + sizes[id, s]]
    offsets: np.ndarray  # [n_local, 3]
    local_ids: np.ndarray

    @property
    def n_clients(self) -> int:
        return len(self.cluster)

    def weights(self) -> np.ndarray:
        """p_i = n_i^train / sum_j n_j^train."""
        n = self.sizes[:, 0].astype(np.float64)
        return n / n.sum()


def client_splits(idx: np.ndarray, cfg: DataConfig, seed: int, client: int) -> list[np.ndarray]:
    """One client's samples -> [train, val, test] by data.val_frac / data.test_frac."""
    idx = rng(seed, -1, client, "split").permutation(idx)
    n = len(idx)
    n_test = round(cfg.test_frac * n)
    n_val = round(cfg.val_frac * n)
    return [idx[n_test + n_val:], idx[n_test:n_test + n_val], idx[:n_test]]


def train_val(idx: np.ndarray, cfg: DataConfig, seed: int, client: int) -> list[np.ndarray]:
    """One client's training-set samples -> [train, val] by data.val_frac."""
    idx = rng(seed, -1, client, "split").permutation(idx)
    n_val = round(cfg.val_frac * len(idx))
    return [idx[n_val:], idx[:n_val]]


def share_test_set(parts: list[np.ndarray], test_idx: np.ndarray, y: np.ndarray, strata: np.ndarray,
                   seed: int) -> list[np.ndarray]:
    """Share the dataset's own test samples out so that each client's test split
    follows its own mix of (label, domain) (DPFL): the test samples of a stratum go
    to the clients in proportion to their samples of it, by largest remainder.
    Disjoint; test samples of a stratum no client holds are left out."""
    key = strata * (int(y.max()) + 1) + y
    n = len(parts)
    keys = np.unique(key[test_idx])
    counts = np.zeros((n, len(keys)), np.int64)
    for c, p in enumerate(parts):
        kp = key[p]
        counts[c] = np.bincount(np.searchsorted(keys, kp[np.isin(kp, keys)]), minlength=len(keys))
    g = rng(seed, -1, GLOBAL, "test_share")
    out: list[list[np.ndarray]] = [[] for _ in range(n)]
    for j, k in enumerate(keys):
        have = counts[:, j]
        if have.sum() == 0:
            continue
        pool = g.permutation(test_idx[key[test_idx] == k])
        exact = have / have.sum() * len(pool)
        take = np.floor(exact).astype(np.int64)
        rest = len(pool) - take.sum()
        take[np.argsort(-(exact - take), kind="stable")[:rest]] += 1
        for c, part in enumerate(np.split(pool, np.cumsum(take)[:-1])):
            out[c].append(part)
    return [np.sort(np.concatenate(p)) if p else np.empty(0, np.int64) for p in out]


def federate(pool: datasets.Pool, cfg: DataConfig, seed: int) -> tuple[Partition, list[list[np.ndarray]]]:
    """The partition and every client's [train, val, test] indices into the pool."""
    if cfg.test_source == "test_set":
        if pool.test is None or not pool.test.any():
            raise ConfigError(f"data.test_source='test_set' is not allowed with data.name={cfg.name!r}: "
                              "it has no test set of its own; use data.test_source=split")
        train_idx, test_idx = np.flatnonzero(~pool.test), np.flatnonzero(pool.test)
    else:
        train_idx, test_idx = np.arange(len(pool.y)), None
    info = PoolInfo(domain=None if pool.domain is None else pool.domain[train_idx],
                    class_groups=pool.class_groups, dataset=cfg.name)
    part = partition(pool.y[train_idx], pool.n_classes, cfg, seed, info)
    part.parts = [train_idx[p] for p in part.parts]
    if test_idx is None:
        splits = [client_splits(p, cfg, seed, c) for c, p in enumerate(part.parts)]
    else:
        strata = pool.domain if pool.domain is not None else np.zeros(len(pool.y), np.int64)
        tests = share_test_set(part.parts, test_idx, pool.y, strata, seed)
        splits = [train_val(p, cfg, seed, c) + [tests[c]] for c, p in enumerate(part.parts)]
    if cfg.train_per_client:
        fixed_train_size(splits, cfg, seed)
    return part, splits


def fixed_train_size(splits: list[list[np.ndarray]], cfg: DataConfig, seed: int) -> None:
    """data.train_per_client = n: each client keeps n of its training samples, the
    first n of a permutation drawn for (seed, client) alone, so a smaller n keeps a
    subset of a larger one's samples and no rank count changes the draw. Its val
    and test splits were made from the whole share and stay as they are."""
    n = cfg.train_per_client
    have = np.array([len(s[0]) for s in splits])
    if have.min() < n:
        c = int(np.argmin(have))
        raise ConfigError(f"data.train_per_client={n} is not allowed with data.name={cfg.name!r}, "
                          f"data.partition={cfg.partition!r} and data.n_clients={cfg.n_clients}: client {c} "
                          f"has {have[c]} training samples; at most {have.min()}")
    for c, s in enumerate(splits):
        s[0] = rng(seed, -1, c, "train_per_client").permutation(s[0])[:n]


def build(cfg: DataConfig, seed: int, local_ids: np.ndarray) -> FederatedData:
    pool = datasets.load(cfg, seed)
    part, all_splits = federate(pool, cfg, seed)
    cluster = part.cluster
    N = cfg.n_clients
    sizes = np.zeros((N, 3), np.int64)
    hist = np.zeros((N, pool.n_classes), np.int64)
    xs, ys, offsets = [], [], np.zeros((len(local_ids), 3), np.int64)
    local = {int(c): k for k, c in enumerate(local_ids)}
    pos = 0
    for c in range(N):
        splits = all_splits[c]
        sizes[c] = [len(s) for s in splits]
        if sizes[c, 0] == 0:
            raise ConfigError(f"data.n_clients={N} is not allowed with data.name={cfg.name!r} and "
                              f"data.partition={cfg.partition!r}: client {c} gets no training sample")
        labels = [pool.y[s] if part.y_fn is None else part.y_fn(c, pool.y[s]) for s in splits]
        hist[c] = np.bincount(labels[0], minlength=pool.n_classes)
        if c in local:
            for s, split in enumerate(splits):
                offsets[local[c], s] = pos
                x = pool.floats(split)
                xs.append(x if part.x_fn is None else part.x_fn(c, x))
                ys.append(labels[s])
                pos += len(split)
    x = np.concatenate(xs) if xs else np.empty((0, *pool.shape), np.float32)
    y = np.concatenate(ys) if ys else np.empty(0, np.int64)
    return FederatedData(pool.n_classes, pool.shape, cluster, sizes, hist, x, y, offsets, np.asarray(local_ids))
