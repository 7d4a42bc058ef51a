"""The config part of :mod:`mpifl.algorithms.fedavg_ft` (light: a config command imports it alone)."""

from __future__ import annotations

from dataclasses import dataclass

from mpifl.algorithms.shared_params import FineTuneParams, finetune_selection_samples


@dataclass
class Params(FineTuneParams):
    """Hyper-parameters: the config section ``fedavg_ft`` (the fields, defaults and
    checks of ``shared_params.FineTuneParams``)."""


selection_samples = finetune_selection_samples  # the samples fine-tuning's start is chosen on
