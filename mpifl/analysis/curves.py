"""Accuracy against a swept config key, per method, and how each method does
against a baseline, paired by seed: ``python -m mpifl.analyze SWEEP_DIR --x KEY
[--versus NAME [--ceiling NAME]] [--y KEY2]``.

Runs are grouped into methods by ``algorithm.name`` and every other key that
varies between them (as ``mpifl.analyze`` groups), leaving out KEY (and KEY2)
and the seed; each method's curve is, at every value of KEY, the mean ± std
over seeds of the summary metric (``--metric``, default ``final_acc``: the last
evaluated round's test accuracy, mean over clients, as the reproduction pages
report). KEY must hold numbers (``data.train_per_client``, ``train.lr``, ...).
Only complete runs (every planned round logged) make a point: a run still going
or stopped would give its last logged round as its final one; those left out
are named in one line.

Written to the analysis folder (names from the key, ``data.train_per_client`` ->
``curves_train_per_client.*``): a PNG (log x axis where the largest value is at
least 10 times the smallest), a CSV (fractions) and a Markdown table (percent).

Paired comparison, with ``--versus BASELINE`` (an ``algorithm.name``; ``--method
NAME``, repeatable, limits the methods reported, default all others): seed s
gives every method the same partition and initial weights, so at each value of
KEY the method's and the baseline's runs are paired by seed and the per-seed
differences (method minus baseline) give a mean and a 95% t-interval
(``mpifl.analysis.stats``) over the n seeds both have. The verdict is *above* where the
interval's lower end is > 0, *below* where its upper end is < 0, else *level*
(one seed gives no interval: level). Printed per method: the largest value at
which it is above, and the first value after it at which it no longer is.

Many cells at once: each cell's paired t-test p (``p``, under 0.05 exactly where
the interval excludes 0) is adjusted by Holm's step-down over its family, one
method's cells of the table (every x, and every value of KEY2), and the cell gets
a second verdict under that (``verdict_holm``): a verdict the correction takes
back to level is one the table's tests together do not find at 5%. A cell whose
seeds' differences split into separate modes (``mpifl.analysis.stats.split_modes``:
sorted, a gap more than 10 times the spread within the two sides) is flagged
``split``: its mean and t-interval describe neither mode.

The share of the gain, with ``--ceiling NAME`` (e.g. ``oracle``, a positive
control): per seed, ceiling minus baseline is the *room* and (method minus
baseline) / room the method's *share*; the room is reported as a mean with its
95% t-interval, the share as the mean of the per-seed shares with a 95%
percentile bootstrap interval over seeds (10,000 resamples, a fixed RNG seed: no
normal ratio assumed). Where the ceiling is not above the baseline by its own paired
interval the cell says "no room", and where that interval reaches down to
``ROOM_FLOOR`` (2 points) "small room": neither gets a share, as there was nothing a
method could have captured, or a room within the seeds' noise would make the share
a measure of that noise. A share above 1 is a method
beating the ceiling (Oracle's groups are fixed; a method may pool more).

Written as ``versus.csv`` (columns ``method, [KEY2,] x, n_seeds, seeds,
diff_mean, ci_low, ci_high, verdict, p, p_holm, verdict_holm, split_modes``, with
``--ceiling`` also ``room, room_low, room_high, gain_share, gain_low, gain_high``;
fractions) and ``versus.md`` (points). With ``--y KEY2`` (a second swept numeric key) every
method gets one curve per value of KEY2 and, with ``--ceiling``, a heatmap of
its gain share over KEY2 x KEY (``share_<method>.png``: both verdicts in each
cell, hatched where the one under Holm is level, grey where no share is given;
``data.n_clients`` in clients per group where the partition has groups).

The baseline (and ceiling) of a method is the one with the same values of the
keys outside algorithm sections (a sweep over job files compares within each
file).
"""

from __future__ import annotations

import csv
import math
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mpifl.analysis.figure import axes, finish, pyplot
from mpifl.analysis.stats import (
    SPLIT_K,
    bootstrap_mean_ratio,
    holm,
    holm_verdict,
    mean_std,
    paired_interval,
    paired_p,
    split_modes,
    verdict,
)
from mpifl.analysis.summary import Summary

