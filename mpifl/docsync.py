"""Numbers and figures the docs quote from mpifl's own output, made again:
``python -m mpifl.docs.sync [--check] [--only NAME ...] [--keep DIR]``.

A quoted block in a Markdown file sits between two markers::

    <!-- docsync NAME -->
    ...
    <!-- /docsync NAME -->

and a quoted figure is a file under ``docs/figures/``. Each target below runs the
commands that make its output (on the CPU, one thread per rank, so the numbers do
not depend on the machine's cores or GPU) and renders its blocks and figures.
Without ``--check`` they are written into the docs; with it nothing is written,
and every block or figure that differs is named, exit status 1 (console timings
are masked; figures are compared pixel by pixel). ``--only`` picks targets.

Targets (time on 2 quiet cores):

- ``quickstart``: the README's quickstart console lines (one run, ~20 s);
- ``quickstart-baselines``: ``jobs/sweeps/quickstart-baselines.yaml`` run with
  ``--local``, its ``--status`` and its analysis: docs/sweeps.md's table, status
  lines and three figures, the README's quickstart results (9 runs, ~3 min).

Results of hours-long sweeps (docs/reproductions/, the README's algorithm table)
are records: each page names the commands that made them, and they are not
made again here.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CPU = ["run.device=cpu", "run.threads=1"]  # numbers that do not depend on the machine
MARKER = re.compile(r"<!-- docsync (?P<name>[\w.-]+) -->\n(?P<body>.*?)<!-- /docsync (?P=name) -->", re.S)
TIMING = re.compile(r"\d+(?:\.\d+)?(?:s/round|s\b|min\b)")


@dataclass
class Output:
    blocks: dict[str, str] = field(default_factory=dict)  # marker name -> text between the markers
    figures: dict[str, Path] = field(default_factory=dict)  # repository path -> the file made now


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


def _run(cmd: list[str], what: str) -> str:
    res = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, check=False)
    if res.returncode != 0:
        tail = "\n".join((res.stdout + res.stderr).splitlines()[-15:])
        raise RuntimeError(f"{what} failed (exit {res.returncode}): {' '.join(cmd)}\n{tail}")
    return res.stdout


def _mpi(n: int, *args: str) -> list[str]:
    from mpifl.sweep.cli import _mpiexec

    launcher = _mpiexec()
    if launcher is None:
        raise RuntimeError("mpiexec not found next to this python or on PATH")
    return [launcher, "-n", str(n), sys.executable, "-m", "mpi4py", *args]


def _code(lines: list[str]) -> str:
    """An indented Markdown code block between two markers."""
    return "\n" + "".join(f"    {x}\n" for x in lines) + "\n"


def quickstart(work: Path) -> Output:
    """The README's console lines of ``mpiexec -n 2 ... mpifl.main jobs/quickstart.yaml``."""
    # run.resume=never: with --keep a second call starts the run over instead of finding it done
    out = _run(_mpi(2, "-m", "mpifl.main", "jobs/quickstart.yaml", f"run.out_dir={work}", *CPU, "run.resume=never"),
               "the quickstart")
    lines = [x.replace(str(work), "results") for x in out.splitlines() if x.strip()]
    rounds = [x for x in lines if x.startswith("round ")]
    head = [x for x in lines if x.startswith("mpifl ")]
    done = [x for x in lines if x.startswith("done: ")]
    if not (head and len(rounds) >= 2 and done):
        raise RuntimeError("the quickstart printed no header, rounds and closing line:\n" + out)
    return Output({"quickstart-console": _code([head[0], *rounds[:2], "...", done[-1]])})


def quickstart_baselines(work: Path) -> Output:
    """jobs/sweeps/quickstart-baselines.yaml with --local, then analyzed."""
    from mpifl.analyze import analyze

    # the file sets run.device=cpu and run.threads=1 itself: the docs quote its plain command
    _run([sys.executable, "-m", "mpifl.sweep.cli", "jobs/sweeps/quickstart-baselines.yaml", "--local",
          "--out-dir", str(work)], "the quickstart-baselines sweep")
    status = _run([sys.executable, "-m", "mpifl.sweep.cli", "jobs/sweeps/quickstart-baselines.yaml", "--status",
                   "--out-dir", str(work)], "--status").splitlines()
    res = analyze([work / "quickstart-baselines"], work / "analysis", heatmaps="first", echo=lambda *a, **k: None)
    table = (work / "analysis" / "table.md").read_text().rstrip("\n").splitlines()
    oracle = next(r for r in sorted(res["runs"], key=lambda r: r.seed) if r.config["algorithm.name"] == "oracle")
    out = Output(
        blocks={"quickstart-baselines-table": "\n" + "\n".join(table) + "\n\n",
                "quickstart-seeds": "\n" + seeds_table(res["runs"]) + "\n\n",
                "quickstart-baselines-status": _code([*status[:3], "...", status[-1]])},
        figures={"docs/figures/quickstart-accuracy.png": work / "analysis" / "accuracy.png",
                 "docs/figures/quickstart-variance.png": work / "analysis" / "variance.png",
                 "docs/figures/quickstart-oracle-mixing.png":
                     work / "analysis" / "heatmaps" / oracle.name / "graph_mixing.png"})
    return out


