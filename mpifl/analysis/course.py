"""The time course of a paired comparison, and best-validation accuracy beside the
final one: ``python -m mpifl.analyze SWEEP_DIR --x KEY [--y KEY2] --versus NAME``
writes both beside ``versus.csv``.

The last round hides how a method got there: one that finds its partners and then
collapses ends level with Local having been far above it. So, per method and cell
(each value of KEY, and of KEY2), the paired difference against the baseline is
taken at every evaluated round (test accuracy, mean over clients; per seed, method
minus baseline; mean and 95% t-interval, ``mpifl.analysis.stats``):

- ``course.csv``: columns ``method, [KEY2,] x, round, n_seeds, diff_mean,
  ci_low, ci_high`` (fractions; rounds numbered from 1);
- ``course.png``: one panel per cell, the difference against the round per
  method, its interval shaded.

A record carries the course at fixed rounds (:data:`COURSE`, rule in
:func:`course_rounds`) as metrics ``test_acc@R``, and ``generated:course``
blocks render it from there.

Best-validation accuracy (``best.csv``, ``best.md``): per method and cell, the
final accuracy, ``best_acc`` (each client's test accuracy at the round of its best
validation accuracy, DPFL's reporting), best minus final paired by seed (how
much the method fell from its best), and best minus **Local+ES**: the baseline
stopped at the round of its own best mean validation accuracy
(``mpifl.analysis.summary.ES``). A method whose reported number selects on
validation is compared with a baseline that may select on it too, not with the
baseline's last round.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mpifl.analysis import curves as cv
from mpifl.analysis.figure import pyplot, save
from mpifl.analysis.record import NOT_IN_RECORD
from mpifl.analysis.summary import ES

# The fixed rounds a record carries: of these, the ones a run evaluated, and its last
# evaluated round whatever its length, so a run of 60 rounds gives 10, 30, 60 and one
# of 2 rounds gives 2. Chosen for the room sweeps (150 rounds, first fixed at 60).
COURSE = (10, 30, 60, 100, 150)


def course_rounds(rounds: np.ndarray, curve: np.ndarray) -> list[int]:
    """The rounds (numbered from 1) a run's record carries: each of :data:`COURSE` the
    run evaluated (``curve`` not NaN at ``rounds`` = R - 1), and its last evaluated round."""
    done = [int(r) + 1 for r, v in zip(rounds, curve) if not math.isnan(float(v))]
    return sorted({r for r in COURSE if r in done} | set(done[-1:]))


def course_metrics(runs: list) -> tuple[str, ...]:
    """``test_acc@R`` for every round any of the runs' records carries, in order."""
    rounds = sorted({r for s in runs if s.complete for r in course_rounds(s.rounds, s.curve)})
    return tuple(f"test_acc@{r}" for r in rounds)


@dataclass
class Step:
    family: str  # the method (without its --y part)
    y: float | None
    x: float
    round: int  # from 1
    n: int
    mean: float
    low: float
    high: float


Curves = Callable[[str], tuple[list[str], list[cv.Curve]]]  # metric -> (grouping keys, curves), as cv.curves


def paired_course(curves_at: Curves, rounds: list[int], versus: str, methods: list[str] = (),
                  where: dict[str, str] | None = None) -> list[Step]:
    """Each method minus ``versus`` at each of ``rounds``: ``curves_at(metric)`` gives the
    curves of ``test_acc@R`` (as :func:`mpifl.analysis.curves.curves` makes them). A
    round the baseline or a named method lacks is left out."""
    out = []
    for r in rounds:
        keys, cs = curves_at(f"test_acc@{r}")
        try:
            cross = cv.crossovers(keys, cs, versus, list(methods), where=where)
        except cv.CurveError:
            continue
        out += [Step(p.family, p.y, p.x, r, p.n, p.diff.mean, p.diff.low, p.diff.high)
                for c in cross for p in c.points]
    return out


def write_course_csv(path: Path, steps: list[Step], y: str | None) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", *([y] if y else []), "x", "round", "n_seeds", "diff_mean", "ci_low", "ci_high"])
        for s in steps:
            w.writerow([s.family, *([cv._num(s.y)] if y else []), cv._num(s.x), s.round, s.n, cv._g(s.mean),
                        cv._g(s.low), cv._g(s.high)])


