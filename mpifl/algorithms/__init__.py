"""Algorithms by name: every module of this package that defines, at its top
level, all of ``base.Algorithm``'s members (:data:`CONTRACT`: ``State``, ``init``,
``round``, ``evaluate``); a helper module (``blocks``, ``head``) defines none of
them, and a module that defines only some is a mistake a test names.

The module list is read from the package folder, so adding an algorithm is
adding one file (and its test); nothing else names it. A module provides what
``base.Algorithm`` describes. When it has hyper-parameters, its config part sits
beside it in ``<name>_params.py`` (:func:`config_part`): a ``Params`` dataclass,
the config section of the module's name (``fedprox.mu``), with commented defaults
and a ``validate(cfg)`` method naming its keys bare (``mu``: the field), and where
needed ``check_config(cfg)``, ``READS`` and ``selection_samples``. That file
imports only light modules (no torch, no training code); the algorithm imports
its names back (``fedprox.Params``) and receives its section as ``ctx.params``.
A ``_params`` module defines none of :data:`CONTRACT`, so it is no algorithm; one
without its algorithm is a mistake a test names.

Nothing here imports torch or the algorithm modules until asked, so the names
are known to ``mpifl.config`` without the cost of importing every algorithm.
The config consults this registry: :data:`NAMES` are the allowed
``algorithm.name``, :func:`sections` its sections and :func:`validate` checks them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import re
import types
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, cast

from mpifl.errors import ConfigError
from mpifl.schema import ConfigBase

if TYPE_CHECKING:
    from mpifl.algorithms.base import Algorithm

# base.Algorithm's members: a module of this package defining all of them is an algorithm
CONTRACT = ("State", "init", "round", "evaluate")
# <name>_params.py beside <name>.py: the algorithm's config part (config_part)
PARAMS = "_params"
HERE = Path(__file__).parent

# the order of the README's table: these baselines first, then alphabetical
_FIRST = ("local", "fedavg", "fedavg_ft", "oracle")


def defines(path: Path) -> set[str]:
    """Which of :data:`CONTRACT` a module's file binds at its top level: an unindented
    ``def``/``class`` of the name, an assignment to it (``round = server_round``) or a
    one-line import of it. Read as text, not parsed: every config command pays it."""
    text = path.read_text()
    return {n for n in CONTRACT
            if re.search(rf"^(?:(?:def|class) {n}\b|{n}\s*(?::[^=\n]*)?=|from \S+ import .*\b{n}\b)", text, re.M)}


def _discover(folder: Path = HERE) -> tuple[str, ...]:
    """The algorithms among the modules in ``folder``, read from their files (not imported)."""
    found = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_") and defines(p) == set(CONTRACT)}
    return tuple(n for n in _FIRST if n in found) + tuple(sorted(found - set(_FIRST)))


NAMES: tuple[str, ...] = _discover()


def get(name: str) -> Algorithm:
    if name not in NAMES:
        raise KeyError(name)
    return cast("Algorithm", importlib.import_module(f"{__name__}.{name}"))


def config_part(name: str) -> types.ModuleType | None:
    """Algorithm ``name``'s config part, ``mpifl.algorithms.<name>_params`` (its
    ``Params``, ``check_config``, ``READS``, ``selection_samples``), a light module
    imported without the training code; None where the algorithm has none."""
    if not (HERE / f"{name}{PARAMS}.py").is_file():
        return None
    return importlib.import_module(f"{__name__}.{name}{PARAMS}")


def sections() -> dict[str, type]:
    """Config section name -> hyper-parameter dataclass, for every algorithm that
    has one (its config part's ``Params``)."""
    out = {}
    for name in NAMES:
        params = getattr(config_part(name), "Params", None)
        if params is not None:
            out[name] = params
    return out


def sections_of(name: str) -> tuple[str, ...]:
    """The config sections algorithm ``name`` reads: its own (where it has
    hyper-parameters) and those its config part names in ``READS`` (FedProx+FT
    trains as FedProx: ``fedprox``)."""
    part = config_part(name)
    return (*((name,) if hasattr(part, "Params") else ()), *getattr(part, "READS", ()))


def validate(cfg: ConfigBase) -> None:
    """Every algorithm section validates itself (``Params.validate``, whether
    chosen or not: a sweep may switch to it), then the chosen algorithm may refuse
    a combination (``check_config``)."""
    for name, params in sections().items():
        with _keys_of(name, params):
            getattr(cfg, name).validate(cfg)
    chosen = config_part(cfg.algorithm.name)
    if hasattr(chosen, "check_config"):
        with _keys_of(cfg.algorithm.name, getattr(chosen, "Params", None)):
            chosen.check_config(cfg)


@contextlib.contextmanager
def _keys_of(name: str, params: type | None) -> Iterator[None]:
    """An error naming a field of ``params`` bare (``mu``) names it in its
    section (``fedprox.mu``): the key comes from the field and the module's name,
    so no module types another's section (FedYogi's checks once said fedadam)."""
    try:
        yield
    except ConfigError as e:
        if e.key is None or "." in e.key:  # another section's key (data.val_frac), or no key
            raise
        fields = {f.name for f in dataclasses.fields(params)} if params is not None else set()
        if e.key not in fields:
            raise TypeError(f"mpifl.algorithms.{name} names {e.key!r} in an error, "
                            f"which is no key of its section") from e
        raise ConfigError(f"{name}.{e}", f"{name}.{e.key}") from None