def seeds_table(runs: list) -> str:
    """Final test accuracy (%) per algorithm and seed, and the mean, as the README shows it."""
    by: dict[str, dict[int, float]] = {}
    for r in runs:
        by.setdefault(str(r.config["algorithm.name"]), {})[r.seed] = 100.0 * r.final_acc
    seeds = sorted({s for v in by.values() for s in v})
    lines = ["| algorithm | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |",
             "|---|" + "---|" * (len(seeds) + 1)]
    for algo in sorted(by, key=lambda a: -sum(by[a].values()) / len(by[a])):
        vals = [by[algo].get(s, float("nan")) for s in seeds]
        lines.append(f"| {algo} | " + " | ".join(f"{v:.2f}" for v in vals)
                     + f" | **{sum(vals) / len(vals):.2f}** |")
    return "\n".join(lines)


TARGETS: dict[str, Callable[[Path], Output]] = {"quickstart": quickstart, "quickstart-baselines": quickstart_baselines}
BLOCKS = {  # the marked blocks each target makes
    "quickstart": ["quickstart-console"],
    "quickstart-baselines": ["quickstart-baselines-table", "quickstart-seeds", "quickstart-baselines-status"],
}


# --------------------------------------------------------------------------- the docs


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def blocks_in_docs() -> dict[str, tuple[Path, str]]:
    """Every marked block: name -> (file, text between the markers)."""
    out: dict[str, tuple[Path, str]] = {}
    for path in documents():
        for m in MARKER.finditer(path.read_text()):
            if m["name"] in out:
                raise ValueError(f"docsync block {m['name']!r} is in {out[m['name']][0]} and {path}")
            out[m["name"]] = (path, m["body"])
    return out


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def masked(text: str) -> str:
    """Console text without its timings, which differ from run to run."""
    return TIMING.sub("#s", text)


def _same_image(a: Path, b: Path) -> bool:
    import matplotlib.image as mpimg
    import numpy as np

    x, y = mpimg.imread(a), mpimg.imread(b)
    return x.shape == y.shape and bool(np.array_equal(x, y))


def compare(made: Output, docs: dict[str, tuple[Path, str]]) -> list[str]:
    """What differs between the output made now and the docs, one line each."""
    bad = []
    for name, text in made.blocks.items():
        if name not in docs:
            bad.append(f"block {name}: no <!-- docsync {name} --> markers in README.md or docs/")
        elif masked(docs[name][1]) != masked(text):
            old = [x for x in masked(docs[name][1]).splitlines() if x not in masked(text).splitlines()]
            bad.append(f"block {name} in {_rel(docs[name][0])} differs; first stale line: "
                       f"{old[0].strip() if old else '(lines missing)'}")
    for rel, new in made.figures.items():
        if not (REPO / rel).is_file():
            bad.append(f"figure {rel}: missing")
        elif not _same_image(REPO / rel, new):
            bad.append(f"figure {rel} differs from the one made now")
    return bad


def write(made: Output, docs: dict[str, tuple[Path, str]]) -> list[str]:
    """Put the output made now into the docs; returns what changed."""
    changed = []
    for name, text in made.blocks.items():
        if name not in docs:
            raise ValueError(f"block {name}: no <!-- docsync {name} --> markers in README.md or docs/")
        path, old = docs[name]
        if masked(old) == masked(text):
            continue  # only timings differ: keep the recorded ones
        doc = path.read_text()
        start = doc.index(f"<!-- docsync {name} -->\n") + len(f"<!-- docsync {name} -->\n")
        end = doc.index(f"<!-- /docsync {name} -->")
        path.write_text(doc[:start] + text + doc[end:])
        changed.append(f"{_rel(path)}: {name}")
    for rel, new in made.figures.items():
        if not (REPO / rel).is_file() or not _same_image(REPO / rel, new):
            shutil.copyfile(new, REPO / rel)
            changed.append(rel)
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mpifl.docs.sync", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each block or figure "
                                                         "that differs from the output made now")
    ap.add_argument("--only", nargs="+", choices=sorted(TARGETS), help="these targets (default: all)")
    ap.add_argument("--keep", type=Path, help="make the runs under this folder and keep them (default: a "
                                              "temporary folder, removed)")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    docs = blocks_in_docs()
    work = a.keep or Path(tempfile.mkdtemp(prefix="mpifl-docsync-"))
    bad = []
    try:
        for name in a.only or list(TARGETS):
            print(f"docsync: {name} ...", flush=True)
            made = TARGETS[name](work / name)
            if a.check:
                bad += compare(made, docs)
            else:
                for line in write(made, docs):
                    print(f"docsync: wrote {line}")
    finally:
        if a.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    for line in bad:
        print(f"docsync: {line}", file=sys.stderr)
    if a.check:
        print("docsync: the docs quote what the programs print" if not bad else
              f"docsync: {len(bad)} difference(s); `python -m mpifl.docs.sync` writes the output made now",
              file=sys.stderr if bad else sys.stdout)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
