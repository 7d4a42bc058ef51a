"""Run logs as pandas DataFrames, for notebooks and scripts (docs/analysis.md).

    from mpifl.results import load_sweep, open_run
    df = load_sweep("results/quickstart-baselines")       # one row per run
    df.groupby("algorithm.name")["final_acc_pct"].agg(["mean", "std"])
    run = open_run("results/quickstart")
    run.frame("test_acc")                                  # round, client, cluster, rank, value
    run.summary()                                          # one row of load_sweep, as a Series

``python -m mpifl.results tensorboard PATHS --out DIR`` writes the logs under
PATHS as TensorBoard events (:mod:`mpifl.logging.tensorboard`), one run per log.
``python -m mpifl.results export RUN [--round N]`` writes a run's models as
``state_dict`` files with an ``index.json`` (:mod:`mpifl.run.export`).

Accuracies are in percent wherever a column says ``_pct`` (as in ``analyze``'s
tables); ``frame`` gives a metric as logged (accuracies as fractions). Rounds
are numbered from 1. pandas is an optional dependency:
``pip install -e '.[analysis]'``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from mpifl.analysis.summary import JOB, WINDOW, find_logs, run_row, summarize, sweep_points, unusable
from mpifl.errors import ConfigError
from mpifl.logging import h5
from mpifl.yamlio import read_yaml

__all__ = ["Run", "frame", "load_sweep", "open_run", "pandas", "run_summary"]

MISSING = "mpifl.results needs pandas, an optional dependency: pip install -e '.[analysis]' (or pip install pandas)"


def pandas():
    """The pandas module, or an ImportError whose one line says how to install it."""
    try:
        import pandas as pd
    except ImportError:
        raise ImportError(MISSING) from None
    return pd


class Run(h5.Run):
    """A run log (:class:`mpifl.logging.h5.Run`) that also reads as DataFrames."""

    def frame(self, metric: str = "test_acc", dropna: bool = True):
        """A per-client, per-round dataset in long format (:func:`frame`)."""
        return frame(self, metric, dropna)

    def summary(self, window: int | None = None):
        """This run's row of :func:`load_sweep`, as a Series (``window``: rounds of tail_acc)."""
        return run_summary(self.path, window)


def open_run(path: str | Path) -> Run:
    """The log at ``path`` (``run.h5`` or its run directory)."""
    return Run(path)


def frame(run: h5.Run, metric: str = "test_acc", dropna: bool = True):
    """``run``'s per-client, per-round dataset ``metric`` (a name under
    ``/metrics`` or a path such as ``comm/bytes_sent``) in long format: one row per
    logged round and client, columns ``round`` (from 1), ``client``, ``cluster``
    (the true one), ``rank`` (hosting MPI rank) and ``value``. ``dropna`` leaves
    out rows without a value (rounds that were not evaluated)."""
    pd = pandas()
    path = metric if "/" in metric else f"metrics/{metric}"
    info = run.datasets
    n = int(run.attrs["n_clients"])
    if path not in info:
        usable = sorted(k for k, d in info.items() if d.per_round and d.shape[1:] == (n,))
        raise KeyError(f"{path!r} is not in {run.path}; per-client datasets: {', '.join(usable)}")
    if not info[path].per_round or info[path].shape[1:] != (n,):
        raise ValueError(f"{path!r} has shape {info[path].shape}, not [rounds, {n} clients]; "
                         f"read it with run.get({path!r})")
    values = np.asarray(run.get(path))
    rounds = np.asarray(run.rounds, np.int64) + 1
    cluster = run.get("clients/cluster") if "clients/cluster" in info else np.full(n, -1)
    rank = run.get("clients/rank") if "clients/rank" in info else np.full(n, -1)
    r = len(rounds)
    out = pd.DataFrame({"round": np.repeat(rounds, n), "client": np.tile(np.arange(n), r),
                        "cluster": np.tile(cluster, r), "rank": np.tile(rank, r), "value": values.ravel()})
    if dropna:
        out = out[~np.isnan(out["value"].to_numpy(float))].reset_index(drop=True)
    return out


def run_summary(path: str | Path, window: int | None = None):
    """One run's summary (``mpifl.analysis.summary.run_row``) as a Series."""
    pd = pandas()
    return pd.Series(run_row(summarize(Path(path), WINDOW if window is None else window)))


def _swept(root: Path) -> list[str] | None:
    """The keys a sweep directory's ``sweep.yaml`` varies (``base`` as ``job``), or
    None for a folder that is not a sweep."""
    spec = root / "sweep.yaml"
    if not spec.is_file():
        return None
    record = read_yaml(spec, f"sweep record {str(spec)!r}") or {}
    keys: list[str] = []
    for p in record.get("points") or []:
        keys += [k for k in (p.get("values") or {}) if k not in keys]
    return [JOB if k == "base" else k for k in keys]


