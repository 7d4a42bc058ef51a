"""One run's log, summarised: what ``mpifl.analyze`` tables and figures and
``mpifl.analysis.paper_table`` cells are made of. Logs are read through
``mpifl.logging.h5`` only, so runs still going (or killed) are read up to their
last complete round; a log whose shapes contradict its own attributes is
refused before anything large is read (:func:`check_shapes`), one whose metrics
hold values no run produces is refused too (:func:`check_values`), and a chunk
failing its checksum raises ``mpifl.logging.h5.Corrupt``."""

from __future__ import annotations

import functools
import math
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mpifl.analysis import budget
from mpifl.config.identity import flatten
from mpifl.errors import ConfigError
from mpifl.logging.h5 import Corrupt, Run, open_run
from mpifl.run import provenance
from mpifl.yamlio import read_yaml

WINDOW = 10  # rounds averaged by tail_acc and joined for graph ARI
JOB = "job"  # not a config key: the config file a sweep point was made from


@dataclass
class Summary:
    path: Path
    name: str
    config: dict[str, Any]  # flattened: "section.key" -> value
    seed: int
    rounds_done: int
    rounds_planned: int | None
    final_round: int  # the last evaluated round, 0-based as /rounds/round; -1 if none
    final_acc: float
    final_acc_w: float
    tail_acc: float
    tail_acc_w: float
    best_acc: float
    best_acc_w: float
    client_final: np.ndarray  # [N] test acc at the final round
    curve: np.ndarray  # [logged rows] mean test acc of round rounds[i], nan where not evaluated
    ari: dict[str, float] = field(default_factory=dict)
    group: tuple = ()
    rounds: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # 0-based round of each curve row
    provenance: dict[str, Any] = field(default_factory=dict)  # mpifl.run.provenance's facts; {} in an older log
    val_curve: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [logged rows] mean val acc, as curve
    budget: dict[str, float] = field(default_factory=dict)  # what it spent: mpifl.analysis.budget.of_run
    es_acc: float = math.nan  # mean test acc at the round of best mean val acc (early_stopped); Local's: Local+ES

    @property
    def complete(self) -> bool:
        return self.rounds_planned is not None and self.rounds_done >= self.rounds_planned


# accuracies of a Summary (fractions there), reported in percent as "<name>_pct"
ACC = ("final_acc", "final_acc_w", "tail_acc", "tail_acc_w", "best_acc", "best_acc_w")
# Early stopping on the run's own validation data, one round for all clients: the mean
# test accuracy over clients at the (first) round where the mean validation accuracy
# over clients is best. Local's is "Local+ES", the floor for a method that selects on
# validation (best_acc picks a round per client; a method's collaborator choice reads
# validation data): Local stopped where its own validation data says. Not in ACC, so
# the tables' columns stay as they were; a record carries it (metric es_acc).
ES = "es_acc"


def early_stopped(curve: np.ndarray, val_curve: np.ndarray) -> float:
    """``curve`` (mean test accuracy per logged round) at the first round of the best
    ``val_curve``; NaN where no round has a validation accuracy."""
    v = np.asarray(val_curve, np.float64)
    if len(v) == 0 or np.isnan(v).all():
        return math.nan
    return float(curve[int(np.nanargmax(v))])


# a per-round metric: "val_acc@60" is the mean over clients of round 60's validation accuracy
AT_ROUND = re.compile(r"(val_acc|test_acc)@([1-9][0-9]*)")


def metric_value(s: Summary, metric: str) -> float:
    """A table's value of one run: an accuracy metric (``ACC``) in percent;
    ``val_acc@R`` or ``test_acc@R``, the mean over clients at round R (numbered from
    1), in percent (NaN where that round was not evaluated); ``es_acc`` (:data:`ES`)
    in percent; ``ari:SOURCE``, the
    ARI of the clustering ``SOURCE`` (a key of ``Summary.ari``) against the true
    clusters, as it is (NaN where the run has no such source); or ``budget:FIELD``,
    what the run spent (:data:`mpifl.analysis.budget.FIELDS`), as it is."""
    if metric.startswith("ari:"):
        return float(s.ari.get(metric[4:], float("nan")))
    if metric.startswith(budget.METRIC):
        return float(s.budget.get(metric.removeprefix(budget.METRIC), float("nan")))
    m = AT_ROUND.fullmatch(metric)
    if m:
        curve = s.val_curve if m.group(1) == "val_acc" else s.curve
        row = np.flatnonzero(s.rounds == int(m.group(2)) - 1)
        return 100.0 * float(curve[row[0]]) if len(row) and len(curve) > row[0] else float("nan")
    return 100.0 * getattr(s, metric)
PCT = "_pct"


