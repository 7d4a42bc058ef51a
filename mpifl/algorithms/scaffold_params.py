"""The config part of :mod:`mpifl.algorithms.scaffold` (light: a config command imports it alone)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    lr: float = 1.0  # global step size eta_g (paper's experiments: 1; 1 takes the average itself)
    # weights of Delta y and Delta c: uniform = the paper's 1/|S| and 1/N (and PFLlib's);
    # p = training-set size (FedAvg's: with zero variates, mpifl's FedAvg)
    weights: Literal["p", "uniform"] = "uniform"
    # how c_i^+ is formed: steps = option II's (x - y_i) / (K eta_l), which is the mean of
    # the client's minibatch gradients only under plain SGD; grads = that mean itself,
    # gathered along the K steps (any optimizer); auto = steps under sgd, grads under adam
    variate: Literal["auto", "steps", "grads"] = "auto"

    def validate(self, cfg: Config) -> None:
        check(self.lr > 0 and math.isfinite(self.lr), "lr", self.lr, "must be a finite number > 0")


def variate(cfg: Config) -> str:
    """``steps`` or ``grads``: how this config forms c_i^+ (``scaffold.variate``, ``auto`` resolved)."""
    v = cfg.scaffold.variate
    return v if v != "auto" else ("steps" if cfg.train.optimizer == "sgd" else "grads")


def held_rows(cfg: Config) -> int:
    """Parameter rows a client holds beyond its model and optimizer state: its control variate c_i,
    and under ``grads`` the sum of its gradients in the round (``mpifl.run.memory`` adds them to the
    estimate a run is checked against at start)."""
    return 2 if variate(cfg) == "grads" else 1