LOG_SPAN = 10  # a log x axis once max/min reaches this
NO_ROOM = "no room"
# The share is given only where the room's 95% interval lies above this floor (a fraction:
# 2 points of accuracy). Under it the room is within the seed-to-seed noise of the methods
# compared in it (paired differences spread by 1-5 points over 5 seeds in the room
# sweeps), and a share of it says how large that noise is, not what a method captured.
ROOM_FLOOR = 0.02
SMALL_ROOM = "small room"


class CurveError(ValueError):
    """A key or baseline the runs cannot give a curve for: one line."""


@dataclass
class Curve:
    method: tuple[str, ...]  # the grouping keys' values, algorithm.name first
    label: str
    x: list[float] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    std: list[float] = field(default_factory=list)
    seeds: list[list[int]] = field(default_factory=list)
    values: list[list[float]] = field(default_factory=list)  # per x, the metric of each seed in `seeds`
    y: float | None = None  # the value of --y KEY2 this curve is drawn at

    @property
    def family(self) -> str:
        """The label without its ``--y`` part (appended last): one method's cells over
        the whole table, the family its Holm adjustment runs over."""
        return self.label.rsplit(", ", 1)[0] if self.y is not None else self.label

    def at(self, x: float) -> tuple[float, float] | None:
        return (self.mean[self.x.index(x)], self.std[self.x.index(x)]) if x in self.x else None

    def add(self, x: float, seeds: list[int], values: list[float], ddof: int = 1) -> None:
        """The point at x: each seed's value, their mean and std."""
        mean, std = mean_std(values, ddof)
        self.x.append(x)
        self.mean.append(mean)
        self.std.append(std)
        self.seeds.append(list(seeds))
        self.values.append(list(values))

    def by_seed(self, x: float) -> dict[int, float]:
        if x not in self.x:
            return {}
        i = self.x.index(x)
        return {s: v for s, v in zip(self.seeds[i], self.values[i]) if not math.isnan(v)}


@dataclass
class Interval:
    mean: float
    low: float
    high: float


@dataclass
class Paired:
    """One method against the baseline at one x: the per-seed differences' mean
    and 95% interval, their paired p, Holm-adjusted over the method's cells
    (:func:`correct`), whether the differences split into modes, and with a ceiling
    the room and the share of it."""

    method: str
    baseline: str
    x: float
    y: float | None
    seeds: list[int]
    diff: Interval
    verdict: str
    room: Interval | None = None  # ceiling minus baseline
    share: Interval | None = None  # None with a ceiling: no room, or a room under ROOM_FLOOR
    p: float = math.nan  # the paired t-test's two-sided p
    p_holm: float = math.nan  # p adjusted over the family (one method's cells of the table)
    holm_verdict: str = "level"
    modes: bool = False  # the seeds' differences split into separate modes (stats.split_modes)
    family: str = ""

    @property
    def no_share(self) -> str:
        """Why no share is given: NO_ROOM (the ceiling not above the baseline) or
        SMALL_ROOM (above, but the room's interval reaches down to ROOM_FLOOR)."""
        return NO_ROOM if self.room is None or verdict(self.room.low, self.room.high) != "above" else SMALL_ROOM

    @property
    def n(self) -> int:
        return len(self.seeds)


@dataclass
class Crossover:
    method: str
    baseline: str
    signs: list[tuple[float, str, float]]  # (x, "above" | "level" | "below", mean paired difference)
    last_above: float | None  # the largest x at which the method is above
    no_longer: float | None  # the first x after last_above at which it is not; None: above to the end
    points: list[Paired] = field(default_factory=list)

    def sentence(self, key: str, scale: float = 100.0) -> str:
        xs = [x for x, _, _ in self.signs]
        pattern = ", ".join(f"{_num(p.x)}: {scale * p.diff.mean:+.2f} {_ci(p.diff, scale)} {_verdicts(p)} [{p.n}]"
                            for p in self.points)
        if not xs:
            return f"{self.method} vs {self.baseline}: no common seed at any value of {key}"
        if self.last_above is None:
            head = f"never above by its paired 95% interval ({key} {_num(xs[0])} to {_num(xs[-1])})"
        elif self.no_longer is None:
            head = f"above up to the largest {key} ({_num(self.last_above)})"
        else:
            head = f"above up to {key}={_num(self.last_above)}, no longer at {_num(self.no_longer)}"
        return f"{self.method} vs {self.baseline}: {head}; per value, points, 95% interval, [seeds]: {pattern}"


def _num(v: float) -> str:
    return f"{v:g}"


