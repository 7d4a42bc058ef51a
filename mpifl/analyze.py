"""Tables and figures from run logs: ``python -m mpifl.analyze PATHS... [--out DIR]``.

PATHS are ``run.h5`` files, run directories or any folder above them (a sweep
directory): every ``run.h5`` below is read, through ``mpifl.logging.h5`` only,
so logs of runs still going (or killed) are read up to their last complete
round. A log that cannot be trusted (a chunk failing its checksum, a metric no
run produces: ``mpifl.analysis.summary.check_values``) is left out of every table and
figure with one line, ``skipped <log>: ...``; the others are analyzed.

Runs are grouped by the config keys whose values differ between them, leaving
out the seed and where/how a run ran (``IGNORED``) and the sections of other
algorithms than a run's own (FedAvg's row is not split by ``pfedlia.metric``; a
variant ``X_ft`` reads ``X``'s section); runs of a sweep over config files
(``grid: {base: [...]}``) are grouped by the file (column ``job``) and the keys
that vary within a file, not by every key the files set. Each group's row holds mean ± sample
std (ddof 1, as papers report; ``--ddof 0`` for numpy's) over its runs (its
seeds) of

- ``final_acc``: mean over clients of test accuracy at the last evaluated round,
  ``final_acc_w`` the same weighted by each client's test-set size;
- ``tail_acc`` / ``tail_acc_w``: the same averaged over the last ``--window``
  evaluated rounds (default 10): with partial participation the last round
  alone swings by points from round to round;
- ``best_acc`` / ``best_acc_w``: DPFL's best-val reporting: per client, test
  accuracy at the round of its best validation accuracy (first such round);
- ``ari_<source>``: cluster recovery, adjusted Rand index against
  ``/clients/cluster``, where the log has something to recover it from: a logged
  clustering (any ``.../cluster`` dataset) at the last round, the connected
  components of the collaboration graph ``/graph/mixing`` and of boolean
  ``[N, N]`` logs (collaborators, candidates) over the last ``--window`` rounds
  (an edge used in any of them: one round of a 10% sample links few clients),
  spectral clustering (as many clusters as the truth has) of learned weight
  graphs (``[N, N]`` logs named ``*affinity`` or ``*graph``: FedFomo's affinity,
  pFedGraph's graph) at the last round, as ``spectral.<dataset>``, or a root
  attribute named ``*ari*``.

Written to ``--out``: ``table.csv`` and ``table.md`` (the same table; accuracies in
percent, columns ``*_pct``), ``runs.csv`` (one row per run, the columns of
``mpifl.results.load_sweep``), and PNG figures: ``accuracy.png`` (mean test
accuracy vs round per group), ``variance.png`` (per-client accuracy variance vs
mean, DPFL Fig. 1), ``ari.png``, and ``heatmaps/<run>/<dataset>.png`` for every
``[N, N]`` log at the chosen rounds (``--rounds``, numbered from 1 as on the
console) with clients ordered by true cluster, beside
``heatmaps/<run>/clients_label_hist.png`` (clients x classes). Legends and labels
name each group by its keys and values (``algorithm.name=oracle, train.lr=0.1``).

``--record FILE``: the per-seed values behind the table(s), one CSV row per
run and metric with the run's config and provenance (``mpifl/analysis/record.py``): what
``python -m mpifl.reproduce`` re-runs and the docs render their tables from.

``--x KEY [--versus NAME [--ceiling NAME]] [--y KEY2] [--method NAME] [--metric
M]``: curves of a summary metric over a swept numeric key per method; against a
baseline, paired by seed, the mean difference with its 95% interval and where
each method stops being above it; with a ceiling (a positive control such as
Oracle), the room it leaves over the baseline and each method's share of that
room; with a second key, heatmaps of the share (``mpifl/analysis/curves.py``).
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import re
import shutil
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mpifl.analysis.figure import finish, pyplot
from mpifl.analysis.summary import ACC, JOB, PCT, WINDOW, Summary, find_logs, nanmean, run_row, summarize, unusable
from mpifl.config.identity import HOW, WHERE
from mpifl.errors import FULL, UNWRITABLE
from mpifl.logging.h5 import Corrupt, Run, open_run
from mpifl.paths import atomic_write_text

# keys that say where or how a run ran, not what it computed (mpifl.config.identity),
# the seed (the spread over seeds is the point of a group) and where its data was read
IGNORED = ("run.seed", "data.root", *WHERE, *HOW)


def _key(v: Any) -> str:
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if isinstance(v, list):
        return "[" + ", ".join(map(_key, v)) + "]"
    return str(v)


NOT_APPLICABLE = "–"


def setting(r: Summary, key: str) -> str:
    """A run's value of ``key`` as a grouping label; ``–`` for a key of another
    algorithm's section, which that run never read."""
    from mpifl.algorithms import NAMES

    section = key.split(".", 1)[0]
    algo = str(r.config.get("algorithm.name"))
    if section in NAMES and section != algo and not algo.startswith(section + "_"):
        return NOT_APPLICABLE
    return _key(r.config.get(key))


