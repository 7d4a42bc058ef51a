"""A results table in a paper's layout: rows are methods, columns are settings,
each cell our mean ± std over seeds with the paper's reported figure beside it.

    python -m mpifl.analyze results/pfedlia-table1 --layout jobs/tables/pfedlia-table1.layout.yaml

A layout file (YAML) says which runs make which cell and what the paper reported::

    title: pFedLIA Table I, Fashion-MNIST columns
    metric: final_acc          # a column of the analysis: final_acc, tail_acc, best_acc (+ _w)
    columns:                   # label -> the config values of the runs in that column
      Pathological: {data.partition: clusters}
      Noisy: {data.partition: noisy_clusters}
    rows:                      # label -> the config values of the runs in that row
      Oracle: {algorithm.name: oracle}
      pFedLIA: {algorithm.name: pfedlia, pfedlia.mode: central}
    paper:                     # optional: row -> column -> [mean, std] in %, where the
      Oracle: {Pathological: [99.07, 0.21]}   # paper's setting is ours

A table of cluster recovery instead (``metric: ari``) names, per row, the clustering
whose ARI against the true clusters each cell holds (a key of the analysis's ``ari_*``
columns; methods cluster in different places)::

    metric: ari
    ari:
      pFedLIA: lia.cluster      # the server's OPTICS clusters
      FeSEM: fesem.cluster

A cell holds every finished run matching both its row and its column (seeds); a run
matching several rows or none is reported, not silently dropped. A run still going
(or stopped) is not averaged in: its cell says how many such runs it is waiting for
(``+1 unfinished``), so a part-way sweep never passes for a finished one; a sweep
point whose ``--local`` run exited non-zero shows as ``failed (exit N)``, apart
from ``not run``. Beside each
paper figure the cell says whether ours lies within the paper's std of it
(``=``), or by how many points it is above (``+``) or below (``-``); under each
column, the order of the methods by our means and by the paper's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mpifl.errors import ConfigError
from mpifl.paths import RunDir
from mpifl.sweep.status import PREEMPTED, exit_marker
from mpifl.yamlio import read_yaml

if TYPE_CHECKING:
    from mpifl.analysis.summary import Summary

METRICS = ("final_acc", "final_acc_w", "tail_acc", "tail_acc_w", "best_acc", "best_acc_w", "ari")


class LayoutError(ConfigError):
    """A layout file that cannot be used: one line naming the file and the key."""


@dataclass
class Layout:
    title: str
    metric: str
    rows: dict[str, dict[str, Any]]
    columns: dict[str, dict[str, Any]]
    paper: dict[str, dict[str, tuple[float, float]]]
    ari: dict[str, str] = field(default_factory=dict)  # metric "ari": row -> its clustering's source

    def metric_of(self, row: str) -> str:
        """The metric of a row's cells (``mpifl.analysis.summary.metric_value``)."""
        return f"ari:{self.ari[row]}" if self.metric == "ari" else self.metric


def load_layout(path: str | Path) -> Layout:
    p = Path(path)
    try:
        raw = read_yaml(p, f"layout {str(p)!r}")
    except ConfigError as e:
        raise LayoutError(str(e)) from None
    if not isinstance(raw, dict):
        raise LayoutError(f"layout {str(p)!r} must hold a mapping")
    unknown = sorted(set(raw) - {"title", "metric", "rows", "columns", "paper", "ari"})
    if unknown:
        raise LayoutError(f"layout {str(p)!r}: unknown key {unknown[0]!r}; valid keys: title, metric, rows, "
                          "columns, paper, ari")
    metric = raw.get("metric", "final_acc")
    if metric not in METRICS:
        raise LayoutError(f"layout {str(p)!r}: metric={metric!r} is not allowed; one of {', '.join(METRICS)}")

    def matches(key: str) -> dict[str, dict[str, Any]]:
        m = raw.get(key)
        if not isinstance(m, dict) or not m or not all(isinstance(v, dict) for v in m.values()):
            raise LayoutError(f"layout {str(p)!r}: {key} must map labels to {{config.key: value}} mappings")
        return {str(k): v for k, v in m.items()}

    rows, columns = matches("rows"), matches("columns")
    paper: dict[str, dict[str, tuple[float, float]]] = {}
    for row, cells in (raw.get("paper") or {}).items():
        if str(row) not in rows or not isinstance(cells, dict):
            raise LayoutError(f"layout {str(p)!r}: paper.{row} names no row of the layout")
        for col, fig in cells.items():
            ok = str(col) in columns and isinstance(fig, list) and len(fig) == 2 \
                and all(isinstance(v, (int, float)) for v in fig)
            if not ok:
                raise LayoutError(f"layout {str(p)!r}: paper.{row}.{col} must be [mean, std] of a column")
            paper.setdefault(str(row), {})[str(col)] = (float(fig[0]), float(fig[1]))
    ari = raw.get("ari") or {}
    if metric == "ari":
        if not isinstance(ari, dict) or set(map(str, ari)) != set(rows) \
                or not all(isinstance(v, str) and v for v in ari.values()):
            raise LayoutError(f"layout {str(p)!r}: metric=ari needs ari: mapping every row ({', '.join(rows)}) to "
                              "the source of its clusters (an ari_* column of the analysis without 'ari_', "
                              "e.g. lia.cluster)")
        if paper:
            raise LayoutError(f"layout {str(p)!r}: paper figures are accuracies in %; a metric=ari table has none")
    elif ari:
        raise LayoutError(f"layout {str(p)!r}: ari: names sources for metric=ari only (metric is {metric!r})")
    return Layout(str(raw.get("title", p.stem)), metric, rows, columns, paper, {str(k): v for k, v in ari.items()})


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b))
    return str(a) == str(b)


