"""Per-seed records: the values behind a table, one CSV row per (cell, seed, metric).

``python -m mpifl.analyze PATHS --layout L.yaml --record FILE`` writes the record of
the paper-layout table(s); without ``--layout``, of ``table.md`` (method:
``algorithm.name``, setting: the other keys the runs vary by). Columns:

- ``table``, ``layout``: the table's title and its layout file (relative to the
  repository where it lies in it; empty without a layout);
- ``method``, ``setting``: the cell (the layout's row and column);
- ``seed``, ``metric``, ``value``: the run's seed and its metric in percent (an
  ``ari:SOURCE`` as it is: :func:`mpifl.analysis.summary.metric_value`),
  written with every digit (``repr``), so a re-run can be compared bit for bit;
- ``config``: the run's config keys that differ from the defaults (JSON; where a
  run's files were, ``run.name`` and ``run.out_dir``, left out): what
  ``python -m mpifl.reproduce`` runs again;
- ``provenance``: what made the run (JSON, :mod:`mpifl.run.provenance`, without the
  host names and sweep).

A page's table is rendered from its record between ``<!-- generated:record
docs/reproductions/data/NAME.csv -->`` and ``<!-- /generated -->`` by
``python -m mpifl.docs`` (:func:`render`), so a number on a page cannot be typed
by hand, and ``--check`` fails when the page and its record differ. The record of
an ``--x KEY --versus NAME`` analysis renders its paired comparison the same way
(:func:`render_versus`, ``<!-- generated:versus FILE x=KEY versus=NAME ... -->``).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpifl.config.identity import WHERE
from mpifl.paths import REPO

if TYPE_CHECKING:
    from mpifl.analysis.paper_table import Layout
    from mpifl.analysis.summary import Summary

COLUMNS = ("table", "layout", "method", "setting", "seed", "metric", "value", "config", "provenance")
# facts of where a run ran that differ between runs of one table without meaning anything
_PLACE = ("hosts", "sweep", "earlier")


@dataclass
class Row:
    table: str
    layout: str
    method: str
    setting: str
    seed: int
    metric: str
    value: float
    config: dict[str, Any]
    provenance: dict[str, Any]

    @property
    def cell(self) -> tuple[str, str, str]:
        return self.table, self.method, self.setting


def run_config(r: Summary) -> dict[str, Any]:
    """The keys of a run's config that differ from the defaults (its place left out)."""
    from mpifl.analysis.summary import JOB, defaults

    d = defaults()
    return {k: v for k, v in r.config.items() if k not in (*WHERE, JOB) and (k not in d or d[k] != v)}


def _rel(path: Path) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)


def _row(table: str, layout: str, method: str, setting: str, r: Summary, metric: str) -> Row:
    from mpifl.analysis.summary import metric_value

    made = {k: v for k, v in r.provenance.items() if k not in _PLACE}
    return Row(table, layout, method, setting, r.seed, metric, metric_value(r, metric), run_config(r), made)


def layout_rows(path: Path, layout: Layout, runs: list[Summary]) -> list[Row]:
    """The record of a paper-layout table: its finished runs, cell by cell in the layout's order."""
    from mpifl.analysis.paper_table import cells

    got, _ = cells(layout, runs)
    return [_row(layout.title, _rel(path), method, setting, r, layout.metric_of(method))
            for method in layout.rows for setting in layout.columns if (method, setting) in got
            for r in sorted(got[(method, setting)].runs, key=lambda r: r.seed)]


def table_rows(groups: list, keys: list[str], metrics: tuple[str, ...]) -> list[Row]:
    """The record of ``table.md``: per group (method: ``algorithm.name``; setting:
    the other keys' values), every finished run's ``metrics``."""
    out = []
    for g in groups:
        setting = ", ".join(f"{k}={v}" for k, v in zip(keys[1:], g.key[1:]))
        out += [_row("table", "", str(g.key[0]), setting, r, m) for r in g.runs if r.complete for m in metrics]
    return out


def write(path: Path, rows: list[Row]) -> None:
    from mpifl.paths import atomic_write_text

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow([r.table, r.layout, r.method, r.setting, r.seed, r.metric, repr(float(r.value)),
                    json.dumps(r.config, sort_keys=True, separators=(",", ":")),
                    json.dumps(r.provenance, sort_keys=True, separators=(",", ":"))])
    atomic_write_text(Path(path), buf.getvalue())


class RecordError(ValueError):
    """A record that cannot be read: one line naming the file and what is wrong."""