def run_row(s: Summary) -> dict[str, Any]:
    """One run as a table row: accuracies in percent (``final_acc_pct``, ...), the
    last evaluated round numbered from 1 (None if none), ARI per source
    (``ari_<source>``). The columns of ``runs.csv`` and of ``mpifl.results.load_sweep``."""
    return {"name": s.name, "path": str(s.path), "seed": s.seed, "rounds_done": s.rounds_done,
            "rounds_planned": s.rounds_planned, "complete": s.complete,
            "final_round": s.final_round + 1 if s.final_round >= 0 else None,
            **{m + PCT: 100.0 * getattr(s, m) for m in ACC}, **{f"ari_{k}": v for k, v in s.ari.items()}}


@functools.cache
def defaults() -> dict[str, Any]:
    """Every config key's default, flattened: a log written before a key existed
    ran as its default says, so it reads as that (``local.sampled_only`` is false
    in a Local run logged before the key was added)."""
    from mpifl import config

    return flatten(config.from_dict({}).to_dict())


def _wmean(x: np.ndarray, w: np.ndarray) -> float:
    ok = ~np.isnan(x)
    if not ok.any() or w[ok].sum() <= 0:
        return math.nan
    return float(np.sum(x[ok] * w[ok]) / np.sum(w[ok]))


def nanmean(x: np.ndarray, axis: int | None = None) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=axis)


def best_val(val: np.ndarray, test: np.ndarray) -> np.ndarray:
    """Per client, test accuracy at the (first) round of its best val accuracy; nan
    for a client never evaluated on validation data."""
    out = np.full(val.shape[1], np.nan)
    for c in range(val.shape[1]):
        v = val[:, c]
        if np.isnan(v).all():
            continue
        out[c] = test[int(np.nanargmax(v)), c]
    return out


def components(adj: np.ndarray) -> np.ndarray:
    """Connected-component label per node of an undirected graph (dense adjacency)."""
    from scipy.sparse.csgraph import connected_components

    _, labels = connected_components(adj, directed=False)
    return labels


# per-round [N, N] weight logs whose last round is clustered spectrally for the ARI
SPECTRAL = ("affinity", "graph")


