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
percent, columns ``*_pct``), ``budget.csv`` and ``budget.md`` (per group, what its runs
spent per client: optimizer steps, training samples, samples used to choose
collaborators, models and bytes received: ``mpifl/analysis/budget.py``), ``runs.csv`` (one row per run, the columns of
``mpifl.results.load_sweep``), and PNG figures: ``accuracy.png`` (mean test
accuracy vs round per group), ``variance.png`` (per-client accuracy variance vs
mean, DPFL Fig. 1), ``ari.png``, and ``heatmaps/<run>/<dataset>.png`` for every
``[N, N]`` log at the chosen rounds (``--rounds``, numbered from 1 as on the
console) with clients ordered by true cluster, beside
``heatmaps/<run>/clients_label_hist.png`` (clients x classes). Legends and labels
name each group by its keys and values (``algorithm.name=oracle, train.lr=0.1``).

``--record FILE``: the per-seed values behind the table(s), one CSV row per
run and metric with the run's config and provenance (``mpifl/analysis/record.py``): what
``python -m mpifl.reproduce`` re-runs and the docs render their tables from;
without ``--layout`` it holds each run's accuracies (``ACC``), ``es_acc`` (Local+ES
where the run is Local) and its time course, ``test_acc@R`` at 10, 30, 60, 100, 150
(those the run evaluated) and its last round; ``--record-rounds 10,30,60`` adds each
run's mean validation accuracy at those rounds (``val_acc@R``: whether the curves had
flattened, from a record too).

``--x KEY [--versus NAME [--ceiling NAME]] [--y KEY2] [--method NAME] [--metric
M]``: curves of a summary metric over a swept numeric key per method; against a
baseline, paired by seed, the mean difference with its 95% interval and where
each method stops being above it; with a ceiling (a positive control such as
Oracle), the room it leaves over the baseline and each method's share of that
room; with a second key, heatmaps of the share (``mpifl/analysis/curves.py``);
against a baseline also the paired difference at every round (``course.csv``,
``course.png``) and best-validation accuracy beside the final one, against the
baseline stopped at its own best validation round (``best.csv``, ``best.md``:
``mpifl/analysis/course.py``).
``--from-records``: PATHS are per-seed records (``--record FILE``) instead of logs,
and the paired comparison (``versus.csv``, ``versus.md``, the share heatmaps) is
made from their values: the figures of sweeps whose logs are not at hand.
With ``--versus``, also ``settings.md`` (printed): per compared method, every resolved
config key whose value differs from the baseline's, and both budgets side by side.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mpifl.analysis import budget
from mpifl.analysis.plots import file_safe, plot_accuracy, plot_ari, plot_heatmaps, plot_variance
from mpifl.analysis.summary import ACC, WINDOW, Summary, find_logs, run_row, summarize, unusable
from mpifl.analysis.tables import (
    IGNORED,
    NOT_APPLICABLE,
    group_runs,
    markdown,
    setting,
    table,
    table_provenance,
    varying_keys,
    write_csv,
)
from mpifl.errors import FULL, UNWRITABLE
from mpifl.logging.h5 import Corrupt, open_run
from mpifl.paths import atomic_write_text


def read(paths: list[str | Path], window: int = WINDOW) -> tuple[list[Summary], list[tuple[Path, str]]]:
    """Every log under ``paths`` summarised, and (log, why) for each one left out."""
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
    return runs, skipped


class MixedRuns(Exception):
    """The runs under a path come from several run folders (:func:`mixed`); ``--force`` pools them."""


