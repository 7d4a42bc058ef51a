"""Accuracy against a swept config key, per method, and where a method stops
beating a baseline: ``python -m mpifl.analyze SWEEP_DIR --x KEY [--versus NAME]``.

Runs are grouped into methods by ``algorithm.name`` and every other key that
varies between them (as ``mpifl.analyze`` groups), leaving out KEY and the seed;
each method's curve is, at every value of KEY, the mean ± std over seeds of the
summary metric (``--metric``, default ``final_acc``: the last evaluated round's
test accuracy, mean over clients, as the reproduction pages report). KEY must
hold numbers (``data.train_per_client``, ``train.lr``, ...). Only complete runs
(every planned round logged) make a point: a run still going or stopped would
give its last logged round as its final one; those left out are named.

Written to the analysis folder (names from the key, ``data.train_per_client`` ->
``curves_train_per_client.*``): a PNG (log x axis where the largest value is at
least 10 times the smallest), a CSV (fractions) and a Markdown table (percent).

Crossover, with ``--versus BASELINE`` (an ``algorithm.name``; ``--method NAME``,
repeatable, limits the methods reported, default all others): at each value of
KEY both have runs at, a method is *above* the baseline when its mean exceeds
the baseline's by more than the larger of the two seed stds, *below* likewise,
else *level*. Printed per method: the largest value at which it is above, and
the first value after it at which it no longer is (none: above up to the
largest value; never above: the smallest value). The baseline of a method is
the baseline's curve with the same values of the keys outside algorithm
sections (a sweep over job files compares within each file).
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .figure import finish, pyplot
from .summary import Summary

LOG_SPAN = 10  # a log x axis once max/min reaches this


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

    def at(self, x: float) -> tuple[float, float] | None:
        return (self.mean[self.x.index(x)], self.std[self.x.index(x)]) if x in self.x else None


@dataclass
class Crossover:
    method: str
    baseline: str
    signs: list[tuple[float, str, float]]  # (x, "above" | "level" | "below", mean difference)
    last_above: float | None  # the largest x at which the method is above
    no_longer: float | None  # the first x after last_above at which it is not; None: above to the end

    def sentence(self, key: str, scale: float = 100.0) -> str:
        xs = [x for x, _, _ in self.signs]
        pattern = ", ".join(f"{_num(x)}: {scale * d:+.2f} {s}" for x, s, d in self.signs)
        if not xs:
            return f"{self.method} vs {self.baseline}: no common value of {key}"
        if self.last_above is None:
            head = f"never above by more than the seeds' std ({key} {_num(xs[0])} to {_num(xs[-1])})"
        elif self.no_longer is None:
            head = f"above up to the largest {key} ({_num(self.last_above)})"
        else:
            head = f"above up to {key}={_num(self.last_above)}, no longer at {_num(self.no_longer)}"
        return f"{self.method} vs {self.baseline}: {head}; per value, points: {pattern}"


def _num(v: float) -> str:
    return f"{v:g}"


def _value(r: Summary, key: str) -> float:
    v = r.config.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise CurveError(f"--x {key}: run {r.name} has {key}={v!r}; the key must hold numbers")
    return float(v)


def _stats(values: list[float], ddof: int) -> tuple[float, float]:
    x = np.array([v for v in values if not math.isnan(v)], float)
    if len(x) == 0:
        return math.nan, math.nan
    return float(x.mean()), float(x.std(ddof=ddof)) if len(x) > ddof else math.nan


@dataclass
class Grouping:
    """How the analysis groups runs (``mpifl.analyze`` passes its own, so both
    group alike): the keys that vary (``algorithm.name`` first), a run's value of
    a key as a label, and the label of a key the run's algorithm never reads."""

    keys: list[str]
    setting: Callable[[Summary, str], str]
    not_applicable: str = "–"


def curves(runs: list[Summary], key: str, grouping: Grouping, metric: str = "final_acc",
           ddof: int = 1) -> tuple[list[str], list[Curve]]:
    """The grouping keys without ``key`` and one curve per method, x ascending."""
    if not any(key in r.config for r in runs):
        raise CurveError(f"--x {key}: no run's config has that key")
    runs = [r for r in runs if r.complete]
    if not runs:
        raise CurveError(f"--x {key}: no run is complete (every one is still going or stopped)")
    keys = [k for k in grouping.keys if k != key]
    by: dict[tuple[str, ...], dict[float, list[Summary]]] = {}
    for r in runs:
        by.setdefault(tuple(grouping.setting(r, k) for k in keys), {}).setdefault(_value(r, key), []).append(r)
    out = []
    for method, points in by.items():
        parts = [method[0]] + [f"{k}={v}" for k, v in zip(keys[1:], method[1:]) if v != grouping.not_applicable]
        c = Curve(method, ", ".join(parts))
        for x in sorted(points):
            rs = sorted(points[x], key=lambda r: r.seed)
            mean, std = _stats([getattr(r, metric) for r in rs], ddof)
            c.x.append(x)
            c.mean.append(mean)
            c.std.append(std)
            c.seeds.append([r.seed for r in rs])
        out.append(c)
    return keys, out


