"""Generated blocks of the documentation, so that docs cannot drift from the code.

    python -m mpifl.docs --check    # exit 1 naming every stale block, count or quote
    python -m mpifl.docs --write    # refresh them in place
    python -m mpifl.docs --typed    # the reproduction pages' tables no record stands behind

A block is the text between ``<!-- generated:NAME -->`` and ``<!-- /generated -->``
in one of :data:`FILES`; :data:`BLOCKS` maps NAME to the function that renders it.
Adding a block is adding a function and an entry; adding an algorithm changes
nothing here (its module carries what its table row says). The counts and quoted
results of every page (configs, runs, tests, another page's numbers) and the
README's python examples are checked too (:mod:`mpifl.docs.counts`), and every
table of a reproduction page is rendered from a record or says why it is typed
(:mod:`mpifl.docs.typed`).

A block with an argument, ``<!-- generated:record docs/reproductions/data/X.csv -->``,
is rendered by :data:`ARG_BLOCKS` from that file: a reproduction page's table from
its per-seed record (:mod:`mpifl.analysis.record`), so the page's numbers are the record's.
``<!-- generated:versus FILE x=KEY versus=NAME [y=KEY2] [ceiling=NAME] [method=A,B]
[metric=M] -->`` renders the paired comparison of ``mpifl.analyze --x --versus`` from
such a record; ``x=setting`` compares the rows of a layout's table column by column
(``versus="Local Training"``: quoted where a name holds spaces); ``FILE`` may name
several records joined by commas (a seed method's beside the baselines'). ``<!-- generated:means
FILE x=KEY [method=A,B] [metric=M] -->`` renders each method's mean ± std over seeds at
every x, as ``mpifl.analyze --x`` prints it; ``<!-- generated:rounds FILE rounds=R,R
[method=A,B] -->`` the mean validation accuracy at those rounds per method and
setting (a record written with ``--record-rounds``); ``<!-- generated:settings FILE
[keys=K,K] [method=A,B] -->`` each method's settings as its runs resolved them
(:mod:`mpifl.docs.settings`, which also checks the settings a page's prose states).
``<!-- generated:course FILE x=KEY
versus=NAME [y=KEY2] [method=A,B] [rounds=R,R] -->`` renders each method minus NAME at
fixed rounds (``test_acc@R``), ``<!-- generated:best FILE x=KEY versus=NAME [y=KEY2]
[method=A,B] -->`` best-validation accuracy beside the final one and against NAME
stopped at its best validation round (:mod:`mpifl.analysis.course`); ``<!--
generated:budget FILE x=KEY [y=KEY2] [method=A,B] -->`` what each method spent per
cell: steps, samples, selection samples, traffic (:mod:`mpifl.analysis.budget`); a
record made before those were recorded renders "not in this record"; ``<!--
generated:verdicts FILE x=KEY y=KEY2 versus=NAME [method=A,B] -->`` every method
against NAME in one grid of cells, each its mean difference and verdict under Holm,
an overview above the methods' own tables. ``versus``,
``course`` and ``best`` take ``where=K=V[,K=V]``: the baseline's (and ceiling's) arm at
those settings, whatever the method's own (``mpifl.analyze --versus-where``: a
pre-registered pairing at another budget, FedeRiCo against Local at
``train.max_steps=1``).
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from mpifl.paths import REPO

ROOT = REPO
FILES = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "reproductions").glob("*.md")))
# the sweep that runs every algorithm on its own job file: the table's "job file"
JOBS_SWEEP = "jobs/sweeps/quickstart-algorithms.yaml"
BLOCK = re.compile(r"(<!-- generated:(\w+)(?: ([^\n]+?))? -->\n)(.*?)(<!-- /generated -->)", re.S)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _summary(mod) -> str:
    """The module's ``SUMMARY``, else its docstring's first sentence."""
    text = getattr(mod, "SUMMARY", None)
    if text is None:
        text = " ".join((mod.__doc__ or "").split())
        text = text.split(". ")[0].rstrip(".")
    return text


def job_files(root: Path = ROOT) -> dict[str, str]:
    """Algorithm -> the job file cell: the base of :data:`JOBS_SWEEP` whose
    ``algorithm.name`` it is; an algorithm the sweep sets on every base (Local)
    gets the first base with that override."""
    sweep_path = root / JOBS_SWEEP
    sweep = yaml.safe_load(sweep_path.read_text())
    out: dict[str, str] = {}
    bases = [(sweep_path.parent / b).resolve().relative_to(root) for b in sweep["grid"]["base"]]
    for b in bases:
        name = (yaml.safe_load((root / b).read_text()).get("algorithm") or {}).get("name")
        if name:
            out.setdefault(name, f"`{b}`")
    for name in sweep["grid"].get("algorithm.name") or []:
        if name is not None:
            out.setdefault(name, f"`{bases[0]}` (`algorithm.name={name}`)")
    return out


def algorithm_table(root: Path = ROOT) -> str:
    """Every algorithm of ``mpifl.algorithms.NAMES``: what it does and row i of its
    mixing matrix (from its module), and the job file that shows it at its best."""
    from mpifl import algorithms

    jobs = job_files(root)
    out = ["| name | what | mixing row of client i | job file |", "|---|---|---|---|"]
    for name in algorithms.NAMES:
        mod = algorithms.get(name)
        cells = [f"`{name}`", _summary(mod), getattr(mod, "MIXING_ROW", "–"), jobs.get(name, "–")]
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(out)


def config_reference(root: Path = ROOT) -> str:
    """Every config key (``python -m mpifl.config``)."""
    from mpifl.config import reference

    return reference()


def record_table(root: Path, path: str) -> str:
    """The table(s) of a per-seed record, as ``mpifl.analyze --layout`` prints them."""
    from mpifl.analysis.record import render

    return render(path, root).rstrip("\n")


def _options(block: str, arg: str, takes: tuple[str, ...], needs: str, ok) -> tuple[str, dict[str, str], tuple]:
    """A record block's argument ``FILE key=value ...``: the file, its options (``method=A,B``
    split into a tuple, returned apart) or one line naming the block, what it needs and
    what it takes. ``ok(opts)``: whether the required options are there and valid."""
    path, *rest = shlex.split(arg)  # a layout's row names hold spaces: versus="Local Training"
    opts = dict(o.split("=", 1) if "=" in o else (o, "") for o in rest)
    bad = [k for k in opts if k not in takes]
    if bad or not ok(opts):
        raise ValueError(f"generated:{block} {arg!r}: needs {needs}; takes {', '.join(takes)}"
                         + (f" (not {', '.join(bad)})" if bad else ""))
    return path, opts, tuple(m for m in opts.pop("method", "").split(",") if m)


def versus_table(root: Path, arg: str) -> str:
    """``FILE x=KEY versus=NAME [y=KEY2] [ceiling=NAME] [method=A,B] [metric=M]``: the
    paired comparison of a record (:func:`mpifl.analysis.record.render_versus`)."""
    from mpifl.analysis.record import render_versus

    path, opts, methods = _options("versus", arg, ("x", "versus", "y", "ceiling", "method", "metric", "where"),
                                   "x=KEY and versus=NAME", lambda o: o.get("x") and o.get("versus"))
    return render_versus(path, root, methods=methods, **_where(opts)).rstrip("\n")


def verdicts_table(root: Path, arg: str) -> str:
    """``FILE x=KEY y=KEY2 versus=NAME [method=A,B] [metric=M] [where=K=V]``: every
    method against NAME in one grid of cells, each its verdict under Holm
    (:func:`mpifl.analysis.record.render_verdicts`)."""
    from mpifl.analysis.record import render_verdicts

    path, opts, methods = _options("verdicts", arg, ("x", "y", "versus", "method", "metric", "where"),
                                   "x=KEY, y=KEY2 and versus=NAME",
                                   lambda o: o.get("x") and o.get("y") and o.get("versus"))
    return render_verdicts(path, root, methods=methods, **_where(opts)).rstrip("\n")


def _where(opts: dict[str, str]) -> dict:
    """``where=K=V,K=V`` (the baseline's and ceiling's runs at those settings) as a dict."""
    from mpifl.analysis.curves import parse_where

    return {**opts, "where": parse_where(opts["where"])} if "where" in opts else opts


def means_table(root: Path, arg: str) -> str:
    """``FILE x=KEY [method=A,B] [metric=M]``: each method's mean ± std over seeds at
    every x of a record (:func:`mpifl.analysis.record.render_means`)."""
    from mpifl.analysis.record import render_means

    path, opts, methods = _options("means", arg, ("x", "method", "metric"), "x=KEY", lambda o: o.get("x"))
    return render_means(path, root, methods=methods, **opts).rstrip("\n")


def _rounds(text: str) -> tuple[int, ...]:
    return tuple(int(r) for r in text.split(",")) if text.replace(",", "").isdigit() else ()


def rounds_table(root: Path, arg: str) -> str:
    """``FILE rounds=R,R [method=A,B] [metric=val_acc]``: per method and setting, the
    mean over seeds at those rounds (:func:`mpifl.analysis.record.render_rounds`)."""
    from mpifl.analysis.record import render_rounds

    path, opts, methods = _options("rounds", arg, ("rounds", "method", "metric"), "rounds=R,R (numbers from 1)",
                                   lambda o: bool(_rounds(o.get("rounds", ""))) and all(_rounds(o["rounds"])))
    return render_rounds(path, root, rounds=_rounds(opts.pop("rounds")), methods=methods, **opts).rstrip("\n")


def course_table(root: Path, arg: str) -> str:
    """``FILE x=KEY versus=NAME [y=KEY2] [method=A,B] [rounds=R,R]``: each method minus
    NAME at fixed rounds (:func:`mpifl.analysis.course.render_course`)."""
    from mpifl.analysis.course import render_course

    path, opts, methods = _options("course", arg, ("x", "versus", "y", "method", "rounds", "where"),
                                   "x=KEY and versus=NAME",
                                   lambda o: o.get("x") and o.get("versus") and (
                                       "rounds" not in o or all(_rounds(o["rounds"])) and _rounds(o["rounds"])))
    if "rounds" in opts:
        opts["rounds"] = _rounds(opts["rounds"])
    return render_course(path, root, methods=methods, **_where(opts)).rstrip("\n")


def best_table(root: Path, arg: str) -> str:
    """``FILE x=KEY versus=NAME [y=KEY2] [method=A,B]``: best-validation accuracy beside the
    final one and against NAME+ES (:func:`mpifl.analysis.course.render_best`)."""
    from mpifl.analysis.course import render_best

    path, opts, methods = _options("best", arg, ("x", "versus", "y", "method", "where"), "x=KEY and versus=NAME",
                                   lambda o: o.get("x") and o.get("versus"))
    return render_best(path, root, methods=methods, **_where(opts)).rstrip("\n")


BLOCKS: dict[str, Callable[[Path], str]] = {"algorithms": algorithm_table, "config": config_reference}
def budget_table(root: Path, arg: str) -> str:
    """``FILE x=KEY [y=KEY2] [method=A,B]``: what each arm of each method spent per cell,
    from a record's ``budget:*`` rows (:func:`mpifl.analysis.record.render_budget`)."""
    from mpifl.analysis.record import render_budget

    path, opts, methods = _options("budget", arg, ("x", "y", "method"), "x=KEY", lambda o: o.get("x"))
    return render_budget(path, root, methods=methods, **opts).rstrip("\n")


