"""Run a record's points again and say how well they agree:
``python -m mpifl.reproduce RECORD [--cells K] [--parallel P] [--out DIR] [--versus NAME] [--max-runs N]``.

RECORD is a per-seed record (:mod:`mpifl.analysis.record`, ``mpifl.analyze --record``).
Every run behind its cells (all, or the first K cells in the record's order) is
made again from the config the record holds, one rank each, ``P`` at a time on
warm workers (``mpifl.sweep --local``'s machinery; the runs go to
``DIR/reproduce/runs/``, and a run already complete there is not made again).
Before any run is made the whole record is checked, each refusal one line (exit
2): every line's columns of their types (``config`` and ``provenance`` JSON
objects, no field past 131,072 characters), one run per (cell, seed) (a row's
config holds its own seed), every run's config as ``mpifl.main`` would take it,
and no more than ``--max-runs`` runs (100). Ctrl-C or SIGTERM stops the runs at
a round boundary with a checkpoint; the same command goes on from there.
Then, per cell and metric (a record made without a layout holds several metrics
of each run, each judged apart):

- ``bitwise``: every seed's value is the recorded one, bit for bit;
- ``within``: not bitwise, but the 95% t-interval of the paired differences
  (re-run minus record, one per seed: :func:`mpifl.analysis.stats.paired_interval`)
  contains 0: the re-run agrees up to the float noise of its seeds;
- ``differs``: the interval excludes 0 (or there is one seed, or a run failed).

Over a whole table some intervals exclude 0 by chance alone (at 95%, one cell
metric in twenty on average where the re-run agrees everywhere): a closing line
counts them against that expectation and gives the smallest Holm-adjusted p-value
over the table's cell metrics (:func:`mpifl.analysis.stats.holm`): under 0.05, a
difference the table's tests together, held to 5%, still find.

With ``--versus NAME`` (a method of the record), every other method minus NAME,
paired by seed in each setting (on the cell's first metric), on the record and on
the re-run, with the verdict
of each (``above``/``below`` where the 95% interval excludes 0, else ``level``, as
``analyze --versus``): a verdict the re-run moves is one its seeds do not separate
from this re-run's float noise. It does not change the exit status.

Last, whether this re-run's provenance matches the record's: commit, CPU
capability, training (the conv kernel, with the fused kernel's compiler and
flags, the threads a rank, batched or per client: :func:`mpifl.run.provenance.training`),
versions. Same commit, versions, CPU capability and training promise
``bitwise``; anything else promises ``within`` at most. Exit status 0 unless a
cell differs (1); 2 for a record that cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mpifl.analysis.record import RecordError, Row, cells, read
from mpifl.errors import ConfigError
from mpifl.paths import REPO

SWEEP_NAME = "reproduce"  # the folder under --out the runs go to
MAX_RUNS = 100  # runs made without --max-runs: a record of thousands of rows is not re-made by a typo
VERDICTS = ("bitwise", "within", "differs")


def _key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


def plan(rows: list[Row], n_cells: int | None) -> tuple[dict[tuple, list[Row]], dict[str, dict[str, Any]]]:
    """The chosen cells' rows, and each distinct run config behind them (by its JSON)."""
    chosen = dict(list(cells(rows).items())[:n_cells] if n_cells else cells(rows).items())
    runs = {_key(r.config): r.config for rs in chosen.values() for r in rs}
    return chosen, runs


def check_rows(record: Path, chosen: dict[tuple, list[Row]]) -> None:
    """Refuse, before any run, a record whose rows are not one run per (cell, seed):
    a seed twice in a cell's metric, or a row whose config's ``run.seed`` is not its
    seed (rows of one run counted as several seeds)."""
    from mpifl.analysis.summary import defaults

    default_seed = defaults()["run.seed"]
    for (_, method, setting), rs in chosen.items():
        seen: dict[tuple[str, int], Row] = {}
        for r in rs:
            run_seed = r.config.get("run.seed", default_seed)
            if run_seed != r.seed:
                raise RecordError(f"record {str(record)!r}: a {method} / {setting} row of seed {r.seed} holds the "
                                  f"config of run.seed={str(run_seed)[:40]}; a record holds each seed's own run "
                                  f"(python -m mpifl.analyze ... --record FILE)")
            if seen.setdefault((r.metric, r.seed), r) is not r:
                raise RecordError(f"record {str(record)!r}: {method} / {setting} holds seed {r.seed} twice for "
                                  f"{r.metric}; a record holds one run per (cell, seed)")