def _verdicts(p: Paired) -> str:
    """The verdict, the one under Holm where it differs, and a split into modes."""
    text = p.verdict if p.holm_verdict == p.verdict else f"{p.verdict} (Holm: {p.holm_verdict})"
    return text + (", seeds split" if p.modes else "")


def _p(v: float) -> str:
    return "–" if math.isnan(v) else f"{v:.2g}" if v >= 0.001 else "<0.001"


def _ci(i: Interval, scale: float = 100.0, digits: int = 2) -> str:
    if math.isnan(i.low):
        return "[no interval]"
    return f"[{scale * i.low:+.{digits}f}, {scale * i.high:+.{digits}f}]"


def _value(r: Summary, key: str) -> float:
    v = r.config.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise CurveError(f"--x {key}: run {r.name} has {key}={v!r}; the key must hold numbers")
    return float(v)


@dataclass
class Grouping:
    """How the analysis groups runs (``mpifl.analyze`` passes its own, so both
    group alike): the keys that vary (``algorithm.name`` first), a run's value of
    a key as a label, and the label of a key the run's algorithm never reads."""

    keys: list[str]
    setting: Callable[[Summary, str], str]
    not_applicable: str = "–"


def run_value(r: Summary, metric: str) -> float:
    """A run's metric as a fraction: a Summary accuracy (``final_acc``, ``es_acc``, ...)
    or a per-round one (``test_acc@R``: ``mpifl.analysis.summary.metric_value``)."""
    from mpifl.analysis.summary import AT_ROUND, metric_value

    return metric_value(r, metric) / 100.0 if AT_ROUND.fullmatch(metric) else float(getattr(r, metric))


def curves(runs: list[Summary], key: str, grouping: Grouping, metric: str = "final_acc",
           ddof: int = 1, y: str | None = None) -> tuple[list[str], list[Curve]]:
    """The grouping keys without ``key`` (and ``y``) and one curve per method
    (and value of ``y``), x ascending."""
    for k, flag in ((key, "--x"), (y, "--y")):
        if k is not None and not any(k in r.config for r in runs):
            raise CurveError(f"{flag} {k}: no run's config has that key")
    if y == key:
        raise CurveError(f"--y {y}: the same key as --x; give two different swept keys")
    runs = [r for r in runs if r.complete]
    if not runs:
        raise CurveError(f"--x {key}: no run is complete (every one is still going or stopped)")
    keys = [k for k in grouping.keys if k not in (key, y)]
    by: dict[tuple, dict[float, list[Summary]]] = {}
    for r in runs:
        yv = None if y is None else _value(r, y)
        by.setdefault((tuple(grouping.setting(r, k) for k in keys), yv), {}).setdefault(_value(r, key), []).append(r)
    out = []
    for (method, yv), points in sorted(by.items(), key=lambda kv: (kv[0][0], -math.inf if kv[0][1] is None
                                                                     else kv[0][1])):
        parts = [method[0]] + [f"{k}={v}" for k, v in zip(keys[1:], method[1:]) if v != grouping.not_applicable]
        if yv is not None:
            parts.append(f"{y}={_num(yv)}")
        c = Curve(method, ", ".join(parts), y=yv)
        for x in sorted(points):
            rs = sorted(points[x], key=lambda r: r.seed)
            c.add(x, [r.seed for r in rs], [run_value(r, metric) for r in rs], ddof)
        out.append(c)
    return keys, out


def paired(c: Curve, base: Curve, x: float, ceiling: Curve | None = None, level: float = 0.95) -> Paired | None:
    """c against base at x over the seeds both (and the ceiling, if given) have."""
    m, b = c.by_seed(x), base.by_seed(x)
    top = ceiling.by_seed(x) if ceiling is not None else None
    seeds = sorted(set(m) & set(b) & (set(top) if top is not None else set(m)))
    if not seeds:
        return None
    diffs = [m[s] - b[s] for s in seeds]
    d = paired_interval(diffs, level)
    p = Paired(c.label, base.label, x, c.y, seeds, Interval(*d[:3]), verdict(d[1], d[2]), p=paired_p(diffs),
               modes=split_modes(diffs), family=c.family)
    if top is not None:
        rooms = [top[s] - b[s] for s in seeds]
        r = paired_interval(rooms, level)
        p.room = Interval(*r[:3])
        if not math.isnan(r[1]) and r[1] > ROOM_FLOOR:
            p.share = Interval(*bootstrap_mean_ratio(diffs, rooms, level))
    return p


