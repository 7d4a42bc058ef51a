"""Hyper-parameter sections several algorithms share, for an algorithm's
``Params`` to subclass: an adaptive server optimizer's (FedAdam, FedYogi) and
evaluation-time fine-tuning's (FedAvg+FT, FedProx+FT).

Light on purpose, as every algorithm's ``<name>_params`` module that imports it:
the config reads those without torch or the training code. The training code
that goes with these sections is in :mod:`mpifl.algorithms.blocks`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


@dataclass
class AdaptiveParams:
    """An adaptive server optimizer's section (``blocks.ServerAdaptive``)."""

    lr: float = 0.01  # server learning rate eta_s
    beta1: float = 0.9  # decay of the first moment m (paper: 0.9)
    beta2: float = 0.99  # decay of the second moment v (paper: 0.99)
    tau: float = 1e-3  # adaptivity tau in eta_s m / (sqrt(v) + tau); v starts at tau^2

    def validate(self, cfg: Config) -> None:
        check(self.lr > 0 and math.isfinite(self.lr), "lr", self.lr, "must be a finite number > 0")
        check(0 <= self.beta1 < 1, "beta1", self.beta1, "must be in [0, 1)")
        check(0 <= self.beta2 < 1, "beta2", self.beta2, "must be in [0, 1)")
        check(self.tau > 0 and math.isfinite(self.tau), "tau", self.tau, "must be a finite number > 0")


@dataclass
class FineTuneParams:
    """Fine-tuning a global model before evaluation (``blocks.finetuned_metrics``,
    ``blocks.track_best``)."""

    # global model fine-tuned before evaluation: last = the current one, best_val =
    # the one of best mean validation accuracy over clients so far (DPFL's FedAvg+FT)
    start: Literal["last", "best_val"] = "last"
    # local fine-tuning epochs before evaluation; 0 = 2 * train.local_epochs, DPFL's 2*tau (appendix F.6)
    ft_epochs: int = 0

    def validate(self, cfg: Config) -> None:
        check(self.ft_epochs >= 0, "ft_epochs", self.ft_epochs, "must be >= 0 (0 = 2 * train.local_epochs)")
        check_start(self, cfg)


def check_start(p: Any, cfg: Config) -> None:
    """best_val needs validation samples, only when the algorithm whose section
    ``p`` is (FedAvg+FT's or FedProx+FT's) is chosen."""
    if getattr(cfg, cfg.algorithm.name, None) is p:
        check(p.start != "best_val" or cfg.data.val_frac > 0, "start", p.start,
              "best_val needs validation samples: set data.val_frac > 0 or use last")


def finetune_selection_samples(p: Any, n_train: np.ndarray, n_val: np.ndarray) -> np.ndarray:
    """Per client, the samples the model it fine-tunes is chosen on: with ``start:
    best_val`` its validation split (the global model of best mean validation
    accuracy), else none (an algorithm's ``selection_samples``)."""
    return np.asarray(n_val) if p.start == "best_val" else np.zeros_like(np.asarray(n_val))