def plot_course(path: Path, steps: list[Step], key: str, y: str | None, versus: str,
                groups: int | None = None) -> Path:
    """One panel per cell (rows: values of ``y``, largest on top; columns: values of
    ``key``): each method's paired difference against the round, interval shaded."""
    plt = pyplot()
    xs = sorted({s.x for s in steps})
    ys = sorted({s.y for s in steps}, key=lambda v: -math.inf if v is None else v, reverse=True)
    fig, axs = plt.subplots(len(ys), len(xs), figsize=(max(5.0, 3.2 * len(xs) + 1), 2.6 * len(ys) + 1.2),
                            squeeze=False,
                            sharex=True)
    xl, xt = cv.axis(key, xs, groups)
    yl, yt = cv.axis(y, [v for v in ys if v is not None], groups) if y else ("", [])
    families = list(dict.fromkeys(s.family for s in steps))
    colours = {f: plt.get_cmap("tab10")(i % 10) for i, f in enumerate(families)}
    for i, yv in enumerate(ys):
        for j, xv in enumerate(xs):
            ax = axs[i][j]
            ax.axhline(0, color="0.4", linewidth=0.8)
            for f in families:
                cell = sorted((s for s in steps if s.family == f and s.x == xv and s.y == yv), key=lambda s: s.round)
                if not cell:
                    continue
                r = np.array([s.round for s in cell])
                ax.plot(r, [100 * s.mean for s in cell], color=colours[f], label=f, marker="." if len(r) < 20 else "")
                ax.fill_between(r, [100 * s.low for s in cell], [100 * s.high for s in cell], color=colours[f],
                                alpha=0.2)
            ax.set_title((f"{yl.split(' (')[0]} {yt[i]}, " if y else "") + f"{xl.split(' (')[0]} {xt[j]}",
                         fontsize=8)
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel(f"minus {versus} (points)", fontsize=8)
            if i == len(ys) - 1:
                ax.set_xlabel("round", fontsize=8)
    axs[0][0].legend(fontsize=7)
    fig.suptitle(f"test accuracy minus {versus}, paired by seed:\nmean and 95% interval per round", fontsize=10)
    return save(plt, fig, path)


@dataclass
class Best:
    family: str
    y: float | None
    x: float
    final: cv.Paired | None  # method's best minus its final (a paired interval), its n
    vs_es: cv.Paired | None  # method's best minus the baseline's es_acc
    final_mean: float
    best_mean: float


def best_rows(curves_of: Curves, versus: str, methods: list[str] = (),
              where: dict[str, str] | None = None) -> list[Best]:
    """Per method and cell: final and best-validation accuracy, best minus final paired
    by seed, and best minus the baseline's Local+ES (NaN-free cells only; the baseline's
    ``es_acc`` missing gives ``vs_es`` None)."""
    keys, final = curves_of("final_acc")
    best = curves_of("best_acc")[1]
    try:
        es = curves_of(ES)[1]
    except ValueError:  # a record made before es_acc was recorded: the floor is not in it
        es = []
    names = {c.method[0] for c in final}
    if versus not in names:
        raise cv.CurveError(f"--versus {versus}: no runs of algorithm.name={versus}; the runs have "
                            f"{', '.join(sorted(names))}")
    out = []
    for f in final:
        if f.method[0] == versus or (methods and f.method[0] not in methods):
            continue
        b = next((c for c in best if c.label == f.label), None)
        base_es = cv._partner(f, keys, es, versus, where)
        for x in f.x:
            if b is None or x not in b.x:
                continue
            out.append(Best(f.family, f.y, x, cv.paired(b, f, x), cv.paired(b, base_es, x) if base_es else None,
                            f.at(x)[0], b.at(x)[0]))
    return out


def _cell(p: cv.Paired | None) -> str:
    return NOT_IN_RECORD if p is None else f"{100 * p.diff.mean:+.2f} {cv._ci(p.diff)} {p.verdict}"


def best_markdown(rows: list[Best], key: str, y: str | None, versus: str, where: dict[str, str] | None = None) -> str:
    cols = ["method", *([y] if y else []), key, "seeds", "final", "best-val", "best - final (95% CI)",
            f"best - {versus}+ES (95% CI)"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        n = r.final.n if r.final else 0
        lines.append("| " + " | ".join([r.family, *([cv._num(r.y)] if y else []), cv._num(r.x), str(n),
                                        f"{100 * r.final_mean:.2f}", f"{100 * r.best_mean:.2f}", _cell(r.final),
                                        _cell(r.vs_es)]) + " |")
    return "\n".join(lines) + (
        f"\n\nIn %, mean over seeds: final = last round's test accuracy (mean over clients); best-val = each "
        f"client's test accuracy at the round of its best validation accuracy. Differences paired by seed, in "
        f"points, with the 95% t-interval and verdict; {versus}+ES: {versus}{cv.where_text(where)} stopped at "
        f"the round of its best mean validation accuracy, the floor for a method that selects on validation "
        f"({NOT_IN_RECORD!r}: a record made before it was recorded).\n")


def write_best_csv(path: Path, rows: list[Best], y: str | None) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", *([y] if y else []), "x", "n_seeds", "final_mean", "best_mean", "best_minus_final",
                    "bmf_low", "bmf_high", "best_minus_es", "bme_low", "bme_high", "verdict_vs_es"])
        for r in rows:
            d, e = r.final, r.vs_es
            w.writerow([r.family, *([cv._num(r.y)] if y else []), cv._num(r.x), d.n if d else 0,
                        cv._g(r.final_mean), cv._g(r.best_mean),
                        *([cv._g(d.diff.mean), cv._g(d.diff.low), cv._g(d.diff.high)] if d else ["", "", ""]),
                        *([cv._g(e.diff.mean), cv._g(e.diff.low), cv._g(e.diff.high), e.verdict] if e
                          else [NOT_IN_RECORD, "", "", ""])])