def load_sweep(path: str | Path, window: int = WINDOW, ari: bool = True):
    """Every run below ``path`` (a sweep directory, or any folder of runs) as one
    DataFrame, one row per run: each swept key as a column (the value the run
    used, so a grid's ``~`` reads as the base's value; ``job`` for a sweep over
    config files), then ``run_row``'s columns: name, path, seed, rounds done and
    planned, ``complete``, ``final_round`` (from 1), accuracies in percent
    (``final_acc_pct``, ``tail_acc_pct``, ``best_acc_pct`` and their ``_w``
    weighted forms) and ``ari_<source>``. For a folder without ``sweep.yaml`` the
    key columns are the config keys whose values differ between the runs. Only the
    logs' small datasets are read (per-client metrics, clusterings, the last
    ``window`` rounds of ``[N, N]`` logs; ``ari=False`` skips the latter). A log
    that analyze leaves out (corrupt, an impossible value, not matching its own
    attributes) is left out here too, with a warning; ``frame.attrs["skipped"]``
    holds each one's (path, reason)."""
    pd = pandas()
    root = Path(path)
    logs = find_logs([root])
    points = sweep_points(root)
    summaries, skipped = [], []
    for p in logs:
        try:
            summaries.append(summarize(p, window, ari=ari, points=points))
        except Exception as e:  # noqa: BLE001 - analyze's rule: a log it would leave out is left out here too
            why = unusable(e)
            if why is None:
                raise
            skipped.append((str(p), why))
            warnings.warn(f"skipped {p}: {why}", stacklevel=2)
    keys = _swept(root) if root.is_dir() else None
    if keys is None:
        from mpifl.analysis.tables import varying_keys

        keys = varying_keys(summaries) if summaries else []
    from mpifl.analysis.tables import KERNEL, setting

    rows: list[dict[str, Any]] = []
    for s in summaries:
        rows.append({**{k: setting(s, k) if k == KERNEL else _cell(s.config.get(k)) for k in keys}, **run_row(s)})
    frame = pd.DataFrame(rows, columns=list(dict.fromkeys([*keys, *(k for r in rows for k in r)])))
    frame.attrs["skipped"] = skipped  # (path, why) of each log left out
    return frame


def _cell(v: Any) -> Any:
    """A config value as a DataFrame cell: lists as text, so a column can be grouped on."""
    return str(v) if isinstance(v, (list, dict)) else v



def tensorboard(paths: list[str | Path], out: Path) -> list[tuple[str, int]]:
    """``python -m mpifl.results tensorboard``: every run log under ``paths`` as
    TensorBoard events in ``out/<name>/`` (:mod:`mpifl.logging.tensorboard`); returns (name, rounds) per run. A folder
    that already holds something is refused (one line): events written twice
    would show each round twice."""
    from mpifl.logging.tensorboard import from_log, require, run_name

    require("python -m mpifl.results tensorboard")
    logs = find_logs(paths)
    if not logs:
        raise ConfigError(f"no run log (run.h5) under {', '.join(map(str, paths))}")
    named: dict[str, Path] = {}
    for log in logs:
        point = Path(log).parent
        values = (sweep_points(point.parent.parent) or {}).get(point.name) if point.parent.name == "runs" else None
        name = base = run_name(values, point.name)
        n = 1
        while name in named:
            n += 1
            name = f"{base}_{n}"
        named[name] = Path(log)
    for name in named:
        if (out / name).exists() and any((out / name).iterdir()):
            raise ConfigError(f"{str(out / name)!r} already holds files; give another --out (events written again "
                              f"would show every round twice)")
    return [(name, from_log(h5.open_run(log), out / name)) for name, log in named.items()]


def main(argv: list[str] | None = None) -> int:
    """``python -m mpifl.results tensorboard PATHS --out DIR``; ``python -m mpifl.results export RUN``."""
    import argparse
    import json
    import sys


    ap = argparse.ArgumentParser(prog="python -m mpifl.results", description="run logs for other tools")
    sub = ap.add_subparsers(dest="command", required=True)
    tb = sub.add_parser("tensorboard", help="each run log under PATHS as TensorBoard events in DIR/<run>/ (a "
                                           "sweep's runs named by their swept values); needs pip install -e '.[tb]'")
    tb.add_argument("paths", nargs="+", help="run.h5 files, run directories or sweep directories")
    tb.add_argument("--out", type=Path, required=True, help="the folder to give tensorboard --logdir")
    ex = sub.add_parser("export", help="a run's models (every client's, the method's shared ones) as state_dict "
                                       "files with an index.json, from its checkpoint (mpifl/run/export.py)")
    ex.add_argument("run", type=Path, help="a run directory (or its run.h5)")
    ex.add_argument("--round", type=int, help="the round whose models to write, from 1 (default: the latest "
                                              "checkpoint's; a finished run keeps its final round's)")
    ex.add_argument("--out", type=Path, help="default: RUN/export")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if a.command == "export":
            from mpifl.run.export import export

            index = export(a.run, a.out, a.round)
            info = json.loads(index.read_text())
            print(f"wrote the models of round {info['round']} ({len(info['clients'])} clients"
                  f"{', shared: ' + ', '.join(info['shared']) if info['shared'] else ''}) under {index.parent}; "
                  f"index: {index}")
            return 0
        written = tensorboard(a.paths, a.out)
    except (ConfigError, FileNotFoundError) as e:
        print(f"mpifl.results: error: {e}", file=sys.stderr)
        return 2
    for name, rounds in written:
        print(f"{a.out / name}: {rounds} round(s)")
    print(f"wrote {len(written)} run(s) under {a.out}; view them with: tensorboard --logdir {a.out}")
    return 0


if __name__ == "__main__":
    from mpifl.cli import quiet_pipe

    raise SystemExit(quiet_pipe(main))