def compare(c: Curve, base: Curve) -> Crossover:
    signs = []
    for x in c.x:
        b = base.at(x)
        if b is None:
            continue
        (m, s), (bm, bs) = c.at(x), b
        d = m - bm
        spread = max(0.0 if math.isnan(s) else s, 0.0 if math.isnan(bs) else bs)
        signs.append((x, "above" if d > spread else "below" if d < -spread else "level", d))
    above = [x for x, s, _ in signs if s == "above"]
    last = max(above) if above else None
    later = [x for x, s, _ in signs if s != "above" and (last is None or x > last)]
    return Crossover(c.label, base.label, signs, last, min(later) if later else None)


def _baseline_for(c: Curve, keys: list[str], pool: list[Curve], name: str) -> Curve | None:
    """The baseline's curve that agrees with c on every key outside algorithm sections."""
    from .algorithms import NAMES

    shared = [i for i, k in enumerate(keys) if i > 0 and k.split(".", 1)[0] not in NAMES]
    for b in pool:
        if b.method[0] == name and all(b.method[i] == c.method[i] for i in shared):
            return b
    return None


def crossovers(keys: list[str], cs: list[Curve], versus: str, methods: list[str] = ()) -> list[Crossover]:
    names = {c.method[0] for c in cs}
    have = ", ".join(sorted(names))
    for flag, m in [("--versus", versus), *(("--method", m) for m in methods)]:
        if m not in names:
            raise CurveError(f"{flag} {m}: no runs of algorithm.name={m}; the runs have {have}")
    out = []
    for c in cs:
        if c.method[0] == versus or (methods and c.method[0] not in methods):
            continue
        base = _baseline_for(c, keys, cs, versus)
        if base is not None:
            out.append(compare(c, base))
    return out


# --------------------------------------------------------------------------- output


def stem(key: str) -> str:
    return "curves_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", key.rsplit(".", 1)[-1])


def rows(cs: list[Curve]) -> list[dict[str, Any]]:
    return [{"method": c.label, "x": x, "n_seeds": len(s), "seeds": " ".join(map(str, s)), "mean": m, "std": sd}
            for c in cs for x, m, sd, s in zip(c.x, c.mean, c.std, c.seeds)]


def write_csv(path: Path, key: str, metric: str, cs: list[Curve]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", key, "n_seeds", "seeds", f"{metric}_mean", f"{metric}_std"])
        for r in rows(cs):
            w.writerow([r["method"], _num(r["x"]), r["n_seeds"], r["seeds"], f"{r['mean']:.6g}",
                        "" if math.isnan(r["std"]) else f"{r['std']:.6g}"])


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
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
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


def compute(runs: list[Summary], key: str, grouping: Grouping, metric: str = "final_acc",
            versus: str | None = None, methods: list[str] = (), ddof: int = 1
            ) -> tuple[list[str], list[Curve], list[Crossover]]:
    """The grouping keys, the curves and the crossovers; raises :class:`CurveError`
    on a key or a method the runs cannot give, before anything is written."""
    keys, cs = curves(runs, key, grouping, metric, ddof)
    return keys, cs, crossovers(keys, cs, versus, list(methods)) if versus else []


def report(runs: list[Summary], key: str, grouping: Grouping, out: Path, metric: str = "final_acc",
           versus: str | None = None, methods: list[str] = (), ddof: int = 1, echo=print) -> dict[str, Any]:
    """Curves of ``metric`` over ``key``: files under ``out``, the table and the
    crossovers echoed; returns what was made."""
    keys, cs, cross = compute(runs, key, grouping, metric, versus, methods, ddof)
    out.mkdir(parents=True, exist_ok=True)
    base = out / stem(key)
    write_csv(base.with_suffix(".csv"), key, metric, cs)
    md = markdown(key, metric, cs, ddof)
    if cross:
        md += "\nCrossover (above: the mean exceeds the baseline's by more than the larger seed std):\n\n" + \
            "".join(f"- {c.sentence(key)}\n" for c in cross)
    left = [r for r in runs if not r.complete]
    if left:
        md += (f"\nLeft out, not complete ({len(left)}): " +
               ", ".join(f"{r.name} ({r.rounds_done}/{r.rounds_planned or '?'} rounds)" for r in left) + "\n")
    base.with_suffix(".md").write_text(md)
    png = plot(base.with_suffix(".png"), key, metric, cs)
    echo(md, end="")
    echo(f"wrote {base.with_suffix('.csv')}, {base.with_suffix('.md')} and {png}")
    return {"keys": keys, "curves": cs, "crossovers": cross, "figure": png}