def spectral(weights: np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    """k cluster labels of the nodes of a weighted graph: spectral clustering of
    the symmetrised non-negative part of ``weights`` (a node with no edge is
    linked to itself only)."""
    from sklearn.cluster import SpectralClustering

    w = np.maximum(np.asarray(weights, np.float64), 0.0)
    w = (w + w.T) / 2
    np.fill_diagonal(w, np.maximum(np.diag(w), (w.sum(1) == 0).astype(float)))
    with warnings.catch_warnings():  # a graph in several pieces is what we look for
        warnings.simplefilter("ignore", UserWarning)
        return SpectralClustering(n_clusters=k, affinity="precomputed", random_state=seed).fit(w).labels_


def cluster_recovery(run: Run, n_clients: int, window: int = WINDOW) -> dict[str, float]:
    """ARI against the true clusters from whatever the log holds to recover them."""
    from sklearn.metrics import adjusted_rand_score

    info = run.datasets
    if "clients/cluster" not in info or run.n_rounds == 0:
        return {}
    truth = run.get("clients/cluster")
    if len(np.unique(truth)) < 2:  # no structure to recover (iid)
        return {}
    out = {}
    for k, d in info.items():
        if k == "clients/cluster" or k.rsplit("/", 1)[-1] != "cluster":
            continue
        if d.per_round and d.shape[1:] == (n_clients,) and d.shape[0] > 0:
            pred = run.row(k, -1)
        elif not d.per_round and d.shape == (n_clients,):
            pred = run.get(k)
        else:
            continue
        out[k.replace("/", ".")] = float(adjusted_rand_score(truth, pred))
    for k, d in run.matrices.items():
        if not d.per_round or d.shape[0] == 0 or len(d.shape) != 3:
            continue
        if k == "graph/mixing" or d.dtype == np.bool_:
            m = np.zeros((n_clients, n_clients), bool)
            for t in range(max(0, d.shape[0] - window), d.shape[0]):
                m |= np.asarray(run.row(k, t)) != 0
            out[k.replace("/", ".")] = float(adjusted_rand_score(truth, components(m | m.T)))
        elif k.endswith(SPECTRAL) and d.dtype.kind == "f" and n_clients > len(np.unique(truth)):
            pred = spectral(run.row(k, -1), len(np.unique(truth)))
            out["spectral." + k.replace("/", ".")] = float(adjusted_rand_score(truth, pred))
    for k, v in run.attrs.items():
        if "ari" in k.lower().split("_") and isinstance(v, (int, float, np.floating, np.integer)):
            out[f"attr.{k}"] = float(v)
    return out


class Mismatch(ValueError):
    """A log whose datasets do not have the shapes its own attributes imply."""


# per-round datasets with one value per client: [rounds, n_clients]
_PER_CLIENT = ("metrics/", "comm/", "train/")
_MAX_CELLS = 1024  # per client pair and round: the largest extra axis a log may add (classes)


def check_shapes(run: Run) -> None:
    """Compare every dataset's declared shape with the run's ``n_clients`` and
    rounds before anything is read: a file claiming more (a damaged or hostile
    log) would make a reader allocate what it claims. Raises :class:`Mismatch`."""
    n = run.attrs.get("n_clients")
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
        raise Mismatch(f"attribute n_clients={str(n)[:40]!r} is not a positive integer")
    n = int(n)
    planned = run.planned_rounds
    rounds = run.n_rounds
    if planned is not None and rounds > planned:
        raise Mismatch(f"/rounds/round holds {rounds} rows; the run has run.rounds={planned}")
    limit = max(rounds, planned or 0, 1) * n * n * _MAX_CELLS
    for k, d in run.datasets.items():
        shape = d.shape
        if k.startswith("clients/") and shape[:1] != (n,):
            raise Mismatch(f"/{k} has shape {shape}, not [n_clients={n}, ...]")
        if d.per_round and k.startswith(_PER_CLIENT) and shape[1:] != (n,):
            raise Mismatch(f"/{k} has shape {shape}, not [rounds, n_clients={n}]")
        if k == "graph/mixing" and shape[1:] != (n, n):
            raise Mismatch(f"/{k} has shape {shape}, not [rounds, {n}, {n}]")
        if math.prod(shape) > limit:
            raise Mismatch(f"/{k} declares {math.prod(shape)} values; a run of {n} clients and "
                           f"{max(rounds, planned or 0)} rounds logs at most {limit}")


class Implausible(ValueError):
    """A logged metric no run produces: outside its range, or missing (nan) or
    infinite where a value is expected."""


def unusable(e: Exception) -> str | None:
    """Why a log that raised ``e`` while summarized is left out of results (the
    reason analyze and ``mpifl.results`` print), or None for an error that looking
    again may not repeat (a log caught mid-write)."""
    if isinstance(e, Mismatch):  # what the file says will not change by looking again
        return f"does not match its own attributes: {e}"
    if isinstance(e, Corrupt):
        return f"corrupt: {e}"
    if isinstance(e, Implausible):  # a table must not average it in
        return f"implausible value: {e}"
    if isinstance(e, ConfigError):  # its stored config is refused by the YAML reader (a bomb, too deep)
        return str(e)
    return None


# what each metric may hold: accuracies are fractions, losses are not negative
RANGES = {"train_loss": (0.0, math.inf), "val_loss": (0.0, math.inf), "test_loss": (0.0, math.inf),
          "val_acc": (0.0, 1.0), "test_acc": (0.0, 1.0)}


def check_values(run: Run, evaluated: np.ndarray, loaded: dict[str, np.ndarray] | None = None) -> None:
    """Raise :class:`Implausible` naming the first value (dataset, round from 1,
    client) of ``/metrics/*`` that is outside :data:`RANGES` or infinite, or nan in
    an ``evaluated`` row (validation and test metrics of clients holding such
    data: a client with none is never evaluated). ``loaded``: metrics already
    read, by name."""
    info = run.datasets
    rounds = run.rounds
    found: list[tuple[int, int, str, float, str]] = []  # (row, client, dataset, value, why)
    n_bad = 0
    for name, (lo, hi) in RANGES.items():
        key = f"metrics/{name}"
        if key not in info or info[key].shape[0] == 0:
            continue
        x = (loaded or {}).get(name)
        x = np.asarray(run.metric(name) if x is None else x, np.float64)
        seen = ~np.isnan(x)
        bad = seen & (np.isinf(x) | (x < lo) | (x > hi))
        why = f"outside [{lo:g}, {hi:g}]" if hi < math.inf else f"outside [{lo:g}, inf)"
        if not name.startswith("train_"):  # train_loss is nan for clients that did not train
            split = name.split("_")[0]
            held = run.get(f"clients/n_{split}") > 0 if f"clients/n_{split}" in info else np.ones(x.shape[1], bool)
            missing = np.zeros_like(bad)
            missing[evaluated] = ~seen[evaluated] & held
            bad |= missing
        n_bad += int(bad.sum())
        if bad.any():
            r, c = np.argwhere(bad)[0]
            found.append((int(r), int(c), key, float(x[r, c]),
                          "in an evaluated round" if np.isnan(x[r, c]) else why))
    if found:
        r, c, key, v, why = min(found)
        more = f"; {n_bad - 1} more such value(s)" if n_bad > 1 else ""
        raise Implausible(f"/{key} holds {v:g} at round {int(rounds[r]) + 1} (client {c}), {why}{more}")


def sweep_points(root: Path) -> dict[str, dict] | None:
    """The grid values of each point of the sweep directory ``root``, by point
    name, from ``<root>/sweep.yaml``; None where there is no readable record."""
    spec = Path(root) / "sweep.yaml"
    if not spec.is_file():
        return None
    try:
        points = (read_yaml(spec, f"sweep record {str(spec)!r}") or {}).get("points") or []
    except (ConfigError, AttributeError):
        return None
    return {str(p.get("name")): p.get("values") for p in points
            if isinstance(p, dict) and isinstance(p.get("values"), dict)}


def sweep_job(log: Path, points: dict[str, dict] | None = None) -> str | None:
    """The name of the config file a run was made from, where its sweep varied the
    file (``grid: {base: [...]}``): ``<sweep>/sweep.yaml`` lists each point of
    ``<sweep>/runs/<point>/`` with its grid values (``points``: that list, read
    once by a caller that summarises many runs of one sweep)."""
    point = Path(log).parent
    if point.parent.name != "runs":
        return None
    if points is None:
        points = sweep_points(point.parent.parent) or {}
    values = points.get(point.name) or {}
    return Path(str(values["base"])).stem if values.get("base") is not None else None


def summarize(path: Path, window: int = WINDOW, ari: bool = True, points: dict[str, dict] | None = None) -> Summary:
    """The summary of the log at ``path``; ``ari=False`` leaves out cluster recovery
    (the only part that reads ``[N, N]`` logs); ``points``: ``sweep_points`` of the
    run's sweep, when the caller has read it."""
    import h5py

    if not h5py.is_hdf5(path):
        raise ValueError("not an HDF5 file")
    run = open_run(path)
    with run.reading():
        return _summarize(run, window, ari, points)


def _summarize(run: Run, window: int, ari: bool, points: dict[str, dict] | None) -> Summary:
    check_shapes(run)
    cfg = {**defaults(), **flatten(run.config)}
    job = sweep_job(run.path, points)
    if job is not None:
        cfg[JOB] = job
    n_rounds = run.n_rounds
    test = run.metric("test_acc") if n_rounds else np.zeros((0, 0))
    val = run.metric("val_acc") if n_rounds else np.zeros((0, 0))
    n_test = run.get("clients/n_test").astype(float)
    evaluated = np.flatnonzero(~np.isnan(test).all(axis=1)) if n_rounds else np.array([], int)
    if n_rounds:
        check_values(run, evaluated, {"test_acc": test, "val_acc": val})
    if len(evaluated):
        last = int(evaluated[-1])
        client_final = test[last]
        final_round = int(run.rounds[last])
        client_tail = nanmean(test[evaluated[-window:]], axis=0)
        best = best_val(val, test)
        curve, val_curve = nanmean(test, axis=1), nanmean(val, axis=1)
    else:
        final_round, client_final = -1, np.full(len(n_test), np.nan)
        client_tail = client_final
        best, curve = client_final, np.full(n_rounds, np.nan)
        val_curve = curve
    name = str(cfg.get("run.name") or run.path.parent.name)
    return Summary(
        path=run.path, name=name, config=cfg, seed=int(run.attrs.get("seed", cfg.get("run.seed", 0))),
        rounds_done=run.rounds_done, rounds_planned=run.planned_rounds, final_round=final_round,
        final_acc=float(nanmean(client_final)), final_acc_w=_wmean(client_final, n_test),
        tail_acc=float(nanmean(client_tail)), tail_acc_w=_wmean(client_tail, n_test),
        best_acc=float(nanmean(best)), best_acc_w=_wmean(best, n_test),
        client_final=client_final, curve=curve, ari=cluster_recovery(run, len(n_test), window) if ari else {},
        rounds=np.asarray(run.rounds, np.int64) if n_rounds else np.zeros(0, np.int64),
        provenance=provenance.read(run.attrs), val_curve=val_curve, budget=budget.of_run(run, cfg),
        es_acc=early_stopped(curve, val_curve),
    )


def find_logs(paths: list[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            out.append(p)
        elif (p / "run.h5").is_file():
            out.append(p / "run.h5")
        elif p.is_dir():
            # os.walk, not rglob: a running job deletes old checkpoint folders under the
            # walk, and rglob raises on one gone between its listing and its visit. Links are
            # followed: a folder of links to runs of several sweeps (controls of one, a re-run
            # arm of another) is analysed as one; a run reached twice is read once (below)
            out.extend(sorted(Path(d) / "run.h5" for d, _, files in os.walk(p, followlinks=True)
                              if "run.h5" in files))
        else:
            raise FileNotFoundError(f"{p}: no such file or directory")
    seen: set[Path] = set()
    return [p for p in out if not (p.resolve() in seen or seen.add(p.resolve()))]