def settings_table(root: Path, arg: str) -> str:
    """``FILE[,FILE] [keys=K,K] [method=A,B]``: each method's resolved settings (:mod:`mpifl.docs.settings`)."""
    from mpifl.docs import settings

    path, opts, methods = _options("settings", arg, ("keys", "method"), "a record FILE", lambda o: True)
    return settings.render(root, path, [k for k in opts.get("keys", "").split(",") if k], methods)


ARG_BLOCKS: dict[str, Callable[[Path, str], str]] = {"record": record_table, "versus": versus_table,
                                                     "means": means_table, "rounds": rounds_table,
                                                     "settings": settings_table,
                                                     "course": course_table, "best": best_table,
                                                     "budget": budget_table, "verdicts": verdicts_table}


def render(text: str, root: Path = ROOT) -> str:
    """``text`` with every generated block rendered afresh (unknown names: an error)."""

    def fill(m: re.Match) -> str:
        name, arg = m.group(2), m.group(3)
        known = ARG_BLOCKS if arg else BLOCKS
        if name not in known:
            raise KeyError(f"no generator for block {name!r}{' with an argument' if arg else ''}; "
                           f"known: {', '.join(known)}")
        made = ARG_BLOCKS[name](root, arg) if arg else BLOCKS[name](root)
        return m.group(1) + made + "\n" + m.group(5)

    return BLOCK.sub(fill, text)