def varying_keys(runs: list[Summary]) -> list[str]:
    """Config keys whose values differ between runs (besides IGNORED and other
    algorithms' sections), in config order; ``algorithm.name`` first and always."""
    keys: list[str] = []
    for r in runs:
        keys += [k for k in r.config if k not in keys]
    vary = [k for k in keys if k not in IGNORED
            and len({setting(r, k) for r in runs} - {NOT_APPLICABLE}) > 1]
    if JOB in vary:
        # what a job file sets is told by its name; only keys varied on top of it are columns
        jobs: dict[str, list[Summary]] = {}
        for r in runs:
            jobs.setdefault(str(r.config.get(JOB)), []).append(r)
        vary = [JOB] + [k for k in vary
                        if any(len({setting(r, k) for r in rs} - {NOT_APPLICABLE}) > 1 for rs in jobs.values())]
    return ["algorithm.name"] + [k for k in vary if k != "algorithm.name"]


@dataclass
class Group:
    key: tuple  # values of the varying keys
    runs: list[Summary]
    names: tuple = ()  # the varying keys themselves

    @property
    def label(self) -> str:
        """``algorithm.name=oracle, data.n_clients=20``: each value with its key."""
        return ", ".join(f"{k}={v}" for k, v in zip(self.names, self.key)) if self.names else ", ".join(self.key)


def group_runs(runs: list[Summary], keys: list[str]) -> list[Group]:
    groups: dict[tuple, list[Summary]] = {}
    for r in runs:
        r.group = tuple(setting(r, k) for k in keys)
        groups.setdefault(r.group, []).append(r)
    return [Group(k, sorted(v, key=lambda r: r.seed), tuple(keys)) for k, v in groups.items()]


def _stats(values: list[float], ddof: int) -> tuple[float, float]:
    x = np.array([v for v in values if not math.isnan(v)], float)
    if len(x) == 0:
        return math.nan, math.nan
    std = float(np.std(x, ddof=ddof)) if len(x) > ddof else math.nan
    return float(np.mean(x)), std


def table(groups: list[Group], keys: list[str], ddof: int = 1) -> tuple[list[str], list[dict[str, Any]]]:
    """Columns and rows of the summary table: ``<metric>_mean`` and ``_std`` over
    seeds, accuracies in percent (``final_acc_pct_mean``), ARI as it is."""
    ari_sources = sorted({s for g in groups for r in g.runs for s in r.ari})
    cols = [*keys, "n_seeds", "seeds", "rounds"]
    metrics = [*(m + PCT for m in ACC), *(f"ari_{s}" for s in ari_sources)]
    for m in metrics:
        cols += [f"{m}_mean", f"{m}_std"]
    rows = []
    for g in groups:
        row: dict[str, Any] = dict(zip(keys, g.key))
        row["n_seeds"] = len(g.runs)
        row["seeds"] = " ".join(str(r.seed) for r in g.runs)
        done = [r.rounds_done for r in g.runs]
        planned = {r.rounds_planned for r in g.runs}
        row["rounds"] = f"{min(done)}" + (f"/{planned.pop()}" if len(planned) == 1 else "") + \
            ("" if all(r.complete for r in g.runs) else " (incomplete)")
        for m in ACC:
            row[f"{m}{PCT}_mean"], row[f"{m}{PCT}_std"] = _stats([100.0 * getattr(r, m) for r in g.runs], ddof)
        for s in ari_sources:
            row[f"ari_{s}_mean"], row[f"ari_{s}_std"] = _stats([r.ari.get(s, math.nan) for r in g.runs], ddof)
        rows.append(row)
    return cols, rows


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    return "" if v is None else str(v)


