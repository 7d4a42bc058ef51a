"""The config part of :mod:`mpifl.algorithms.fedadam` (light: a config command imports it alone)."""

from __future__ import annotations

from dataclasses import dataclass

from mpifl.algorithms.shared_params import AdaptiveParams


@dataclass
class Params(AdaptiveParams):
    """Hyper-parameters: the config section ``fedadam`` (the fields, defaults and
    checks of ``shared_params.AdaptiveParams``)."""