def report(runs: list, key: str, grouping: cv.Grouping, out: Path, versus: str, methods: list[str] = (),
           y: str | None = None, echo=print, where: dict[str, str] | None = None) -> dict[str, Any]:
    """``course.csv``, ``course.png``, ``best.csv`` and ``best.md`` under ``out`` from the
    runs' logs (every evaluated round of the complete runs)."""
    done = [r for r in runs if r.complete]

    def curves_of(metric: str) -> tuple[list[str], list[cv.Curve]]:
        return cv.curves(done, key, grouping, metric, y=y)

    rounds = sorted({int(t) + 1 for r in done for t, v in zip(r.rounds, r.curve) if not math.isnan(float(v))})
    steps = paired_course(curves_of, rounds, versus, list(methods), where)
    groups = cv.groups_of([r.config for r in done])
    write_course_csv(out / "course.csv", steps, y)
    made = [out / "course.csv", plot_course(out / "course.png", steps, key, y, versus, groups)]
    best = best_rows(curves_of, versus, list(methods), where)
    write_best_csv(out / "best.csv", best, y)
    md = best_markdown(best, key, y, versus, where)
    (out / "best.md").write_text(md)
    made += [out / "best.csv", out / "best.md"]
    echo("\nBest-validation accuracy beside the final one:\n\n" + md, end="")
    echo("wrote " + ", ".join(str(p) for p in made))
    return {"steps": steps, "best": best, "files": made}


# --------------------------------------------------------------------------- from a record


def _record_curves(path: str, root: Path, x: str, y: str | None) -> Curves:
    from mpifl.analysis import record as rec

    def curves_of(metric: str) -> tuple[list[str], list[cv.Curve]]:
        _, _, cs, keys = rec._curves(path, root, x, y, metric)
        return keys, cs

    return curves_of


def render_course(path: str, root: Path, *, x: str, versus: str, y: str | None = None,
                  methods: tuple[str, ...] = (), rounds: tuple[int, ...] = COURSE,
                  where: dict[str, str] | None = None) -> str:
    """Each method minus ``versus`` at ``rounds`` from a record's ``test_acc@R`` rows: a
    table per method and cell, a column per round; one line saying so where the record
    holds none of them (a record made before the course was recorded)."""
    from mpifl.analysis import record as rec

    rows = rec.read_joined(path, root)
    have = [r for r in rounds if any(row.metric == f"test_acc@{r}" for row in rows)]
    if not have:
        return (f"The time course (test accuracy at rounds {', '.join(map(str, rounds))}) is {NOT_IN_RECORD}: "
                "`python -m mpifl.analyze ... --record FILE` records it.\n")
    steps = paired_course(_record_curves(path, root, x, y), have, versus, list(methods), where)
    cells: dict[tuple, dict[int, Step]] = {}
    for s in steps:
        cells.setdefault((s.family, s.y, s.x), {})[s.round] = s
    cols = ["method", *([y] if y else []), x, *(f"round {r}" for r in have)]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for (family, yv, xv), by in cells.items():
        vals = [f"{100 * by[r].mean:+.2f} {cv._ci(by[r])}" if r in by else "–" for r in have]
        out.append("| " + " | ".join([family, *([cv._num(yv)] if y else []), cv._num(xv), *vals]) + " |")
    shown = [r for r in rows if r.metric == f"test_acc@{have[0]}"]
    note = (f"\n\nTest accuracy (mean over clients) minus {versus}{cv.where_text(where)} at each round (from 1), "
            "paired by seed, in points, mean and 95% t-interval.\n\n")
    return "\n".join(out) + note + rec._provenance(shown)


def render_best(path: str, root: Path, *, x: str, versus: str, y: str | None = None,
                methods: tuple[str, ...] = (), where: dict[str, str] | None = None) -> str:
    """Best-validation accuracy beside the final one, from a record's ``final_acc``,
    ``best_acc`` and ``es_acc`` rows (:func:`best_rows`; ``es_acc`` missing: said)."""
    from mpifl.analysis import record as rec

    try:
        rows = best_rows(_record_curves(path, root, x, y), versus, list(methods), where)
    except cv.CurveError as e:
        raise rec.RecordError(f"record {path!r}: {e}") from None
    shown = [r for r in rec.read_joined(path, root) if r.metric == "final_acc"]
    return best_markdown(rows, x, y, versus, where) + "\n" + rec._provenance(shown)
