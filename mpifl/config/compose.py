"""The whole Config: the core sections (:mod:`mpifl.schema`) with one section per
algorithm that has hyper-parameters, read from the registry (``mpifl.algorithms``),
between ``algorithm`` and ``log``."""

from __future__ import annotations

import dataclasses
import functools

from mpifl import algorithms
from mpifl.schema import CORE_SECTIONS, TAIL_SECTIONS, ConfigBase


@functools.cache
def config_class() -> type:
    """The ``Config`` dataclass: one field per section. Built on first use, since
    reading the algorithm sections costs the registry's work."""
    secs = {**CORE_SECTIONS, **algorithms.sections(), **TAIL_SECTIONS}
    cls = dataclasses.make_dataclass(
        "Config", [(name, sec, dataclasses.field(default_factory=sec)) for name, sec in secs.items()],
        bases=(ConfigBase,))
    cls.__module__ = "mpifl.config"  # pickles as mpifl.config.Config (the package's __getattr__)
    cls.__doc__ = "The whole run configuration: one dataclass per section."
    return cls