def mixed(paths: list[str | Path]) -> str | None:
    """A line naming the first folder in ``paths`` that holds the runs of several
    run folders (``run.out_dir``s: a sweep keeps its runs in one, ``<sweep>/runs``),
    where a broad folder (the system's temporary one) would pool several sweeps or
    unrelated runs into one table; None when each path is one run, one sweep or
    one folder of runs."""
    for p in map(Path, paths):
        if not p.is_dir() or (p / "run.h5").is_file():  # a missing path: read() names it
            continue
        homes = sorted({log.parent.parent for log in find_logs([p])})
        if len(homes) > 1:
            shown = ", ".join(str(h) for h in homes[:3]) + (f" and {len(homes) - 3} more" if len(homes) > 3 else "")
            return (f"{p} holds runs of {len(homes)} folders ({shown}): several sweeps or unrelated runs; name one "
                    f"(a sweep's folder, a run directory) or add --force to analyze them together")
    return None


def _papers(chosen: list[tuple[Path, Any]], runs: list[Summary], paths: list[str | Path], out: Path, ddof: int,
            echo) -> list[str]:
    """Each paper layout rendered from the runs to ``<out>/<layout name>.md``."""
    from mpifl.analysis.paper_table import cells, failed_points, render_cells

    papers = []
    failed = failed_points(paths) if chosen else []
    for f, layout in chosen:
        got, notes = cells(layout, runs, failed)
        text = render_cells(layout, got, notes, ddof)
        (out / f"{f.name.split('.')[0]}.md").write_text(text)
        papers.append(text)
        echo(text)
        echo(table_provenance([r for c in got.values() for r in c.runs], layout.title, echo))
    return papers


def _record(record: Path, chosen: list[tuple[Path, Any]], runs: list[Summary], groups: list, keys: list[str],
            echo, rounds: tuple[int, ...] = ()) -> None:
    """The per-seed values behind the layout tables (else behind table.md) to ``record``;
    with table.md also each run's Local+ES metric (``es_acc``), time course
    (``test_acc@R`` at :data:`mpifl.analysis.course.COURSE`'s rounds, a run's rows
    only those it has) and budget (``budget:FIELD``, those its log holds), and
    ``rounds``: each run's mean validation accuracy at those."""
    import math

    from mpifl.analysis import budget
    from mpifl.analysis import record as rec
    from mpifl.analysis.course import course_metrics
    from mpifl.analysis.summary import ES

    metrics = ACC + (ES,) + course_metrics(runs) + tuple(f"val_acc@{r}" for r in rounds) + budget.METRICS
    rows = [x for f, layout in chosen for x in rec.layout_rows(f, layout, runs)] if chosen \
        else [x for x in rec.table_rows(groups, keys, metrics)
              if not (x.metric.startswith(("test_acc@", budget.METRIC)) and math.isnan(x.value))]
    rec.write(record, rows)
    echo(f"wrote the record of {len(rows)} per-seed value(s) to {record}")


def analyze(paths: list[str | Path], out: Path, heatmaps: str = "first", rounds: list[int] | None = None,
            ddof: int = 1, echo=print, window: int = WINDOW, layouts: list[Path] = (),
            check: Callable[[list[Summary], list[str]], None] | None = None,
            record: Path | None = None, record_rounds: tuple[int, ...] = ()) -> dict[str, Any]:
    """Read the logs, write tables and figures under ``out``; returns what was made.
    ``layouts``: paper-layout files (``mpifl.analysis.paper_table``), each rendered to
    ``<out>/<layout name>.md``. ``record``: write the per-seed values behind the
    layout tables (else behind ``table.md``) there (:mod:`mpifl.analysis.record`);
    ``record_rounds``: each run's mean validation accuracy at those rounds (from 1)
    joins ``table.md``'s record as ``val_acc@R``.
    ``check(runs, keys)`` runs before anything is
    written, so a request the runs cannot answer costs no figures."""
    from mpifl.analysis.paper_table import load_layout

    chosen_layouts = [(Path(f), load_layout(f)) for f in layouts]  # a bad file fails before any reading
    runs, skipped = read(paths, window)
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
    bcols, brows = budget.table(groups, keys)
    write_csv(out / "budget.csv", bcols, brows)
    atomic_write_text(out / "budget.md", budget.markdown(bcols, brows))
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
                figures += plot_heatmaps(open_run(r.path), out / "heatmaps" / file_safe(r.name), rounds, echo,
                                         title=f"{g.label}, run.seed={r.seed}")
            except Corrupt as e:  # a round the summary did not read
                echo(f"no heatmaps of {r.path}: corrupt: {e}")
    papers = _papers(chosen_layouts, runs, paths, out, ddof, echo)
    if record is not None:
        _record(record, chosen_layouts, runs, groups, keys, echo, tuple(record_rounds))
    incomplete = [r for r in runs if not r.complete]
    echo(f"{len(runs)} run(s) in {len(groups)} group(s); grouped by: {', '.join(keys)}")
    for r in incomplete:
        echo(f"  in progress or stopped: {r.name} ({r.rounds_done}/{r.rounds_planned} rounds)")
    echo(md, end="")
    echo(table_provenance(runs, "the table", echo))
    echo("\n" + budget.markdown(bcols, brows), end="")
    echo(f"wrote {out / 'table.csv'}, {out / 'table.md'}, {out / 'budget.csv'}, {out / 'runs.csv'} and "
         f"{len(figures)} figure(s) under {out}")
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


