"""Which points of a sweep a command acts on: ``--only KEY=V1,V2`` (repeatable)
and ``--points 0-9,15``, for ``--local``, ``--submit``, ``--status`` and ``--dry-run``.

``--only`` values are read as the override ``KEY=V`` would be and coerced to the
key's type (``train.lr=0.10`` selects the points whose config holds 0.1; ``base``
names a grid's config file by its path or its stem); a point is selected when its
config matches one value of every ``--only`` and its index is in ``--points``. A
selection that matches no point is a user error: one line, exit 2.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpifl import config as config_mod
from mpifl.errors import ConfigError, shorten
from mpifl.sweep.spec import BASE

if TYPE_CHECKING:
    from mpifl.sweep.spec import Point




def split_values(text: str) -> list[str]:
    """``a,b,[64,64]`` -> ``["a", "b", "[64,64]"]``: commas inside brackets stay."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [*out, cur]


def parse_only(item: str) -> tuple[str, list[Any]]:
    """``KEY=V1,V2`` -> (KEY, the values coerced to KEY's type)."""
    key, sep, text = item.partition("=")
    if not sep or not key or not text:
        raise ConfigError(f"--only {shorten(repr(item))} must look like section.key=value[,value...]")
    if key == BASE:
        return key, split_values(text)
    hint = config_mod.key_type(key)
    values = []
    for v in split_values(text):
        _, raw = config_mod.override(f"{key}={v}")
        values.append(config_mod.coerce(raw, hint, f"--only {key}"))
    return key, values


def parse_points(text: str, n: int) -> set[int]:
    """``0-9,15`` -> the indices; each must lie in ``[0, n)``."""
    out: set[int] = set()
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d{1,18})\s*(?:-\s*(\d{1,18})\s*)?", part)  # 18 digits: past any sweep
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise ConfigError(f"--points {shorten(repr(text))} is not allowed; point indices and ranges, "
                              f"e.g. 0-9,15")
        a, b = int(m.group(1)), int(m.group(2) or m.group(1))
        if b >= n:
            raise ConfigError(f"--points {shorten(repr(text))} is not allowed; this sweep's points are 0-{n - 1}")
        out.update(range(a, b + 1))
    return out


def _value(p: Point, key: str) -> Any:
    if key == BASE:
        return p.values.get(BASE)
    from mpifl.config.identity import flatten

    return flatten(p.config.to_dict()).get(key)


def _matches(p: Point, key: str, wanted: list[Any]) -> bool:
    have = _value(p, key)
    if key == BASE:
        return have is not None and any(w in (str(have), Path(str(have)).stem) for w in wanted)
    return any(have == w for w in wanted)


def select(points: list[Point], only: list[str] = (), points_spec: str | None = None) -> list[Point] | None:
    """The points ``--only`` and ``--points`` pick (None when neither is given:
    every point); a selection of none is a one-line ConfigError."""
    if not only and points_spec is None:
        return None
    filters = [parse_only(item) for item in only]
    indices = parse_points(points_spec, len(points)) if points_spec is not None else None
    chosen = [p for p in points if (indices is None or p.index in indices)
              and all(_matches(p, k, vs) for k, vs in filters)]
    if not chosen:
        asked = " ".join([*(f"--only {x}" for x in only), *([f"--points {points_spec}"] if points_spec else [])])
        raise ConfigError(f"{asked} selects none of the sweep's {len(points)} points; `--dry-run` lists them "
                          f"with their values")
    return chosen