def write_csv(path: Path, cols: list[str], rows: list[dict[str, Any]]) -> None:
    """Written whole or not at all (a full disk leaves no empty or cut table)."""
    f = io.StringIO(newline="")
    w = csv.writer(f)
    w.writerow(cols)
    for r in rows:
        w.writerow([_fmt(r.get(c, "")) for c in cols])
    atomic_write_text(path, f.getvalue())


def markdown(cols: list[str], rows: list[dict[str, Any]], ddof: int, window: int = WINDOW) -> str:
    """The table's cells as mean ± std, in the CSV's units (its column
    ``final_acc_pct`` is ``final_acc_pct_mean`` ± ``final_acc_pct_std``)."""
    head = [c for c in cols if not c.endswith(("_mean", "_std"))]
    pairs = [c[: -len("_mean")] for c in cols if c.endswith("_mean")]
    lines = ["| " + " | ".join([*head, *pairs]) + " |", "|" + "---|" * (len(head) + len(pairs))]
    for r in rows:
        cells = [str(r[c]) for c in head]
        for m in pairs:
            mean, std = r[f"{m}_mean"], r[f"{m}_std"]
            digits = 3 if m.startswith("ari_") else 2
            if math.isnan(mean):
                cells.append("–")
            elif math.isnan(std):
                cells.append(f"{mean:.{digits}f}")
            else:
                cells.append(f"{mean:.{digits}f} ± {std:.{digits}f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    what = "sample std, ddof=1" if ddof == 1 else f"std with ddof={ddof}"
    lines.append(f"`_pct`: accuracy in %; mean ± std over seeds ({what}). `final`: the last evaluated round; `tail`: "
                 f"mean of the last {window} evaluated rounds; `best`: per client, test accuracy at its "
                 f"best-validation round; `_w`: clients weighted by test-set size.")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- figures


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+=_-]+", "_", name)