def _curves(res: dict[str, Any], a: argparse.Namespace, out: Path) -> None:
    """``--x``: the curves, and against ``--versus`` the paired tables, the time course
    and best-validation accuracy, under ``out``."""
    from mpifl.analysis import course
    from mpifl.analysis.curves import Grouping, report

    grouping = Grouping(res["keys"], setting, NOT_APPLICABLE)
    report(res["runs"], a.x, grouping, out, a.metric, a.versus, a.method, a.ddof, ceiling=a.ceiling, y=a.y,
           where=a.where)
    if a.versus:
        course.report(res["runs"], a.x, grouping, out, a.versus, a.method, y=a.y, where=a.where)


def _from_records(ap: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    """``--from-records``: the paired comparison of per-seed records, written to ``--out``."""
    from mpifl.analysis import record as rec
    from mpifl.analysis.curves import groups_of, write_versus

    if not (a.x and a.versus):
        ap.error("--from-records needs --x KEY and --versus NAME")
    out = a.out or Path("analysis")
    joined = ",".join(str(Path(p).absolute()) for p in a.paths)
    try:
        rows, cross = rec.versus_points(joined, Path("/"), x=a.x, versus=a.versus, y=a.y, ceiling=a.ceiling,
                                        methods=tuple(a.method), metric=a.metric, where=a.where)
        out.mkdir(parents=True, exist_ok=True)
        md, made = write_versus(out, a.x, cross, a.metric, a.y, a.ceiling, groups_of([r.config for r in rows]),
                                a.where)
    except rec.RecordError as e:
        print(f"mpifl.analyze: error: {e}", file=sys.stderr)
        return 2
    print(md, end="")
    print("wrote " + ", ".join(str(p) for p in made))
    return 0


def _curve_options(c: Any) -> None:
    """The options of curves over a swept key (an argparse argument group)."""
    c.add_argument("--x", metavar="KEY", help="per method, the metric's mean ± std over seeds against this config "
                                              "key (a PNG, a CSV and a Markdown table)")
    c.add_argument("--metric", choices=ACC, default="final_acc",
                   help="with --x: the summary metric (default final_acc)")
    c.add_argument("--versus", metavar="NAME", help="with --x: each method against this algorithm.name, paired by "
                                                    "seed: mean difference, 95%% interval, above/level/below "
                                                    "and the same under Holm over each method's cells (versus.csv, "
                                                    "versus.md); the course over rounds and best-validation "
                                                    "accuracy (course.*, best.*)")
    c.add_argument("--ceiling", metavar="NAME", help="with --versus: a positive control (e.g. oracle); per seed "
                                                     "its gain over the baseline is the room and each method's "
                                                     "gain / room its share; 'no room' where the ceiling is not "
                                                     "above the baseline, 'small room' where its interval reaches "
                                                     "down to 2 points")
    c.add_argument("--versus-where", action="append", default=[], metavar="KEY=VALUE",
                   help="with --versus: the baseline's (and ceiling's) runs are those with this value of a key the "
                        "runs vary by, whatever the method's own (a pre-registered pairing at another budget: "
                        "train.max_steps=1); may be repeated")
    c.add_argument("--y", metavar="KEY2", help="with --x: a second swept numeric key; one curve per value, and "
                                               "with --ceiling a heatmap of each method's share over KEY2 x KEY")
    c.add_argument("--method", action="append", default=[], metavar="NAME",
                   help="with --versus: report this algorithm.name only (may be repeated; default all others)")
    c.add_argument("--from-records", action="store_true",
                   help="with --versus: PATHS are per-seed records (--record FILE; several are joined), not logs: "
                        "versus.csv, versus.md and the share heatmaps made from their values")


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
                    "table(s) to this CSV (mpifl/analysis/record.py), for python -m mpifl.reproduce and the docs' "
                    "tables")
    ap.add_argument("--record-rounds", type=_int_list, metavar="R,R", default=[],
                    help="with --record and no --layout: also each run's mean validation accuracy at these "
                         "rounds, numbered from 1 (metric val_acc@R), e.g. 10,30,60")
    ap.add_argument("--force", action="store_true", help="analyze together the runs of several run folders "
                    "under one path (several sweeps, unrelated runs), which is refused without it")
    c = ap.add_argument_group("curves over a swept key (mpifl/analysis/curves.py)")
    _curve_options(c)
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if a.versus_where and not a.versus:
        ap.error("--versus-where needs --versus NAME")
    from mpifl.analysis.curves import CurveError, Grouping, compute, parse_where

    try:
        a.where = parse_where(a.versus_where)
    except CurveError as e:
        ap.error(str(e))
    if a.from_records:
        return _from_records(ap, a)
    if (a.versus or a.method or a.y) and not a.x:
        ap.error("--versus, --method and --y need --x KEY")
    if a.record_rounds and (not a.record or a.layout):
        ap.error("--record-rounds needs --record FILE and no --layout")
    if any(r < 0 for r in a.record_rounds):
        ap.error(f"--record-rounds {a.record_rounds}: rounds numbered from 1, not from the end")
    if a.ceiling and not a.versus:
        ap.error("--ceiling needs --versus NAME")
    if a.method and not a.versus:
        ap.error("--method needs --versus NAME")
    out = a.out
    if out is None:
        one = Path(a.paths[0])
        out = one / "analysis" if len(a.paths) == 1 and one.is_dir() else Path("analysis")


    def check(runs: list[Summary], keys: list[str]) -> None:
        if a.x:
            compute(runs, a.x, Grouping(keys, setting, NOT_APPLICABLE), a.metric, a.versus, a.method, a.ddof,
                    a.ceiling, a.y, a.where)

    made = not out.exists()  # a folder this call makes holds only what it wrote: removed if it fails
    try:
        if not a.force and (why := mixed(a.paths)):
            raise MixedRuns(why)
        res = analyze(a.paths, out, a.heatmaps, a.rounds, a.ddof, window=max(1, a.window), layouts=a.layout,
                      check=check, record=a.record, record_rounds=tuple(a.record_rounds))
        if a.x:
            _curves(res, a, out)
        if a.versus:
            block = budget.versus_block(res["runs"], a.versus, a.method, setting, IGNORED, a.where)
            atomic_write_text(out / "settings.md", block)
            print("\n" + block, end="")
    except (FileNotFoundError, LayoutError, CurveError, MixedRuns) as e:
        print(f"mpifl.analyze: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the output folder: read-only, not ours, full
        return _unwritable_out(e, out, made)
    return 0


if __name__ == "__main__":
    from mpifl.cli import quiet_pipe

    sys.exit(quiet_pipe(main))