def correct(points: list[Paired]) -> None:
    """Each point's p adjusted by Holm over its family (one method's cells of the
    table: every x, and every y with a second key) and its verdict under that."""
    families: dict[str, list[Paired]] = {}
    for p in points:
        families.setdefault(p.family, []).append(p)
    for ps in families.values():
        for p, adj in zip(ps, holm([p.p for p in ps])):
            p.p_holm, p.holm_verdict = adj, holm_verdict(p.diff.mean, adj)


def compare(c: Curve, base: Curve, ceiling: Curve | None = None) -> Crossover:
    points = [p for p in (paired(c, base, x, ceiling) for x in c.x) if p is not None]
    signs = [(p.x, p.verdict, p.diff.mean) for p in points]
    above = [x for x, s, _ in signs if s == "above"]
    last = max(above) if above else None
    later = [x for x, s, _ in signs if s != "above" and (last is None or x > last)]
    return Crossover(c.label, base.label, signs, last, min(later) if later else None, points)


def _partner(c: Curve, keys: list[str], pool: list[Curve], name: str,
             where: dict[str, str] | None = None) -> Curve | None:
    """The curve of algorithm ``name`` that agrees with c on every key outside
    algorithm sections (and on --y), except that on a key of ``where`` it has that
    value (``--versus-where train.max_steps=1``: a method paired with the baseline at
    another budget, which a pre-registration names)."""
    from mpifl.algorithms import NAMES

    where = where or {}
    shared = [i for i, k in enumerate(keys) if i > 0 and k.split(".", 1)[0] not in NAMES]
    for b in pool:
        if b.method[0] == name and b.y == c.y and all(
                str(b.method[i]) == where[keys[i]] if keys[i] in where else b.method[i] == c.method[i]
                for i in shared):
            return b
    return None


def where_text(where: dict[str, str] | None, more: str = "") -> str:
    """`` (its runs with k=v, ...)`` naming the baseline's arm a ``where`` picks, for a table's note."""
    return f" (its runs with {', '.join(f'{k}={v}' for k, v in where.items())}{more})" if where else ""


def check_where(keys: list[str], where: dict[str, str] | None) -> None:
    """A ``--versus-where`` key the runs do not vary by (outside algorithm sections)
    would pair nothing differently: refused in one line naming the keys they vary by."""
    from mpifl.algorithms import NAMES

    varied = [k for k in keys[1:] if k.split(".", 1)[0] not in NAMES]
    bad = [k for k in (where or {}) if k not in varied]
    if bad:
        raise CurveError(f"--versus-where {', '.join(bad)}: the runs do not vary by it; they vary by "
                         f"{', '.join(varied) or 'no key outside algorithm sections'}")


def parse_where(items: list[str] | tuple[str, ...] | str | None) -> dict[str, str]:
    """``["train.max_steps=1", ...]`` or ``"train.max_steps=1,train.local_epochs=5"`` ->
    {key: value}; a part without ``=`` is refused in one line."""
    if not items:
        return {}
    parts = items.split(",") if isinstance(items, str) else list(items)
    bad = [x for x in parts if "=" not in x or not x.split("=", 1)[0]]
    if bad:
        raise CurveError(f"--versus-where {', '.join(bad)}: expected KEY=VALUE, e.g. train.max_steps=1")
    return dict(x.split("=", 1) for x in parts)


def crossovers(keys: list[str], cs: list[Curve], versus: str, methods: list[str] = (),
               ceiling: str | None = None, where: dict[str, str] | None = None) -> list[Crossover]:
    names = {c.method[0] for c in cs}
    have = ", ".join(sorted(names))
    flags = [("--versus", versus), *(("--method", m) for m in methods)]
    if ceiling is not None:
        flags.append(("--ceiling", ceiling))
    for flag, m in flags:
        if m not in names:
            raise CurveError(f"{flag} {m}: no runs of algorithm.name={m}; the runs have {have}")
    check_where(keys, where)
    out = []
    for c in cs:
        if c.method[0] == versus or (methods and c.method[0] not in methods):
            continue
        base = _partner(c, keys, cs, versus, where)
        if base is not None:
            top = _partner(c, keys, cs, ceiling, where) if ceiling is not None else None
            out.append(compare(c, base, top if ceiling is not None and top is not None else None))
    correct([p for c in out for p in c.points])
    return out