def _parsed(p: Path, line: int, d: dict[str, str]) -> Row:
    """One line of the record, each column of its type (JSON objects for ``config``
    and ``provenance``), or a RecordError naming the line and the column."""
    def bad(column: str, what: str) -> RecordError:
        return RecordError(f"record {str(p)!r} line {line}: column {column} {what}")

    try:
        seed, value = int(d["seed"]), float(d["value"])
    except (TypeError, ValueError) as e:
        raise bad("seed or value", f"is not a number ({str(e)[:80]})") from None
    obj = {}
    for column in ("config", "provenance"):
        try:
            obj[column] = json.loads(d[column] or ("{}" if column == "provenance" else ""))
        except (TypeError, ValueError) as e:
            raise bad(column, f"is not JSON ({str(e)[:80]})") from None
        if not isinstance(obj[column], dict):
            raise bad(column, f"holds {type(obj[column]).__name__}, where a record holds a JSON object")
    if any(not isinstance(k, str) or isinstance(v, dict) for k, v in obj["config"].items()):
        raise bad("config", "is not flat: a record's config maps keys (section.key) to values")
    text = [d[c] for c in ("table", "layout", "method", "setting", "metric")]
    if any(not isinstance(t, str) for t in text):
        raise bad("table, layout, method, setting or metric", "is missing")
    return Row(*text[:4], seed, text[4], value, obj["config"], obj["provenance"])


def read(path: str | Path) -> list[Row]:
    """Every row of the record at ``path``, each checked (:func:`_parsed`): a
    RecordError names the first line that is not a record's."""
    p = Path(path)
    try:
        with open(p, newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise RecordError(f"record {str(p)!r} lacks the column(s) {', '.join(missing)}; a record has "
                                  f"{', '.join(COLUMNS)} (python -m mpifl.analyze ... --record FILE)")
            return [_parsed(p, reader.line_num, d) for d in reader]
    except OSError as e:
        raise RecordError(f"record {str(p)!r} cannot be read ({e.strerror})") from None
    except csv.Error as e:  # a field past csv's limit (131,072 characters), a NUL byte
        raise RecordError(f"record {str(p)!r} line {reader.line_num + 1}: {e}") from None
    except UnicodeDecodeError as e:
        raise RecordError(f"record {str(p)!r} is not text ({e.reason})") from None


def read_joined(paths: str, root: Path = REPO) -> list[Row]:
    """The rows of one record, or of several named with commas (``a.csv,b.csv``: a seed
    method's record beside the baselines', both holding the same controls). A value
    both hold (the same method, setting, seed and metric) is kept once, and must be
    equal in both: two records of different runs of one point are refused."""
    out: dict[tuple[str, str, str, int, str], Row] = {}
    for path in paths.split(","):
        for r in read(root / path):
            key = (r.table, r.method, r.setting, r.seed, r.metric)
            old = out.setdefault(key, r)
            if old is not r and repr(old.value) != repr(r.value):
                raise RecordError(f"records {paths!r} disagree on {r.method} ({r.setting}) seed {r.seed} "
                                  f"{r.metric}: {old.value!r} and {r.value!r}; join records of the same runs")
    return list(out.values())


def cells(rows: list[Row]) -> dict[tuple[str, str, str], list[Row]]:
    """Rows by cell (table, method, setting), in the record's order."""
    out: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        out.setdefault(r.cell, []).append(r)
    return out


def render(path: str | Path, root: Path = REPO) -> str:
    """The record's table(s) as the page shows them: each layout's table
    (``mpifl.analysis.paper_table``) with its provenance line."""
    from mpifl.analysis.paper_table import Cell, load_layout, render_cells
    from mpifl.run.provenance import table_line

    rows = read(root / path)
    out = []
    for table in dict.fromkeys(r.table for r in rows):
        mine = [r for r in rows if r.table == table]
        if not mine[0].layout:
            raise RecordError(f"record {str(path)!r}: table {table!r} has no layout file to render it with")
        layout = load_layout(root / mine[0].layout)
        got = {}
        for (_, method, setting), rs in cells(mine).items():
            got[(method, setting)] = Cell([r.value for r in rs], [r.seed for r in rs])
        line, warnings = table_line([r.provenance for r in mine])
        out.append(render_cells(layout, got, [], ddof=1) + "\n" + line + "\n"
                   + "".join(f"\nwarning: the table mixes {w}\n" for w in warnings))
    return "\n".join(out)


def _curves(path: str | Path, root: Path, x: str, y: str | None, metric: str
            ) -> tuple[list[Row], list[str], list, list[str]]:
    """The record's rows of ``metric``, a layout's columns (for ``x="setting"``), one
    curve per (method, y) over x, in the record's row order, and the grouping keys
    (:func:`_arms`): what the paired and the mean tables are both made of."""
    from mpifl.analysis import curves as cv
    from mpifl.analysis.summary import defaults

    rows = [r for r in read_joined(str(path), root) if r.metric == metric]
    if not rows:
        raise RecordError(f"record {str(path)!r} has no row of metric {metric!r}")
    d = defaults()

    def value(r: Row, key: str) -> float:
        v = r.config.get(key, d.get(key))
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RecordError(f"record {str(path)!r}: a {r.method} run has {key}={v!r}; x and y must be numbers")
        return float(v)

    keys, arm = _arms(rows, (x, y))
    columns = list(dict.fromkeys(r.setting for r in rows))  # x="setting": a layout's columns, by position
    by: dict[tuple[tuple[str, ...], float | None], dict[float, list[Row]]] = {}
    for r in rows:
        xv = float(columns.index(r.setting)) if x == "setting" else value(r, x)
        by.setdefault((arm(r), None if y is None else value(r, y)), {}).setdefault(xv, []).append(r)
    cs = []
    order = list(dict.fromkeys(arm(r) for r in rows))  # the record's (its table's) row order
    for (method, yv), points in sorted(by.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1] or 0.0)):
        parts = [method[0], *(f"{k}={v}" for k, v in zip(keys[1:], method[1:]) if v != NOT_READ)]
        c = cv.Curve(method, ", ".join(parts + ([f"{y}={cv._num(yv)}"] if yv is not None else [])), y=yv)
        for xv in sorted(points):
            rs = sorted(points[xv], key=lambda r: r.seed)
            c.add(xv, [r.seed for r in rs], [r.value / 100.0 for r in rs])  # the record: percent; curves: fractions
        cs.append(c)
    return rows, columns, cs, keys


