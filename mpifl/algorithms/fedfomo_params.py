"""The config part of :mod:`mpifl.algorithms.fedfomo` (light: a config command imports it alone)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    """Hyper-parameters: the config section ``fedfomo``."""

    m: int = 5  # candidate models a client downloads per round (PFLlib/FL-bench default 5)
    eps: float = 0.3  # initial exploration probability of the epsilon-greedy draw (paper: 0.3)
    eps_decay: float = 0.05  # eps_t = eps * (1 - eps_decay)^t (paper: decay 0.05 per round)
    val_frac: float = 0.2  # share of each client's training samples held out for the weights (PFLlib: 0.2)

    def validate(self, cfg: Config) -> None:
        check(self.m >= 1, "m", self.m, "must be >= 1")
        check(0 <= self.eps <= 1, "eps", self.eps, "must be in [0, 1]")
        check(0 <= self.eps_decay <= 1, "eps_decay", self.eps_decay, "must be in [0, 1]")
        check(0 < self.val_frac < 1, "val_frac", self.val_frac, "must be in (0, 1)")


def check_config(cfg: Config) -> None:
    m, n = cfg.fedfomo.m, cfg.data.n_clients
    check(m <= n - 1, "m", m, f"must be <= data.n_clients - 1 ({n - 1}): a client never draws itself")


def held_out(val_frac: float, n: int) -> int:
    """How many of a client's ``n`` training samples are held out for the weights
    (at least one, and one left to train on, where it has two)."""
    return min(n - 1, max(1, int(math.floor(val_frac * n)))) if n >= 2 else 0


def selection_samples(p: Params, n_train: np.ndarray, n_val: np.ndarray) -> np.ndarray:
    """Per client, the samples its weights w_ij are computed on: ``val_frac`` of its
    training split, held out of its training (its validation split is not used)."""
    return np.array([held_out(p.val_frac, int(n)) for n in np.asarray(n_train)], np.int64)