# --------------------------------------------------------------------------- output


def stem(key: str) -> str:
    return "curves_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", key.rsplit(".", 1)[-1])


def rows(cs: list[Curve]) -> list[dict[str, Any]]:
    return [{"method": c.label, "x": x, "n_seeds": len(s), "seeds": " ".join(map(str, s)), "mean": m, "std": sd}
            for c in cs for x, m, sd, s in zip(c.x, c.mean, c.std, c.seeds)]


def _g(v: float) -> str:
    return "" if v is None or math.isnan(v) else f"{v:.6g}"


def write_csv(path: Path, key: str, metric: str, cs: list[Curve]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", key, "n_seeds", "seeds", f"{metric}_mean", f"{metric}_std"])
        for r in rows(cs):
            w.writerow([r["method"], _num(r["x"]), r["n_seeds"], r["seeds"], _g(r["mean"]), _g(r["std"])])


def _base_label(p: Paired, y: str | None) -> str:
    """The method's label without its ``--y`` part (the y value has its own column)."""
    return p.method if y is None or p.y is None else p.method.removesuffix(f", {y}={_num(p.y)}")


def write_versus_csv(path: Path, cross: list[Crossover], y: str | None, ceiling: bool) -> None:
    head = ["method", *([y] if y else []), "x", "n_seeds", "seeds", "diff_mean", "ci_low", "ci_high", "verdict",
            "p", "p_holm", "verdict_holm", "split_modes"]
    if ceiling:
        head += ["room", "room_low", "room_high", "gain_share", "gain_low", "gain_high"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(head)
        for c in cross:
            for p in c.points:
                row = [_base_label(p, y), *([_num(p.y)] if y else []), _num(p.x), p.n, " ".join(map(str, p.seeds)),
                       _g(p.diff.mean), _g(p.diff.low), _g(p.diff.high), p.verdict, _g(p.p), _g(p.p_holm),
                       p.holm_verdict, "yes" if p.modes else "no"]
                if ceiling:
                    r = p.room or Interval(math.nan, math.nan, math.nan)
                    row += [_g(r.mean), _g(r.low), _g(r.high)]
                    row += [_g(p.share.mean), _g(p.share.low), _g(p.share.high)] if p.share else [p.no_share, "", ""]
                w.writerow(row)


def versus_markdown(key: str, cross: list[Crossover], y: str | None, ceiling: str | None, metric: str,
                    where: dict[str, str] | None = None) -> str:
    """One row per method and x: the paired difference, its verdict and, with a
    ceiling, the room and the share of it (points; shares in percent)."""
    cols = ["method", *([y] if y else []), key, "seeds", "diff (95% CI)", "verdict", "p (Holm)", "Holm verdict"]
    if ceiling:
        cols += ["room (95% CI)", "gain share (95% bootstrap)"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for c in cross:
        for p in c.points:
            cells = [_base_label(p, y), *([_num(p.y)] if y else []), _num(p.x),
                     str(p.n) + (" split" if p.modes else ""), f"{100 * p.diff.mean:+.2f} {_ci(p.diff)}", p.verdict,
                     f"{_p(p.p)} ({_p(p.p_holm)})", p.holm_verdict]
            if ceiling:
                cells.append(f"{100 * p.room.mean:+.2f} {_ci(p.room)}" if p.room else "–")
                cells.append(f"{100 * p.share.mean:.0f}% {_ci(p.share, 100, 0)}" if p.share else p.no_share)
            lines.append("| " + " | ".join(cells) + " |")
    base = cross[0].baseline.split(",")[0] if cross else "the baseline"
    at = where_text(where, ", and so the ceiling's")
    note = (f"\n{metric}: method minus {base}{at}, paired by seed, in points, mean and 95% t-interval; verdict above/"
            f"below where the interval excludes 0, else level. {HOLM_NOTE}")
    if ceiling:
        note += (f" Room: {ceiling} minus {base}; gain share: (method - {base}) / room per seed, mean and 95% "
                 f"percentile bootstrap interval over seeds; {NO_ROOM!r} where {ceiling} is not above {base} by "
                 f"its own interval, {SMALL_ROOM!r} where that interval reaches down to {100 * ROOM_FLOOR:g} "
                 "points (a room within the seeds' noise: no share given).")
    return "\n".join(lines) + "\n" + note + "\n"


HOLM_NOTE = ("p: the paired t-test's; Holm: adjusted over the method's cells of this table (Holm's step-down), "
             "its verdict above/below where under 0.05, else level; 'split': the seeds' differences fall into "
             f"separate modes (a gap between sorted values over {SPLIT_K:g} times the spread within the two sides), "
             "where a mean and t-interval describe neither mode.")


def versus_grid(key: str, cross: list[Crossover], metric: str, labels: dict[float, str] | None = None) -> str:
    """Methods as rows, values of the key as columns (``labels``: a column's name by
    its x): the paired difference with its 95% interval and seeds, in bold where the
    verdict is above or below."""
    xs = sorted({p.x for c in cross for p in c.points})
    head = [labels[x] if labels else _num(x) for x in xs]
    lines = [f"| method \\ {key} | " + " | ".join(head) + " |", "|---|" + "---|" * len(xs)]
    for c in cross:
        at = {p.x: p for p in c.points}
        cells = []
        for x in xs:
            p = at.get(x)
            if p is None:
                cells.append("–")
                continue
            text = f"{100 * p.diff.mean:+.2f} {_ci(p.diff)} ({p.n}{', split' if p.modes else ''})"
            text = f"**{text}**" if p.verdict != "level" else text
            cells.append(text + (f" Holm: {p.holm_verdict}" if p.verdict != "level" else ""))
        lines.append(f"| {c.method} | " + " | ".join(cells) + " |")
    base = cross[0].baseline if cross else "the baseline"
    return "\n".join(lines) + (f"\n\n{metric}: method minus {base}, paired by seed, in points, mean, 95% "
                                "t-interval and (seeds); bold where the interval excludes 0 (above or below), "
                                "else level; beside a bold cell its verdict under Holm (adjusted over the row's "
                                "cells: level where the correction takes it back). 'split': the seeds' differences "
                                f"fall into separate modes (a gap between sorted values over {SPLIT_K:g} times the "
                                "spread within the two sides).\n")


def verdicts_grid(key: str, y: str, cross: list[Crossover], metric: str) -> str:
    """Every method against the baseline in one table: methods as rows, the cells (y x
    key) as columns, each the mean paired difference in points and its verdict under
    Holm, and per method the count of cells above, level and below. An overview over
    methods; each method's own table has the intervals and p values."""
    cells = sorted({(p.y, p.x) for c in cross for p in c.points})
    by: dict[str, dict[tuple, Paired]] = {}
    for c in cross:
        for p in c.points:
            by.setdefault(_base_label(p, y), {})[(p.y, p.x)] = p
    head = [f"{_num(yv)} x {_num(xv)}" for yv, xv in cells]
    lines = [f"| method \\ {y} x {key} | " + " | ".join(head) + " | above / level / below |",
             "|---|" + "---|" * (len(cells) + 1)]
    for method, at in by.items():
        row, n = [], {"above": 0, "level": 0, "below": 0}
        for cell in cells:
            p = at.get(cell)
            if p is None:
                row.append("–")
                continue
            n[p.holm_verdict] += 1
            text = f"{100 * p.diff.mean:+.1f} {p.holm_verdict}" + (" (split)" if p.modes else "")
            row.append(f"**{text}**" if p.holm_verdict != "level" else text)
        lines.append(f"| {method} | " + " | ".join(row) + f" | {n['above']} / {n['level']} / {n['below']} |")
    base = cross[0].baseline.split(",")[0] if cross else "the baseline"
    return "\n".join(lines) + (f"\n\n{metric}: method minus {base}, paired by seed, mean in points and the "
                                "verdict under Holm over the method's cells (bold: above or below); '(split)': "
                                "the seeds' differences fall into separate modes. Intervals and p values: each "
                                "method's own table.\n")


def markdown(key: str, metric: str, cs: list[Curve], ddof: int) -> str:
    """Methods as rows, values of the key as columns, mean ± std in percent."""
    xs = sorted({x for c in cs for x in c.x})
    lines = [f"| method \\ {key} | " + " | ".join(_num(x) for x in xs) + " |", "|---|" + "---|" * len(xs)]
    for c in cs:
        cells = []
        for x in xs:
            v = c.at(x)
            if v is None:
                cells.append("–")
                continue
            n = len(c.seeds[c.x.index(x)])
            cells.append(f"{100 * v[0]:.2f}" + ("" if math.isnan(v[1]) else f" ± {100 * v[1]:.2f}") + f" [{n}]")
        lines.append(f"| {c.label} | " + " | ".join(cells) + " |")
    what = "sample std" if ddof == 1 else f"std with ddof={ddof}"
    lines += ["", f"{metric} in %, mean ± std over seeds ({what}); [n]: seeds."]
    return "\n".join(lines) + "\n"


def log_x(xs: list[float]) -> bool:
    """A log axis when the values are positive and span a decade or more."""
    return bool(xs) and min(xs) > 0 and max(xs) / min(xs) >= LOG_SPAN


def plot(path: Path, key: str, metric: str, cs: list[Curve]) -> Path:
    plt, fig, ax = axes(7)
    for c in cs:
        x, m = np.array(c.x), 100 * np.array(c.mean)
        s = 100 * np.nan_to_num(np.array(c.std))
        line, = ax.plot(x, m, marker="o", label=c.label)
        ax.fill_between(x, m - s, m + s, color=line.get_color(), alpha=0.2)
    xs = [x for c in cs for x in c.x]
    if log_x(xs):
        ax.set_xscale("log")
        ticks = sorted(set(xs))
        ax.set_xticks(ticks, [_num(t) for t in ticks])
        ax.minorticks_off()
    return finish(plt, fig, ax, path, key, f"{metric} (%)", f"{metric} vs {key} (mean ± std over seeds)")


# partitions whose clients fall into data.n_clusters groups (client i in group i % k)
GROUPED = ("clusters", "noisy_clusters", "permuted_clusters", "feature_shift")


def groups_of(configs: list[dict[str, Any]]) -> int | None:
    """The number of groups the runs' clients fall into, where every run has the same
    one under a grouped partition (:data:`GROUPED`; a key a config leaves out has its
    default), else None."""
    from mpifl.analysis.summary import defaults

    d = defaults()
    seen = {(c.get("data.partition", d["data.partition"]), c.get("data.n_clusters", d["data.n_clusters"]),
             c.get("data.name", d["data.name"])) for c in configs}
    if len(seen) != 1:
        return None
    partition, k, name = seen.pop()
    # domains: data.n_clusters stand-in domains where the data records none of its own
    return int(k) if partition in GROUPED or (partition == "domains" and name not in OWN_DOMAINS) else None


# data whose samples carry domains of their own (a domains partition follows them, not n_clusters)
OWN_DOMAINS = ("digit5", "office10", "features")


def axis(key: str, values: list[float], groups: int | None) -> tuple[str, list[str]]:
    """An axis's label and tick labels in the reader's units: clients per group for
    ``data.n_clients`` (with ``groups``), samples per client for
    ``data.train_per_client``, else the key and its values."""
    if key == "data.n_clients" and groups:
        return f"clients per group ({key} / {groups} groups)", [_num(v / groups) for v in values]
    if key == "data.train_per_client":
        return f"training samples per client ({key})", [_num(v) for v in values]
    return key, [_num(v) for v in values]


def share_heatmaps(out: Path, key: str, y: str, cross: list[Crossover], ceiling: str,
                   groups: int | None = None) -> list[Path]:
    """Per method, its gain share over (y, x): the mean in each cell with its interval,
    both verdicts and the seeds beneath, hatched where the verdict under Holm is level
    (a colour there is no finding), grey where no share is given; axes in the reader's
    units (:func:`axis`; ``groups``: how many groups ``data.n_clients`` is split into)."""
    plt = pyplot()
    by: dict[str, list[Paired]] = {}
    for c in cross:
        for p in c.points:
            by.setdefault(_base_label(p, y), []).append(p)
    paths = []
    for method, ps in by.items():
        xs, ys = sorted({p.x for p in ps}), sorted({p.y for p in ps})
        grid = np.full((len(ys), len(xs)), np.nan)
        fig, ax = plt.subplots(figsize=(1.7 * len(xs) + 2.4, 1.2 * len(ys) + 1.8))
        for p in ps:
            i, j = ys.index(p.y), xs.index(p.x)
            if p.share is not None:
                grid[i, j] = p.share.mean
                text = f"{100 * p.share.mean:.0f}%\n{_ci(p.share, 100, 0)}"
            else:
                text = p.no_share
            if p.holm_verdict == "level":
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", edgecolor="0.45",
                                           linewidth=0))
            ax.text(j, i, f"{text}\n{_verdicts(p)}\n[{p.n}]", ha="center", va="center", fontsize=8,
                    bbox={"facecolor": "white", "alpha": 0.6, "edgecolor": "none", "pad": 1})
        cmap = plt.get_cmap("RdYlGn").copy()
        cmap.set_bad("0.85")
        im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=-1, vmax=1, origin="lower", aspect="auto")
        xlabel, xticks = axis(key, xs, groups)
        ylabel, yticks = axis(y, ys, groups)
        ax.set_xticks(range(len(xs)), xticks)
        ax.set_yticks(range(len(ys)), yticks)
        fig.colorbar(im, ax=ax, label=f"share of the room ({ceiling} - {cross[0].baseline.split(',')[0]})")
        path = out / ("share_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", method) + ".png")
        paths.append(finish(plt, fig, ax, path, xlabel, ylabel,
                            "\n".join(textwrap.wrap(f"{method}:", 70)) + "\ngain share (mean, 95% bootstrap, "
                            "verdict, [seeds]);\nhatched: level under Holm", legend=False))
    return paths