# what a block says of a value an older record lacks (the time course, Local+ES, the budget)
NOT_IN_RECORD = "not in this record"
# a key of an algorithm section the run's algorithm does not read (as mpifl.analyze labels it)
NOT_READ = "–"


def _arms(rows: list[Row], axes: tuple[str | None, ...]) -> tuple[list[str], Callable[[Row], tuple[str, ...]]]:
    """The keys that tell one method's arms apart, ``algorithm.name`` first, and a
    row's arm: its method and those keys' values. They are the keys of the rows'
    ``setting`` (``table.md``'s grouping: the keys the runs vary by, :data:`NOT_READ`
    where the method does not read the key's section) other than the axes, so arms of
    one method (``dpfl.random_graph`` false and true) are compared apart as
    ``mpifl.analyze`` compares them, never pooled as if they were seeds. A layout's
    record, whose setting is a column's name, has none."""
    from mpifl.algorithms import NAMES
    from mpifl.analysis.summary import defaults

    d = defaults()
    named = list(dict.fromkeys(k for r in rows for k in _pairs(r)))  # in the records' order: labels are stable

    def pairs(r: Row) -> dict[str, str]:
        # a key outside algorithm sections that another record's rows name and this row's
        # does not (records of two sweeps joined): its value is in the row's config (or a
        # default), so Local at one epoch in one record pairs with a method at one epoch in another
        got = _pairs(r)
        for k in named:
            if k not in got and k.split(".", 1)[0] not in NAMES and (k in r.config or k in d):
                got[k] = str(r.config.get(k, d.get(k)))
        return got

    parsed = [pairs(r) for r in rows]
    keys = [k for k in dict.fromkeys(k for p in parsed for k in p)  # the keys whose value varies
            if k not in axes and len({p.get(k, NOT_READ) for p in parsed}) > 1]
    return ["algorithm.name", *keys], lambda r: (r.method, *(pairs(r).get(k, NOT_READ) for k in keys))


def _pairs(r: Row) -> dict[str, str]:
    """A row's setting as {key: value}."""
    return dict(p.split("=", 1) for p in _SETTING.split(r.setting) if "=" in p)


# a setting's "key=value" parts: split before each dotted key (a value may hold ", ": a list)
_SETTING = re.compile(r", (?=[A-Za-z_][\w]*\.[\w.]+=)")


def _chosen(path: str | Path, have: list[str], methods: tuple[str, ...]) -> list[str]:
    """The methods a block shows, in its order: ``methods`` (each must be in the
    record), else every one the record has, in the record's order."""
    bad = [m for m in methods if m not in have]
    if bad:
        raise RecordError(f"record {str(path)!r} has no method {', '.join(bad)}; it has {', '.join(have)}")
    return list(methods) or have


