"""The config part of :mod:`mpifl.algorithms.dpfl` (light: a config command imports it alone)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from mpifl.errors import ConfigError, check
from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    """Hyper-parameters: the config section ``dpfl``."""

    # max collaborators besides self: an integer, a fraction of N ("0.1N"), or inf
    budget: str = "inf"
    tau_init: int = 10  # local epochs before the preprocessing BGGC (the first round)
    tau_train: int = 5  # local epochs per training round
    period: int = 1  # run GGC every `period` training rounds (collaborators kept between)
    malicious: float = 0.0  # fraction of clients whose labels go through one fixed permutation
    malicious_run_ggc: bool = True  # false: malicious clients only train locally (still serve models)
    random_graph: bool = False  # ablation: random candidates of the same budget, all used, no GGC

    def budget_for(self, n_clients: int) -> float:
        """B_c as a number of clients (math.inf when unbounded), at least 1."""
        text = str(self.budget).strip()
        if text.lower() in ("inf", "+inf", ".inf", "infinity"):
            return math.inf
        try:
            if text[-1:] in ("N", "n"):
                b = math.floor(float(text[:-1]) * n_clients + 0.5)
                return float(max(1, b)) if float(text[:-1]) > 0 else 0.0
            if not re.fullmatch(r"[0-9]+", text):
                raise ValueError(text)
            return float(int(text))
        except (ValueError, OverflowError):
            raise ConfigError(f"budget={self.budget!r} is not allowed; use a positive integer, "
                              f"a fraction of N like 0.1N, or inf", "budget") from None

    def validate(self, cfg: Config) -> None:
        check(self.budget_for(cfg.data.n_clients) >= 1, "budget", self.budget, "must be >= 1 client (or inf)")
        check(self.tau_init >= 0, "tau_init", self.tau_init, "must be >= 0")
        check(self.tau_train >= 0, "tau_train", self.tau_train, "must be >= 0")
        check(self.period >= 1, "period", self.period, "must be >= 1")
        check(0 <= self.malicious < 1, "malicious", self.malicious, "must be in [0, 1)")


def check_config(cfg: Config) -> None:
    v = cfg.data.val_frac
    check(v > 0, "data.val_frac", v, "dpfl's rewards are validation losses: must be > 0")


def selection_samples(p: Params, n_train: np.ndarray, n_val: np.ndarray) -> np.ndarray:
    """Per client, the samples it chooses its collaborators on: its validation split
    (BGGC's rewards are validation losses), which Local never uses; none with
    ``random_graph``, whose collaborators are drawn, not chosen."""
    return np.zeros(len(n_val)) if p.random_graph else np.asarray(n_val)
