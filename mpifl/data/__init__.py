"""Federated data: dataset pool -> partition -> per-client train/val/test splits.

Every rank computes the same partition (it is cheap and seeded) and keeps the
samples of its own clients only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import ConfigError, DataConfig
from ..rng import rng
from . import datasets
from .partition import partition

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
    idx = rng(seed, -1, client, "split").permutation(idx)
    n = len(idx)
    n_test = round(cfg.test_frac * n)
    n_val = round(cfg.val_frac * n)
    return [idx[n_test + n_val:], idx[n_test:n_test + n_val], idx[:n_test]]


def build(cfg: DataConfig, seed: int, local_ids: np.ndarray) -> FederatedData:
    pool = datasets.load(cfg, seed)
    part = partition(pool.y, pool.n_classes, cfg, seed)
    parts, cluster = part.parts, part.cluster
    N = cfg.n_clients
    sizes = np.zeros((N, 3), np.int64)
    hist = np.zeros((N, pool.n_classes), np.int64)
    xs, ys, offsets = [], [], np.zeros((len(local_ids), 3), np.int64)
    local = {int(c): k for k, c in enumerate(local_ids)}
    pos = 0
    for c in range(N):
        splits = client_splits(parts[c], cfg, seed, c)
        sizes[c] = [len(s) for s in splits]
        if sizes[c, 0] == 0:
            raise ConfigError(f"data.n_clients={N} is not allowed with data.name={cfg.name!r} and "
                              f"data.partition={cfg.partition!r}: client {c} gets no training sample")
        labels = [pool.y[s] if part.y_fn is None else part.y_fn(c, pool.y[s]) for s in splits]
        hist[c] = np.bincount(labels[0], minlength=pool.n_classes)
        if c in local:
            for s, split in enumerate(splits):
                offsets[local[c], s] = pos
                xs.append(pool.x[split] if part.x_fn is None else part.x_fn(c, pool.x[split]))
                ys.append(labels[s])
                pos += len(split)
    x = np.concatenate(xs) if xs else np.empty((0, *pool.shape), np.float32)
    y = np.concatenate(ys) if ys else np.empty(0, np.int64)
    return FederatedData(pool.n_classes, pool.shape, cluster, sizes, hist, x, y, offsets, np.asarray(local_ids))
