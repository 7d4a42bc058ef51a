"""Algorithms by name: every module of this package except ``base`` and ``_*``.

The module list is read from the package folder, so adding an algorithm is
adding one file (and its test); nothing else names it. A module provides what
``base.Algorithm`` describes (``State``, ``init``, ``round``, ``evaluate``) and,
when it has hyper-parameters, a ``Params`` dataclass: the config section of the
module's name (``fedprox.mu``), with commented defaults and a ``validate(cfg)``
method.

Nothing here imports torch or the algorithm modules until asked, so the names
are known to ``mpifl.config`` without the cost of importing every algorithm.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from .base import Algorithm

NOT_ALGORITHMS = {"base"}

# the order of the README's table: these baselines first, then alphabetical
_FIRST = ("local", "fedavg", "fedavg_ft", "oracle")


def _discover() -> tuple[str, ...]:
    found = {m.name for m in pkgutil.iter_modules(__path__)
             if not m.name.startswith("_") and m.name not in NOT_ALGORITHMS and not m.ispkg}
    return tuple(n for n in _FIRST if n in found) + tuple(sorted(found - set(_FIRST)))


NAMES: tuple[str, ...] = _discover()


def get(name: str) -> Algorithm:
    if name not in NAMES:
        raise KeyError(name)
    return cast("Algorithm", importlib.import_module(f"{__name__}.{name}"))


def sections() -> dict[str, type]:
    """Config section name -> hyper-parameter dataclass, for every algorithm
    that has one (imports the modules)."""
    out = {}
    for name in NAMES:
        params = getattr(get(name), "Params", None)
        if params is not None:
            out[name] = params
    return out