def rendered(path: Path) -> bool:
    """Whether ``--write`` renders the generated blocks of ``path`` (one of FILES)."""
    return path.is_relative_to(ROOT) and str(path.relative_to(ROOT)) in FILES


def stale(root: Path = ROOT) -> list[str]:
    """``FILE:NAME`` of every block whose text differs from what it renders to."""
    out = []
    for f in FILES:
        text = (root / f).read_text()
        fresh = {m.group(1): m.group(4) for m in BLOCK.finditer(render(text, root))}
        out += [f"{f}:{m.group(2)}" + (f" {m.group(3)}" if m.group(3) else "")
                for m in BLOCK.finditer(text) if fresh[m.group(1)] != m.group(4)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mpifl.docs", description="Check or refresh the generated blocks "
                                 "of " + ", ".join(FILES) + " (<!-- generated:NAME --> ... <!-- /generated -->).")
    ap.add_argument("--write", action="store_true", help="refresh the blocks in place")
    ap.add_argument("--check", action="store_true", help="exit 1 if any block is stale (the default)")
    ap.add_argument("--typed", action="store_true", help="list the reproduction pages' tables that no record "
                    "stands behind, with the reason each gives (<!-- typed: WHY -->)")
    args = ap.parse_args(argv)
    from mpifl.docs import counts as doccounts
    from mpifl.docs import typed
    from mpifl.docs.sync import documents

    if args.typed:
        found = typed.typed()
        for t in found:
            print(f"{t.page}:{t.line} ({t.heading}): {t.why or 'UNDECLARED'}")
        print(f"mpifl.docs: {len(found)} typed table(s) on the reproduction pages, "
              f"{sum(t.why is None for t in found)} undeclared")
        return 0

    if args.write:
        for path in documents():
            text = path.read_text()
            new = doccounts.fill(render(text) if rendered(path) else text, tests=True)
            if new != text:
                path.write_text(new)
                print(f"mpifl.docs: refreshed {path.relative_to(ROOT)}")
        return 0
    bad = stale()
    if bad:
        print(f"mpifl.docs: stale generated blocks: {', '.join(bad)}; run python -m mpifl.docs --write",
              file=sys.stderr)
    from mpifl.docs import settings

    drift = doccounts.problems(tests=True) + typed.undeclared() + settings.problems()
    for line in drift:
        print(f"mpifl.docs: {line}", file=sys.stderr)
    return 1 if bad or drift else 0