def compute(runs: list[Summary], key: str, grouping: Grouping, metric: str = "final_acc",
            versus: str | None = None, methods: list[str] = (), ddof: int = 1, ceiling: str | None = None,
            y: str | None = None, where: dict[str, str] | None = None
            ) -> tuple[list[str], list[Curve], list[Crossover]]:
    """The grouping keys, the curves and the crossovers; raises :class:`CurveError`
    on a key or a method the runs cannot give, before anything is written."""
    keys, cs = curves(runs, key, grouping, metric, ddof, y)
    return keys, cs, crossovers(keys, cs, versus, list(methods), ceiling, where) if versus else []


def left_out_line(runs: list[Summary]) -> str:
    """One line naming the runs that are not complete, or ''."""
    left = [r for r in runs if not r.complete]
    if not left:
        return ""
    return (f"Left out, not complete ({len(left)}): " +
            ", ".join(f"{r.name} ({r.rounds_done}/{r.rounds_planned or '?'} rounds)" for r in left))


def write_versus(out: Path, key: str, cross: list[Crossover], metric: str, y: str | None = None,
                 ceiling: str | None = None, groups: int | None = None,
                 where: dict[str, str] | None = None) -> tuple[str, list[Path]]:
    """``versus.csv``, ``versus.md`` and, with a ceiling and ``y``, the share heatmaps
    under ``out``: the Markdown table and the files written."""
    vs = versus_markdown(key, cross, y, ceiling, metric, where)
    write_versus_csv(out / "versus.csv", cross, y, ceiling is not None)
    (out / "versus.md").write_text(vs)
    made = [out / "versus.csv", out / "versus.md"]
    if ceiling and y:
        made += share_heatmaps(out, key, y, cross, ceiling, groups)
    return vs, made