def points(runs: dict[str, dict[str, Any]], root: Path) -> list:
    """The runs as sweep points under ``root``, each config checked as ``mpifl.main``
    would (a config it refuses is refused here, before any run, naming the run)."""
    try:
        return _points(runs, root)
    except ConfigError as e:
        raise RecordError(f"a run of the record is refused before any is made: {e}") from None


def _points(runs: dict[str, dict[str, Any]], root: Path) -> list:
    from mpifl import config as config_mod
    from mpifl.analysis.summary import defaults
    from mpifl.sweep.spec import Point

    points = []
    for i, flat in enumerate(runs.values()):
        raw: dict[str, Any] = {}
        for k, v in flat.items():
            config_mod.assign(raw, k, v, "record")
        full = {**defaults(), **flat}
        name = f"{i:03d}_{full['algorithm.name']}_seed-{full['run.seed']}"
        config_mod.assign(raw, "run.name", name, "reproduce")
        config_mod.assign(raw, "run.out_dir", str(root / "runs"), "reproduce")
        points.append(Point(i, name, {}, config_mod.from_dict(raw)))
    return points


def _local(sw: Any, parallel: int) -> None:
    """``mpifl.sweep --local``: one rank per run, ``parallel`` warm workers."""
    from mpifl.sweep.runner import run_local

    run_local(sw, 1, REPO, parallel=parallel)


def rerun(runs: dict[str, dict[str, Any]], out: Path, parallel: int, source: Path,
          run_points: Callable[[Any, int], None] = _local) -> dict[str, Path]:
    """Make every run again under ``out/reproduce`` as a sweep of its own (its
    ``sweep.yaml`` names ``source``) with ``run_points(sweep, parallel)``;
    returns each config's log."""
    from mpifl.paths import RunDir
    from mpifl.sweep.rundirs import write
    from mpifl.sweep.spec import SlurmOptions, Sweep

    root = (out / SWEEP_NAME).resolve()
    chosen = points(runs, root)
    sw = Sweep(SWEEP_NAME, source.resolve(), None, root, {}, {}, SlurmOptions.from_dict({}), chosen)
    write(sw, REPO)
    run_points(sw, parallel)
    return {key: RunDir(p.config.run_dir).log for key, p in zip(runs, chosen)}


def judge(rows: list[Row], new: dict[int, float]) -> tuple[str, str, float]:
    """A cell's verdict, its detail and the paired test's p-value (NaN where there is
    none: a missing value or one seed; 1 where bitwise), from its recorded rows and
    the re-run's value per seed."""
    import math

    from mpifl.analysis.stats import paired_interval, paired_p

    missing = [r.seed for r in rows if r.seed not in new or math.isnan(new[r.seed])]
    if missing:
        return "differs", f"no value re-made for seed(s) {', '.join(map(str, missing))}", math.nan
    if all(new[r.seed] == r.value for r in rows):
        return "bitwise", f"{len(rows)} seed(s) equal bit for bit", 1.0
    diffs = [new[r.seed] - r.value for r in rows]
    mean, low, high, n = paired_interval(diffs)
    if n < 2:
        return "differs", f"re-run - record {mean:+.3f} points (1 seed: no interval)", math.nan
    p = paired_p(diffs)
    text = f"re-run - record {mean:+.3f} points, 95% interval [{low:+.3f}, {high:+.3f}] over {n} seeds, p {p:.3g}"
    return ("within" if low <= 0.0 <= high else "differs"), text, p


def table_line(tested: list[tuple[str, float]]) -> str:
    """The closing count over a table's ``(cell, p)``: how many exclude 0 at 95%
    against the twentieth expected by chance, and the smallest Holm-adjusted p."""
    import math

    from mpifl.analysis.stats import holm

    have = [(name, p) for name, p in tested if not math.isnan(p)]
    if not have:
        return "mpifl.reproduce: table-wide: no cell metric with a paired test"
    adjusted = holm([p for _, p in have])
    k = min(range(len(have)), key=lambda i: have[i][1])  # the smallest p: the smallest adjusted one too
    n_out = sum(p < 0.05 for _, p in have)
    return (f"mpifl.reproduce: table-wide: {n_out} of {len(have)} cell metric(s) exclude 0 at 95% "
            f"({0.05 * len(have):.1f} expected by chance where the re-run agrees everywhere); smallest "
            f"Holm-adjusted p {adjusted[k]:.3g} ({have[k][0]}): "
            + ("a difference the table's tests together find" if adjusted[k] < 0.05
               else "no difference the table's tests together find at 5%"))


