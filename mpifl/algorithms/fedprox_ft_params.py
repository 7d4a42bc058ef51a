"""The config part of :mod:`mpifl.algorithms.fedprox_ft` (light: a config command imports it alone)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mpifl.algorithms.shared_params import FineTuneParams, finetune_selection_samples

READS = ("fedprox",)  # it trains as FedProx does: fedprox.mu is part of its runs


@dataclass
class Params(FineTuneParams):
    """FedAvg+FT's keys and checks, starting from another model by default."""

    # global model fine-tuned: best_val = the one of best mean validation accuracy over
    # clients so far (DPFL), last = the current one
    start: Literal["best_val", "last"] = "best_val"


selection_samples = finetune_selection_samples
