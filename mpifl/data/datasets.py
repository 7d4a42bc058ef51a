"""Datasets by name -> one pool of samples (x float32, y int64).

The built-in datasets need no files: scikit-learn's bundled ``digits`` and the
``mnist1d`` generator. Train and test parts of a dataset are pooled here; the
partition then gives every client its own train/val/test split drawn from its
own distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import ConfigError, DataConfig


@dataclass
class Pool:
    x: np.ndarray  # [n, *shape] float32
    y: np.ndarray  # [n] int64
    n_classes: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])


def digits(cfg: DataConfig) -> Pool:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0)[:, None]  # [n, 1, 8, 8], pixels in [0, 1]
    return Pool(x, d.target.astype(np.int64), 10)


def mnist1d(cfg: DataConfig) -> Pool:
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = cfg.n_samples
    # mnist1d seeds numpy's global generator; keep the caller's state intact
    state = np.random.get_state()
    try:
        d = make_dataset(args)
    finally:
        np.random.set_state(state)
    x = np.concatenate([d["x"], d["x_test"]]).astype(np.float32)
    y = np.concatenate([d["y"], d["y_test"]]).astype(np.int64)
    x = (x - x.mean()) / x.std()
    return Pool(x, y, 10)


def synthetic(cfg: DataConfig, seed: int = 0) -> Pool:
    """Gaussian blobs, one per class: fast data for tests."""
    g = np.random.default_rng([seed, 7])
    centers = g.normal(0, 1.0, (cfg.synthetic_classes, cfg.synthetic_dim))
    y = g.integers(0, cfg.synthetic_classes, cfg.n_samples)
    x = centers[y] + g.normal(0, 0.7, (cfg.n_samples, cfg.synthetic_dim))
    return Pool(x.astype(np.float32), y.astype(np.int64), cfg.synthetic_classes)


def load(cfg: DataConfig, seed: int) -> Pool:
    if cfg.name == "digits":
        return digits(cfg)
    if cfg.name == "mnist1d":
        return mnist1d(cfg)
    if cfg.name == "synthetic":
        return synthetic(cfg, seed)
    raise ConfigError(f"data.name={cfg.name!r} is not allowed")
