"""The figures of ``mpifl.analyze``: accuracy against round per group, per-client
variance against mean (DPFL Fig. 1), cluster recovery (ARI), the label histogram
of the clients and the heatmaps of every ``[N, N]`` log at chosen rounds."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np

from mpifl.analysis.figure import axes, finish, pyplot, save
from mpifl.analysis.summary import nanmean
from mpifl.analysis.tables import Group
from mpifl.logging.h5 import Run


def file_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+=_-]+", "_", name)


def plot_accuracy(groups: list[Group], path: Path) -> Path:
    plt, fig, ax = axes(7)
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
    plt, fig, ax = axes(6)
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
    plt, fig, ax = axes(max(6, 1.2 * len(groups) * len(sources)))
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
    return save(plt, fig, path)


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
    return save(plt, fig, path, layout=False)


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
        path = out_dir / f"{file_safe(key)}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        written.append(save(plt, fig, path, layout=False))
    return written