def versus_lines(values: dict[tuple[str, str, int], tuple[float, float]], name: str) -> list[str]:
    """Each method minus ``name`` per setting, paired by seed, on the record and the
    re-run (``values[(method, setting, seed)] = (recorded, re-made)``), and a closing
    count of the verdicts the re-run keeps."""
    from mpifl.analysis.stats import paired_interval, verdict

    by: dict[tuple[str, str], dict[int, tuple[float, float]]] = {}
    for (method, setting, seed), pair in values.items():
        by.setdefault((method, setting), {})[seed] = pair
    out, moved, n = [], [], 0
    for (method, setting), cell in by.items():
        ref = by.get((name, setting), {})
        seeds = sorted(cell.keys() & ref.keys())
        if method == name or not seeds:
            continue
        texts, verdicts = [], []
        for i in (0, 1):  # the record's values, then the re-run's
            mean, low, high, _ = paired_interval([cell[k][i] - ref[k][i] for k in seeds])
            verdicts.append(verdict(low, high))
            texts.append(f"{mean:+.2f} [{low:+.2f}, {high:+.2f}] {verdicts[-1]}")
        n += 1
        kept = verdicts[0] == verdicts[1]
        if not kept:
            moved.append(f"{method} / {setting}")
        out.append(f"versus   {method} - {name} / {setting}: record {texts[0]}; re-run {texts[1]}"
                   + ("" if kept else "  (moved)"))
    out.append(f"mpifl.reproduce: versus {name}: {n - len(moved)} of {n} verdict(s) the same on the re-run"
               + (f"; moved: {', '.join(moved)}" if moved else ""))
    return out


def _facts(p: dict[str, Any]) -> dict[str, str]:
    from mpifl.run.provenance import brief, commit_text

    b = brief(p)
    return {"commit": commit_text(p), "CPU capability": b["cpu_capability"], "training": b["train"],
            "versions": json.dumps(p.get("versions") or {}, sort_keys=True)}


def compare_provenance(recorded: list[dict[str, Any]], made: list[dict[str, Any]]) -> list[str]:
    """One line per fact: the record's value(s), this re-run's, and whether they match."""
    out = []
    for fact in ("commit", "CPU capability", "training", "versions"):
        old = sorted({_facts(p)[fact] for p in recorded})
        new = sorted({_facts(p)[fact] for p in made})
        if fact == "versions":
            olds = [json.loads(v) for v in old]
            news = [json.loads(v) for v in new]
            keys = sorted({k for d in olds + news for k in d})
            diff = [k for k in keys if {d.get(k) for d in olds} != {d.get(k) for d in news}]
            text = "same" if not diff else "; ".join(
                f"{k} {'/'.join(sorted({str(d.get(k)) for d in olds}))} in the record, "
                f"{'/'.join(sorted({str(d.get(k)) for d in news}))} here" for k in diff)
            out.append(f"provenance: versions {text}")
            continue
        same = old == new and "unknown" not in old
        out.append(f"provenance: {fact} {'; '.join(old)} in the record, {'; '.join(new)} here: "
                   + ("same" if same else "differs"))
    return out


