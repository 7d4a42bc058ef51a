"""The config part of :mod:`mpifl.algorithms.fedadam`, which that module imports back:
``Params``. Light (no torch, no training code): config commands import it alone."""

from __future__ import annotations

from dataclasses import dataclass

from mpifl.algorithms.shared_params import AdaptiveParams


@dataclass
class Params(AdaptiveParams):
    """Hyper-parameters: the config section ``fedadam`` (the fields, defaults and
    checks of ``shared_params.AdaptiveParams``)."""