def _provenance(rows: list[Row]) -> str:
    from mpifl.run.provenance import table_line

    line, warnings = table_line([r.provenance for r in rows])
    return line + "\n" + "".join(f"\nwarning: the table mixes {w}\n" for w in warnings)


def _crossovers(path: str | Path, keys: list[str], cs: list, versus: str, methods: tuple[str, ...],
                ceiling: str | None, where: dict[str, str] | None) -> list:
    """The record's methods paired against ``versus`` (:func:`curves.crossovers`), a
    refusal naming the record."""
    from mpifl.analysis import curves as cv

    try:
        return cv.crossovers(keys, cs, versus, list(methods), ceiling, where)
    except cv.CurveError as e:
        raise RecordError(f"record {str(path)!r}: {e}") from None


def render_versus(path: str | Path, root: Path = REPO, *, x: str, versus: str, y: str | None = None,
                  ceiling: str | None = None, methods: tuple[str, ...] = (), metric: str = "final_acc",
                  where: dict[str, str] | None = None) -> str:
    """The paired comparison ``mpifl.analyze --x X --versus V [--y Y] [--ceiling C]``
    prints, made from the record's per-seed values (method: the record's method, the
    ``algorithm.name`` or a layout's row; x and y: the runs' config values, defaults
    where a run left them; ``x="setting"``: a layout's columns, in the record's order),
    with the record's provenance line: with ``y`` or ``ceiling`` analyze's own table
    (``versus.md``), else a grid of methods by x."""
    from mpifl.analysis import curves as cv

    if x == "setting" and (y is not None or ceiling is not None):
        raise RecordError(f"record {str(path)!r}: x=setting takes neither y nor ceiling")
    rows, columns, cs, keys = _curves(path, root, x, y, metric)
    cross = _crossovers(path, keys, cs, versus, methods, ceiling, where)
    table = (cv.versus_markdown(x, cross, y, ceiling, metric, where) if y or ceiling
             else cv.versus_grid(x, cross, metric, labels=dict(enumerate(columns)) if x == "setting" else None))
    used = {versus, ceiling, *methods} if methods else {r.method for r in rows}
    return table + "\n" + _provenance([r for r in rows if r.method in used])


def render_verdicts(path: str | Path, root: Path = REPO, *, x: str, y: str, versus: str,
                    methods: tuple[str, ...] = (), metric: str = "final_acc",
                    where: dict[str, str] | None = None) -> str:
    """Every method of a record against ``versus`` in one grid of cells (y x x): the
    mean paired difference and the verdict under Holm (:func:`curves.verdicts_grid`),
    with the provenance line of the rows shown."""
    from mpifl.analysis import curves as cv

    rows, _, cs, keys = _curves(path, root, x, y, metric)
    cross = _crossovers(path, keys, cs, versus, methods, None, where)
    used = {versus, *methods} if methods else {r.method for r in rows}
    return cv.verdicts_grid(x, y, cross, metric) + "\n" + _provenance([r for r in rows if r.method in used])


def render_means(path: str | Path, root: Path = REPO, *, x: str, methods: tuple[str, ...] = (),
                 metric: str = "final_acc") -> str:
    """Each method's mean ± sample std over seeds at every x, as ``mpifl.analyze --x X``
    prints it (``curves.md``), made from the record's per-seed values, with the
    provenance line of the rows shown."""
    from mpifl.analysis import curves as cv

    rows, _, cs, _ = _curves(path, root, x, None, metric)
    cs = [c for m in _chosen(path, [c.method[0] for c in cs], methods) for c in cs if c.method[0] == m]
    shown = {c.method[0] for c in cs}
    return cv.markdown(x, metric, cs, ddof=1) + "\n" + _provenance([r for r in rows if r.method in shown])