def reproduce(record: Path, n_cells: int | None = None, parallel: int = 1, out: Path = Path("reproduce"),
              echo=print, run_points: Callable[[Any, int], None] = _local, versus: str | None = None,
              max_runs: int = MAX_RUNS) -> int:
    """The whole command; returns its exit status. ``run_points``: how the runs are
    made (:func:`rerun`; the tests' runs stay in their process)."""
    from mpifl.analysis.summary import metric_value, summarize
    from mpifl.sweep.runner import PREEMPTED, Interrupted

    rows = read(record)
    if not rows:
        raise RecordError(f"record {str(record)!r} holds no rows")
    chosen, runs = plan(rows, n_cells)
    check_rows(record, chosen)
    methods = list(dict.fromkeys(method for _, method, _ in chosen))
    if versus is not None and versus not in methods:  # before any run is made
        raise RecordError(f"--versus {versus!r}: no such method in the chosen cells (they hold: {', '.join(methods)})")
    if len(runs) > max_runs:
        raise RecordError(f"record {str(record)!r}: {len(chosen)} cell(s) are {len(runs)} runs, more than --max-runs "
                          f"{max_runs}; pass --max-runs {len(runs)} to make them all, or --cells K for the first K")
    echo(f"mpifl.reproduce: {len(chosen)} cell(s) of {record}, {len(runs)} run(s), {parallel} at a time, under "
         f"{out / SWEEP_NAME}")
    try:
        logs = rerun(runs, out, parallel, record, run_points)
    except Interrupted:  # the sweep driver said where its runs stopped and that the same command goes on
        return PREEMPTED
    summaries = {}
    for key, log in logs.items():
        try:
            summaries[key] = summarize(log, ari=False)
        except Exception as e:  # noqa: BLE001 - a run that failed or left no readable log: its cells differ
            echo(f"mpifl.reproduce: no result from {log}: {e}")
    counts = dict.fromkeys(VERDICTS, 0)
    values = {}  # (method, setting, seed): (recorded, re-made) of the cell's first metric, for --versus
    tested: list[tuple[str, float]] = []  # (cell metric, paired p), for the table-wide line
    for (_, method, setting), rs in chosen.items():
        by_metric: dict[str, list[Row]] = {}
        for r in rs:  # a record without a layout holds several metrics per run: each is judged apart
            by_metric.setdefault(r.metric, []).append(r)
        for k, (metric, mrs) in enumerate(by_metric.items()):
            new = {}
            for r in mrs:
                s = summaries.get(_key(r.config))
                if s is not None and s.complete:
                    new[r.seed] = metric_value(s, metric)
                    if k == 0:
                        values[(method, setting, r.seed)] = (r.value, new[r.seed])
            verdict, detail, p = judge(mrs, new)
            counts[verdict] += 1
            tested.append((f"{method} / {setting} ({metric})", p))
            echo(f"{verdict:8s} {method} / {setting} ({metric}): {detail}")
    if versus is not None:
        for line in versus_lines(values, versus):
            echo(line)
    recorded = [r.provenance for rs in chosen.values() for r in rs]
    for line in compare_provenance(recorded, [s.provenance for s in summaries.values()]):
        echo(line)
    n_judged = sum(counts.values())
    of = f"{len(chosen)} cell(s)" if n_judged == len(chosen) else f"{n_judged} cell metrics in {len(chosen)} cell(s)"
    echo(f"mpifl.reproduce: {counts['bitwise']} bitwise, {counts['within']} within, {counts['differs']} differs "
         f"(of {of})")
    echo(table_line(tested))
    return 1 if counts["differs"] else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mpifl.reproduce", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("record", type=Path, help="a per-seed record (mpifl.analyze --record FILE)")
    ap.add_argument("--cells", type=int, metavar="K", help="only the first K cells of the record (default all)")
    ap.add_argument("--parallel", type=int, default=1, metavar="P", help="runs at once (default 1)")
    ap.add_argument("--out", type=Path, default=Path("reproduce"), metavar="DIR",
                    help="where the runs go: DIR/reproduce/runs/ (default ./reproduce)")
    ap.add_argument("--versus", metavar="NAME", help="also every method minus NAME, paired by seed, on the record and "
                    "the re-run: which verdicts the re-run keeps")
    ap.add_argument("--max-runs", type=int, default=MAX_RUNS, metavar="N",
                    help=f"refuse a record of more than N runs, before any is made (default {MAX_RUNS})")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    for flag, value in (("--cells", a.cells), ("--parallel", a.parallel), ("--max-runs", a.max_runs)):
        if value is not None and value < 1:
            ap.error(f"{flag} {str(value)[:20]}: at least 1")
    try:
        return reproduce(a.record, a.cells, a.parallel, a.out, versus=a.versus, max_runs=a.max_runs)
    except (RecordError, ConfigError) as e:
        print(f"mpifl.reproduce: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"mpifl.reproduce: stopped (Ctrl-C); the runs complete under {a.out / SWEEP_NAME} are kept, and the "
              f"same command makes only the rest", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