def plot_accuracy(groups: list[Group], path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for g in groups:
        n = max(len(r.curve) for r in g.runs)
        curves = np.full((len(g.runs), n), np.nan)
        for i, r in enumerate(g.runs):
            curves[i, : len(r.curve)] = r.curve
        longest = max(g.runs, key=lambda r: len(r.curve))
        x = longest.rounds + 1 if len(longest.rounds) == n else np.arange(1, n + 1)  # rounds from 1
        mean = nanmean(curves, axis=0)
        ok = ~np.isnan(mean)
        line, = ax.plot(x[ok], 100 * mean[ok], marker="." if ok.sum() < 30 else None,
                        label=f"{g.label} ({len(g.runs)} run{'s' if len(g.runs) != 1 else ''})")
        if len(g.runs) > 1:
            with warnings.catch_warnings():  # rounds nobody evaluated are all-nan
                warnings.simplefilter("ignore", RuntimeWarning)
                std = np.nanstd(curves, axis=0)
            ax.fill_between(x[ok], 100 * (mean - std)[ok], 100 * (mean + std)[ok], color=line.get_color(), alpha=0.2)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return finish(plt, fig, ax, path, "round", "mean client test accuracy (%)",
                   "Test accuracy vs round (mean ± std over seeds)")


def plot_variance(groups: list[Group], path: Path) -> Path:
    """DPFL Fig. 1: each run's variance of per-client final accuracy vs its mean."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for g in groups:
        xs = [100 * float(nanmean(r.client_final)) for r in g.runs]
        ys = [float(np.nanvar(100 * r.client_final)) if not np.isnan(r.client_final).all() else np.nan
              for r in g.runs]
        pts = ax.scatter(xs, ys, alpha=0.6, label=g.label)
        ax.scatter([np.nanmean(xs)], [np.nanmean(ys)], marker="X", s=120, color=pts.get_facecolor()[0],
                   edgecolors="black")
    return finish(plt, fig, ax, path, "mean client test accuracy (%)", "variance over clients (%²)",
                   "Per-client accuracy: variance vs mean (X: group mean)")


def plot_ari(groups: list[Group], path: Path) -> Path | None:
    sources = sorted({s for g in groups for r in g.runs for s in r.ari})
    if not sources:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(groups) * len(sources)), 4.5))
    width = 0.8 / len(sources)
    for j, s in enumerate(sources):
        vals = [[r.ari[s] for r in g.runs if s in r.ari] for g in groups]
        mean = [np.mean(v) if v else np.nan for v in vals]
        std = [np.std(v) if v else 0.0 for v in vals]
        x = np.arange(len(groups)) + (j - (len(sources) - 1) / 2) * width
        ax.bar(x, mean, width, yerr=std, capsize=3, label=s)
        for xi, v in zip(x, vals):
            ax.scatter([xi] * len(v), v, color="black", s=8, zorder=3)
    ax.set_xticks(np.arange(len(groups)), [g.label for g in groups], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("adjusted Rand index vs true clusters")
    ax.set_ylim(min(-0.1, ax.get_ylim()[0]), 1.05)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_title("Cluster recovery per run (bars: mean ± std, dots: runs)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _rounds(spec: list[int] | None, logged: np.ndarray, where: str = "the log", warn=print) -> list[int]:
    """Rows of the chosen rounds: round numbers from 1, negative from the last
    logged round (-1 = the last); default the first, middle and last logged.
    ``logged``: the 0-based round of each row (``Run.rounds``). A round the log
    does not hold is left out with a warning."""
    n = len(logged)
    if n == 0:
        return []
    if not spec:
        return list(dict.fromkeys([0, n // 2, n - 1]))
    row_of = {int(r) + 1: i for i, r in enumerate(logged)}
    out = []
    for t in spec:
        row = (n + t if -n <= t < 0 else None) if t < 0 else row_of.get(t)
        if row is None:
            held = f"rounds 1-{int(logged[-1]) + 1}" + (f", {n} of them logged" if n != int(logged[-1]) + 1 else "")
            warn(f"mpifl.analyze: warning: --rounds {t}: {where} holds {held}; left out")
        elif row not in out:
            out.append(row)
    return out


def _cluster_order(cluster: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Clients sorted by true cluster: (order, boundaries between clusters, each
    cluster's centre on that axis, its name)."""
    order = np.argsort(cluster, kind="stable")
    bounds = np.flatnonzero(np.diff(cluster[order])) + 0.5
    edges = np.concatenate([[-0.5], bounds, [len(order) - 0.5]])
    return order, bounds, (edges[:-1] + edges[1:]) / 2, [f"k{c}" for c in np.unique(cluster[order])]


def plot_label_hist(label_hist: np.ndarray, cluster: np.ndarray, path: Path, title: str = "") -> Path:
    """Training samples per client (rows, ordered by true cluster) and class
    (columns): what each client holds, whatever the numbers of clients and classes."""
    plt = pyplot()
    order, bounds, centers, names = _cluster_order(np.asarray(cluster))
    hist = np.asarray(label_hist)[order]
    n, c = hist.shape
    fig, (ax_c, ax) = plt.subplots(1, 2, figsize=(min(3 + 0.25 * c, 24), min(2 + 0.2 * n, 30)),
                                   gridspec_kw={"width_ratios": [1, max(c, 2)]}, sharey=True, layout="constrained")
    ax_c.imshow(np.asarray(cluster)[order][:, None], aspect="auto", cmap="tab20", interpolation="nearest")
    ax_c.set_xticks([0], ["true\ncluster"], fontsize=7)
    ax_c.set_ylabel("client, by true cluster", fontsize=8)
    if len(names) <= 30:
        ax_c.set_yticks(centers, names, fontsize=7)
    im = ax.imshow(hist, aspect="auto", cmap="viridis", interpolation="nearest")
    for b in bounds:
        ax.axhline(b, color="white", lw=0.8)
    ax.set_xlabel("class", fontsize=8)
    if c <= 40:
        ax.set_xticks(np.arange(c))
    ax.tick_params(labelsize=7)
    fig.colorbar(im, ax=ax, label="training samples")
    fig.suptitle(title or "/clients/label_hist", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_heatmaps(run: Run, out_dir: Path, rounds: list[int] | None, warn=print, title: str = "") -> list[Path]:
    """One PNG per [N, N] log, panels at the chosen rounds (from 1, negative from the
    end), clients ordered by true cluster; and the clients x classes label histogram.
    ``title`` names the run in each figure (default: its directory)."""
    title = title or run.path.parent.name
    from matplotlib.colors import TwoSlopeNorm

    plt = pyplot()
    cluster = run.get("clients/cluster")
    order, bounds, centers, names = _cluster_order(cluster)
    written = []
    if "clients/label_hist" in run.datasets:
        written.append(plot_label_hist(run.get("clients/label_hist"), cluster, out_dir / "clients_label_hist.png",
                                       f"{title}: /clients/label_hist (training samples per class)"))
    logged = run.rounds if run.n_rounds else np.zeros(0, int)
    for key, info in run.matrices.items():
        if info.per_round:
            picks = _rounds(rounds, logged[: info.shape[0]], f"{run.path.parent.name}'s /{key}", warn)
            mats = [(f"round {int(logged[t]) + 1}", np.asarray(run.row(key, t), float)) for t in picks]
        else:
            label = f"round {info.round + 1} (logged once)" if info.round is not None else "logged once"
            mats = [(label, np.asarray(run.get(key), float))]
        if not mats:
            continue
        extra = mats[0][1].ndim > 2
        mats = [(lab, m.reshape(m.shape[0], m.shape[1], -1).mean(axis=2) if m.ndim > 2 else m) for lab, m in mats]
        mats = [(lab, m[order][:, order]) for lab, m in mats]
        allv = np.concatenate([m.ravel() for _, m in mats])
        allv = allv[np.isfinite(allv)]
        lo, hi = (float(allv.min()), float(allv.max())) if len(allv) else (0.0, 1.0)
        if lo < 0 < hi:  # signed (influence): diverging around 0
            norm, cmap = TwoSlopeNorm(0.0, lo, hi), "RdBu_r"
        else:  # weights: 0 means no collaboration, so the scale starts there
            norm, cmap = None, "viridis"
            lo, hi = min(lo, 0.0), max(hi, 0.0)
            hi = hi if hi > lo else lo + 1.0
        fig, axes = plt.subplots(1, len(mats), figsize=(3.4 * len(mats) + 1.0, 3.8), squeeze=False,
                                 layout="constrained")
        for ax, (lab, m) in zip(axes[0], mats):
            im = ax.imshow(m, cmap=cmap, norm=norm, vmin=None if norm else lo, vmax=None if norm else hi,
                           interpolation="nearest")
            for b in bounds:
                ax.axhline(b, color="white" if cmap == "viridis" else "black", lw=0.8)
                ax.axvline(b, color="white" if cmap == "viridis" else "black", lw=0.8)
            ax.set_title(lab, fontsize=9)
            if len(names) <= 30:
                ax.set_xticks(centers, names)
                ax.set_yticks(centers, names)
            ax.set_xlabel("client j, by true cluster", fontsize=8)
            ax.set_ylabel("client i, by true cluster", fontsize=8)
            ax.tick_params(labelsize=7, length=0)
        fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8)
        fig.suptitle(f"{title}: /{key}" + (" (mean over last axis)" if extra else ""), fontsize=9)
        path = out_dir / f"{_safe(key)}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


# --------------------------------------------------------------------------- CLI


def table_provenance(runs: list[Summary], what: str, echo=print) -> str:
    """The provenance line of a table's runs; a warning echoed for each fact that
    differs between them (commit, CPU capability, device)."""
    from mpifl.run.provenance import table_line

    line, warnings = table_line([r.provenance for r in runs])
    for w in warnings:
        echo(f"mpifl.analyze: warning: {what} mixes {w}")
    return line


def analyze(paths: list[str | Path], out: Path, heatmaps: str = "first", rounds: list[int] | None = None,
            ddof: int = 1, echo=print, window: int = WINDOW, layouts: list[Path] = (),
            check: Callable[[list[Summary], list[str]], None] | None = None,
            record: Path | None = None) -> dict[str, Any]:
    """Read the logs, write tables and figures under ``out``; returns what was made.
    ``layouts``: paper-layout files (``mpifl.analysis.paper_table``), each rendered to
    ``<out>/<layout name>.md``. ``record``: write the per-seed values behind the
    layout tables (else behind ``table.md``) there (:mod:`mpifl.analysis.record`).
    ``check(runs, keys)`` runs before anything is
    written, so a request the runs cannot answer costs no figures."""
    from mpifl.analysis.paper_table import cells, load_layout, render_cells
    from mpifl.sweep.status import failed_points

    chosen_layouts = [(Path(f), load_layout(f)) for f in layouts]  # a bad file fails before any reading
    runs, skipped = [], []
    for p in find_logs(paths):
        for attempt in range(3):  # a log being written can be caught mid-round: look again
            try:
                runs.append(summarize(p, window))
                break
            except Exception as e:  # noqa: BLE001 - one broken log must not hide the others
                why = unusable(e)
                if why is not None:
                    skipped.append((p, why))
                    break
                if attempt == 2 or str(e) == "not an HDF5 file":
                    skipped.append((p, str(e) if str(e) == "not an HDF5 file" else f"{type(e).__name__}: {e}"))
                    break
                else:
                    time.sleep(0.5)
    for p, why in skipped:
        echo(f"skipped {p}: {why}")
    if not runs:
        raise FileNotFoundError(f"no readable run log under {', '.join(map(str, paths))}")
    keys = varying_keys(runs)
    if check is not None:
        check(runs, keys)
    groups = group_runs(runs, keys)
    out.mkdir(parents=True, exist_ok=True)
    cols, rows = table(groups, keys, ddof)
    write_csv(out / "table.csv", cols, rows)
    md = markdown(cols, rows, ddof, window)
    atomic_write_text(out / "table.md", md)
    run_rows = [{**dict(zip(keys, r.group)), **run_row(r)} for r in runs]
    write_csv(out / "runs.csv", list(dict.fromkeys(k for row in run_rows for k in row)), run_rows)
    figures = [plot_accuracy(groups, out / "accuracy.png"), plot_variance(groups, out / "variance.png")]
    ari = plot_ari(groups, out / "ari.png")
    if ari:
        figures.append(ari)
    if heatmaps != "none":
        chosen = [(g, r) for g in groups for r in (g.runs if heatmaps == "all" else g.runs[:1])]
        for g, r in chosen:
            try:
                figures += plot_heatmaps(open_run(r.path), out / "heatmaps" / _safe(r.name), rounds, echo,
                                         title=f"{g.label}, run.seed={r.seed}")
            except Corrupt as e:  # a round the summary did not read
                echo(f"no heatmaps of {r.path}: corrupt: {e}")
    papers = []
    failed = failed_points(paths) if chosen_layouts else []
    for f, layout in chosen_layouts:
        got, notes = cells(layout, runs, failed)
        text = render_cells(layout, got, notes, ddof)
        (out / f"{f.name.split('.')[0]}.md").write_text(text)
        papers.append(text)
        echo(text)
        echo(table_provenance([r for c in got.values() for r in c.runs], layout.title, echo))
    if record is not None:
        from mpifl.analysis import record as rec

        rows = [x for f, layout in chosen_layouts for x in rec.layout_rows(f, layout, runs)] if chosen_layouts \
            else rec.table_rows(groups, keys, ACC)
        rec.write(record, rows)
        echo(f"wrote the record of {len(rows)} per-seed value(s) to {record}")
    incomplete = [r for r in runs if not r.complete]
    echo(f"{len(runs)} run(s) in {len(groups)} group(s); grouped by: {', '.join(keys)}")
    for r in incomplete:
        echo(f"  in progress or stopped: {r.name} ({r.rounds_done}/{r.rounds_planned} rounds)")
    echo(md, end="")
    echo(table_provenance(runs, "the table", echo))
    echo(f"wrote {out / 'table.csv'}, {out / 'table.md'}, {out / 'runs.csv'} and {len(figures)} figure(s) under {out}")
    return {"runs": runs, "groups": groups, "keys": keys, "rows": rows, "figures": figures, "skipped": skipped,
            "papers": papers}


def _int_list(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated round numbers, e.g. 1,-1") from None
    if 0 in out:
        raise argparse.ArgumentTypeError(f"{text!r}: rounds are numbered from 1 (-1 is the last)")
    return out


def _unwritable_out(e: OSError, out: Path, made: bool) -> int:
    """A write under ``out`` refused (read-only, not ours, a full disk: a figure's
    write names no file): one line, exit 2; a folder this call made goes again."""
    if e.filename is not None and not Path(e.filename).absolute().is_relative_to(out.absolute()):
        raise e
    if e.filename is None and e.errno not in (*FULL, *UNWRITABLE):
        raise e
    if made:
        shutil.rmtree(out, ignore_errors=True)
    print(f"mpifl.analyze: error: cannot write {e.filename or out} ({e.strerror}); give --out DIR, a folder you "
          f"can write", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    from mpifl.analysis.paper_table import LayoutError

    ap = argparse.ArgumentParser(prog="python -m mpifl.analyze", description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help="run.h5 files, run directories or sweep directories")
    ap.add_argument("--out", type=Path,
                    help="output folder (default: <PATH>/analysis for one directory, else ./analysis)")
    ap.add_argument("--heatmaps", choices=("first", "all", "none"), default="first",
                    help="heatmaps for the first seed of each group (default), every run, or none")
    ap.add_argument("--rounds", type=_int_list, help="heatmap rounds, numbered from 1 as on the console, negative "
                                                     "from the end: 1,15,-1 (default: first, middle, last logged)")
    ap.add_argument("--ddof", type=int, default=1, choices=(0, 1), help="std over seeds: 1 = the sample std "
                                                                         "papers report (default), 0 = numpy's")
    ap.add_argument("--layout", type=Path, action="append", default=[],
                    help="a paper-layout file (rows = methods, columns = settings, the paper's figures beside "
                         "ours; see mpifl/analysis/paper_table.py); may be repeated")
    ap.add_argument("--window", type=int, default=WINDOW, help="last evaluated rounds averaged by tail_acc "
                                                               "and joined for graph ARI (default 10)")
    ap.add_argument("--record", type=Path, metavar="FILE", help="also write the per-seed values behind the "
                    "table(s) to this CSV (mpifl/analysis/record.py), for python -m mpifl.reproduce and the docs' tables")
    c = ap.add_argument_group("curves over a swept key (mpifl/analysis/curves.py)")
    c.add_argument("--x", metavar="KEY", help="per method, the metric's mean ± std over seeds against this config "
                                              "key (a PNG, a CSV and a Markdown table)")
    c.add_argument("--metric", choices=ACC, default="final_acc",
                   help="with --x: the summary metric (default final_acc)")
    c.add_argument("--versus", metavar="NAME", help="with --x: each method against this algorithm.name, paired by "
                                                    "seed: mean difference, 95%% interval, above/level/below "
                                                    "(versus.csv, versus.md)")
    c.add_argument("--ceiling", metavar="NAME", help="with --versus: a positive control (e.g. oracle); per seed "
                                                     "its gain over the baseline is the room and each method's "
                                                     "gain / room its share; 'no room' where the ceiling is not "
                                                     "above the baseline")
    c.add_argument("--y", metavar="KEY2", help="with --x: a second swept numeric key; one curve per value, and "
                                               "with --ceiling a heatmap of each method's share over KEY2 x KEY")
    c.add_argument("--method", action="append", default=[], metavar="NAME",
                   help="with --versus: report this algorithm.name only (may be repeated; default all others)")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if (a.versus or a.method or a.y) and not a.x:
        ap.error("--versus, --method and --y need --x KEY")
    if a.ceiling and not a.versus:
        ap.error("--ceiling needs --versus NAME")
    if a.method and not a.versus:
        ap.error("--method needs --versus NAME")
    out = a.out
    if out is None:
        one = Path(a.paths[0])
        out = one / "analysis" if len(a.paths) == 1 and one.is_dir() else Path("analysis")
    from mpifl.analysis.curves import CurveError, Grouping, compute, report

    def check(runs: list[Summary], keys: list[str]) -> None:
        if a.x:
            compute(runs, a.x, Grouping(keys, setting, NOT_APPLICABLE), a.metric, a.versus, a.method, a.ddof,
                    a.ceiling, a.y)

    made = not out.exists()  # a folder this call makes holds only what it wrote: removed if it fails
    try:
        res = analyze(a.paths, out, a.heatmaps, a.rounds, a.ddof, window=max(1, a.window), layouts=a.layout,
                      check=check, record=a.record)
        if a.x:
            report(res["runs"], a.x, Grouping(res["keys"], setting, NOT_APPLICABLE), out, a.metric, a.versus,
                   a.method, a.ddof, ceiling=a.ceiling, y=a.y)
    except (FileNotFoundError, LayoutError, CurveError) as e:
        print(f"mpifl.analyze: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the output folder: read-only, not ours, full
        return _unwritable_out(e, out, made)
    return 0


if __name__ == "__main__":
    from mpifl.cli import quiet_pipe

    sys.exit(quiet_pipe(main))