def _match(config: dict[str, Any], want: dict[str, Any]) -> bool:
    return all(k in config and _same(config[k], v) for k, v in want.items())


@dataclass
class Cell:
    values: list[float]  # the metric of each finished run, in % (an ARI as it is)
    seeds: list[int]
    unfinished: list[str] = field(default_factory=list)  # "name (done/planned rounds)"
    failed: list[int] = field(default_factory=list)  # exit statuses of its points that ran and failed
    runs: list[Summary] = field(default_factory=list)  # the finished runs behind ``values``, in their order

    def stats(self, ddof: int) -> tuple[float, float]:
        x = np.array(self.values, float)
        x = x[~np.isnan(x)]
        if len(x) == 0:
            return math.nan, math.nan
        return float(x.mean()), float(x.std(ddof=ddof)) if len(x) > ddof else math.nan


def _place(layout: Layout, config: dict[str, Any]) -> tuple[list[str], list[str]]:
    return ([k for k, want in layout.rows.items() if _match(config, want)],
            [k for k, want in layout.columns.items() if _match(config, want)])


def cells(layout: Layout, runs: list[Summary], failed: list[Failed] = ()) -> tuple[dict[tuple[str, str], Cell],
                                                                                    list[str]]:
    """The runs of every (row, column); and one line per run that fits no cell or several.
    ``failed``: points that ran and exited non-zero (:func:`failed_points`):
    their cell says so rather than "not run", or counts them instead of as unfinished."""
    from mpifl.analysis.summary import metric_value

    out: dict[tuple[str, str], Cell] = {}
    notes = []
    failed_at = {Path(f.run_dir).resolve(): f for f in failed}
    for f in failed:
        rows, cols = _place(layout, f.config)
        if len(rows) == 1 and len(cols) == 1 and not any(Path(r.path).parent.resolve() == Path(f.run_dir).resolve()
                                                         and r.complete for r in runs):
            out.setdefault((rows[0], cols[0]), Cell([], [])).failed.append(f.rc)
    for r in runs:
        if not r.complete and Path(r.path).parent.resolve() in failed_at:
            continue  # counted above, as failed
        rows = [k for k, want in layout.rows.items() if _match(r.config, want)]
        cols = [k for k, want in layout.columns.items() if _match(r.config, want)]
        if len(rows) != 1 or len(cols) != 1:
            why = "no row" if not rows else "no column" if not cols else f"rows {rows} / columns {cols}"
            notes.append(f"{r.name} (seed {r.seed}) is in no single cell: {why}")
            continue
        unfinished = r.rounds_planned is not None and not r.complete  # its metric is a mid-run figure
        metric = layout.metric_of(rows[0])
        if not unfinished and metric.startswith("ari:") and metric[4:] not in r.ari:  # a NaN would pass for a seed
            notes.append(f"{r.name} (seed {r.seed}) has no clustering {metric[4:]!r} to score (it has: "
                         f"{', '.join(sorted(r.ari)) or 'none'})")
            continue
        c = out.setdefault((rows[0], cols[0]), Cell([], []))
        if unfinished:
            c.unfinished.append(f"{r.name} ({r.rounds_done}/{r.rounds_planned} rounds)")
            continue
        c.values.append(metric_value(r, metric))
        c.seeds.append(r.seed)
        c.runs.append(r)
    return out, notes


def _verdict(ours: float, paper: tuple[float, float]) -> str:
    diff = ours - paper[0]
    return "=" if abs(diff) <= paper[1] else f"{diff:+.2f}"


def _order(means: dict[str, float]) -> str:
    ok = [(m, k) for k, m in means.items() if not math.isnan(m)]
    return " > ".join(k for _, k in sorted(ok, key=lambda x: -x[0]))


def _failed(cell: Cell) -> str:
    """``failed (exit 2)``, ``2 failed (exit 2, 1)``."""
    n = len(cell.failed)
    return f"{n if n > 1 else ''} failed (exit {', '.join(map(str, sorted(set(cell.failed))))})".lstrip()