def render_rounds(path: str | Path, root: Path = REPO, *, rounds: tuple[int, ...], metric: str = "val_acc",
                  methods: tuple[str, ...] = ()) -> str:
    """Per method and setting, the mean over seeds of ``METRIC@R`` at each of ``rounds``
    (rows ``val_acc@R`` of ``mpifl.analyze --record-rounds``), with the seeds counted
    and the provenance line of the rows shown: whether the curves had flattened."""
    import numpy as np

    rows = read_joined(str(path), root)
    want = [f"{metric}@{r}" for r in rounds]
    have = {r.metric for r in rows}
    missing = [w for w in want if w not in have]
    if missing:
        raise RecordError(f"record {str(path)!r} has no row of metric {', '.join(missing)} "
                          f"(python -m mpifl.analyze ... --record FILE --record-rounds "
                          f"{','.join(str(r) for r in rounds)})")
    order = _chosen(path, list(dict.fromkeys(r.method for r in rows)), methods)
    shown = [r for r in rows if r.method in order and r.metric in want]
    by: dict[tuple[str, str], dict[str, list[Row]]] = {}
    for r in shown:
        by.setdefault((r.method, r.setting), {}).setdefault(r.metric, []).append(r)
    out = ["| method | setting | seeds | " + " | ".join(f"round {r}" for r in rounds) + " |",
           "|---|---|---|" + "---|" * len(rounds)]
    for (method, setting), per in sorted(by.items(), key=lambda kv: order.index(kv[0][0])):
        seeds = sorted({r.seed for rs in per.values() for r in rs})
        cells = [f"{np.mean([r.value for r in per[w]]):.2f}" if w in per else "–" for w in want]
        out.append(f"| {method} | {setting} | {len(seeds)} | " + " | ".join(cells) + " |")
    out += ["", f"{metric} in %, mean over clients at each round (numbered from 1), then over seeds."]
    return "\n".join(out) + "\n\n" + _provenance([r for r in shown if r.metric == want[0]])  # a run once


def versus_points(path: str | Path, root: Path = REPO, *, x: str, versus: str, y: str | None = None,
                  ceiling: str | None = None, methods: tuple[str, ...] = (),
                  metric: str = "final_acc", where: dict[str, str] | None = None) -> tuple[list[Row], list]:
    """The record's rows of ``metric`` and its paired comparison (``mpifl.analysis.curves``
    crossovers, Holm-corrected), as ``mpifl.analyze --x X --versus V`` makes it from logs:
    what ``mpifl.analyze --from-records`` writes its tables and share heatmaps from."""
    from mpifl.analysis import curves as cv

    rows, _, cs, keys = _curves(path, root, x, y, metric)
    try:  # the arms' keys: a method is paired with the baseline's arm of its own settings, as render_versus does
        return rows, cv.crossovers(keys, cs, versus, list(methods), ceiling, where)
    except cv.CurveError as e:
        raise RecordError(f"record {str(path)!r}: {e}") from None


def render_budget(path: str | Path, root: Path = REPO, *, x: str, y: str | None = None,
                  methods: tuple[str, ...] = ()) -> str:
    """The budget table (:mod:`mpifl.analysis.budget`) of a record's ``budget:*`` rows, per arm of each method and
    cell (x, and y where given), each field's mean over the cell's runs, with the
    provenance line: what a page says each method spent, never typed."""
    from mpifl.analysis.budget import FIELDS, METRIC, markdown
    from mpifl.analysis.stats import mean_std
    from mpifl.analysis.summary import defaults

    rows = [r for r in read_joined(str(path), root) if r.metric.startswith(METRIC)]
    if not rows:
        return (f"The budget is {NOT_IN_RECORD}: `python -m mpifl.analyze ... --record FILE` records each run's "
                f"steps, samples, selection samples and traffic from its log.\n")
    d = defaults()
    keys, arm = _arms(rows, (x, y))
    chosen = _chosen(path, list(dict.fromkeys(r.method for r in rows)), methods)
    cells: dict[tuple, dict[str, list[float]]] = {}
    seeds: dict[tuple, set[int]] = {}
    for r in sorted((r for r in rows if r.method in chosen), key=lambda r: chosen.index(r.method)):
        a = arm(r)
        label = ", ".join([a[0], *(f"{k}={v}" for k, v in zip(keys[1:], a[1:]) if v != NOT_READ)])
        cell = (label, *(r.config.get(k, d.get(k)) for k in ((y,) if y else ()) + (x,)))
        cells.setdefault(cell, {}).setdefault(r.metric.removeprefix(METRIC), []).append(r.value)
        seeds.setdefault(cell, set()).add(r.seed)
    head = ["method", *((y,) if y else ()), x, "n_runs"]
    labels = list(dict.fromkeys(cell[0] for cell in cells))  # each arm's rows together, its cells ascending
    table_rows = [{**dict(zip(head, cell)), "n_runs": len(seeds[cell]),
                   **{f: mean_std(cells[cell].get(f, [math.nan]))[0] for f in FIELDS}}
                  for cell in sorted(cells, key=lambda c: (labels.index(c[0]), *c[1:]))]
    shown = [r for r in rows if r.method in chosen and r.metric == METRIC + "steps"]
    return markdown([*head, *FIELDS], table_rows) + "\n" + _provenance(shown)