def report(runs: list[Summary], key: str, grouping: Grouping, out: Path, metric: str = "final_acc",
           versus: str | None = None, methods: list[str] = (), ddof: int = 1, echo=print,
           ceiling: str | None = None, y: str | None = None, where: dict[str, str] | None = None) -> dict[str, Any]:
    """Curves of ``metric`` over ``key``: files under ``out``, the tables and the
    crossovers echoed; returns what was made."""
    keys, cs, cross = compute(runs, key, grouping, metric, versus, methods, ddof, ceiling, y, where)
    out.mkdir(parents=True, exist_ok=True)
    base = out / stem(key)
    write_csv(base.with_suffix(".csv"), key, metric, cs)
    md = markdown(key, metric, cs, ddof)
    made = [base.with_suffix(".csv"), base.with_suffix(".md")]
    if cross:
        md += "\nCrossover (above: the paired 95% interval of the difference lies above 0):\n\n" + \
            "".join(f"- {c.sentence(key)}\n" for c in cross)
        vs, files = write_versus(out, key, cross, metric, y, ceiling, groups_of([r.config for r in runs if r.complete]),
                                 where)
        md += "\n" + vs
        made += files
    left = left_out_line(runs)
    if left:
        md += "\n" + left + "\n"
    base.with_suffix(".md").write_text(md)
    png = plot(base.with_suffix(".png"), key, metric, cs)
    made.append(png)
    echo(md, end="")
    echo("wrote " + ", ".join(str(p) for p in made))
    return {"keys": keys, "curves": cs, "crossovers": cross, "figure": png, "files": made}
