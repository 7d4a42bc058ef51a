"""Algorithms by name. Each is a module: see ``base`` for the contract."""

from __future__ import annotations

import importlib
from types import ModuleType

NAMES = ("local", "fedavg", "fedavg_ft", "oracle", "federico", "fedc2i", "dpfl", "pfedlia")


def get(name: str) -> ModuleType:
    if name not in NAMES:
        raise KeyError(name)
    return importlib.import_module(f"{__name__}.{name}")