def render(layout: Layout, runs: list[Summary], ddof: int = 1, failed: list[Failed] = ()) -> str:
    """The table as Markdown, with the paper's figures and the method orders;
    ``failed``: points that ran and failed (:func:`cells`)."""
    return render_cells(layout, *cells(layout, runs, failed), ddof)


def render_cells(layout: Layout, got: dict[tuple[str, str], Cell], notes: list[str], ddof: int = 1) -> str:
    """The table of cells already gathered (from runs, or from a record: :mod:`mpifl.analysis.record`)."""
    cols = list(layout.columns)
    lines = [f"### {layout.title}", "",
             "| method | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    ours: dict[str, dict[str, float]] = {c: {} for c in cols}
    digits = 3 if layout.metric == "ari" else 2
    for row in layout.rows:
        cells_md = []
        for col in cols:
            cell = got.get((row, col))
            fig = layout.paper.get(row, {}).get(col)
            paper = f" (paper {fig[0]:.2f} ± {fig[1]:.2f})" if fig else ""
            if cell is None:
                cells_md.append("not run" + paper)
                continue
            if not cell.values:
                parts = [f"{len(cell.unfinished)} unfinished"] * bool(cell.unfinished) \
                    + [_failed(cell)] * bool(cell.failed)
                cells_md.append(", ".join(parts) + paper)
                continue
            waiting = f" +{len(cell.unfinished)} unfinished" if cell.unfinished else ""
            waiting += f" +{_failed(cell)}" if cell.failed else ""
            mean, std = cell.stats(ddof)
            ours[col][row] = mean
            text = f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if not math.isnan(std) else "") \
                + f" [{len(cell.values)}]"
            text += waiting
            if fig and not math.isnan(mean):
                text += f"{paper} {_verdict(mean, fig)}"
            cells_md.append(text)
        lines.append(f"| {row} | " + " | ".join(cells_md) + " |")
    std = 'sample std' if ddof == 1 else f'ddof={ddof}'
    if layout.metric == "ari":
        lines += ["", f"ARI of each row's clusters against the true ones (1: recovered, 0: chance), mean ± std over "
                  f"seeds ({std}); [n]: seeds. Sources: "
                  + "; ".join(f"{row}: `{src}`" for row, src in layout.ari.items()) + "."]
    else:
        lines += ["", f"{layout.metric} in %, mean ± std over seeds ({std}); "
                  "[n]: seeds; `=`: within the paper's std of its figure, else ours minus the paper's in points."]
    for col in cols:
        paper_means = {row: figs[col][0] for row, figs in layout.paper.items() if col in figs}
        if len(paper_means) > 1:
            mine = {k: v for k, v in ours[col].items() if k in paper_means}
            same = _order(mine) == _order(paper_means)
            lines.append(f"- {col}: ours {_order(mine)}; paper {_order(paper_means)}"
                         + (" (same order)" if same else ""))
    lines += [f"- {n}" for n in notes]
    lines += [f"- unfinished, not averaged: {u} in {row} / {col}"
              for (row, col), cell in got.items() for u in cell.unfinished]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- points that ran and failed


@dataclass
class Failed:
    run_dir: Path
    name: str
    config: dict  # flattened, as mpifl.analysis.summary.Summary.config
    rc: int  # the exit status --local recorded (mpifl.sweep.status.mark_finished)


def _sweep_roots(paths: list) -> list[Path]:
    roots = []
    for p in map(Path, paths):
        if (p / "runs.txt").is_file():
            roots.append(p)
        elif p.is_dir() and p.name == "runs" and (p.parent / "runs.txt").is_file():
            roots.append(p.parent)
    return roots


def failed_points(paths: list) -> list[Failed]:
    """The points of the sweep directories among ``paths`` whose last ``--local``
    run exited non-zero (not preempted), with their configs: ``analyze --layout``
    tells a point that ran and failed from one never run."""
    from mpifl.analysis.summary import defaults, sweep_points
    from mpifl.config.identity import flatten

    out = []
    for root in _sweep_roots(paths):
        values = sweep_points(root) or {}
        for i, line in enumerate((root / "runs.txt").read_text().splitlines()):
            run_dir = Path(line.strip())
            try:
                rc = int(exit_marker(root / "logs", i).read_text().split()[0])
                cfg = read_yaml(RunDir(run_dir).config, "a point's config")
            except (OSError, ValueError, IndexError):  # never run here, or markers of another shape
                continue
            if rc in (0, PREEMPTED) or not isinstance(cfg, dict):
                continue
            flat = {**defaults(), **flatten(cfg)}
            base = (values.get(run_dir.name) or {}).get("base")
            if base is not None:
                flat["job"] = Path(str(base)).stem  # mpifl.analysis.summary.JOB, as sweep_job names it
            out.append(Failed(run_dir, run_dir.name, flat, rc))
    return out
