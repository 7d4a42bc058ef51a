"""The documentation a new user copies from: one launch form for several ranks."""

from __future__ import annotations

import re

from helpers import REPO

# `python -m mpi4py` turns an uncaught error on one rank into an abort of all ranks;
# without it the other ranks wait forever in their next collective
PLAIN_LAUNCH = re.compile(r"\b(?:mpiexec|mpirun|srun)\b[^\n`]*?python3?\s+-m\s+mpifl\.main")


def documents() -> list:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "jobs").rglob("*.md")),
            *sorted((REPO / "jobs").rglob("*.yaml")), *sorted((REPO / "mpifl").rglob("*.py"))]


def test_every_multi_rank_launch_goes_through_mpi4py():
    bad = [f"{p.relative_to(REPO)}:{text[:m.start()].count(chr(10)) + 1}: {m.group(0)}"
           for p in documents() for text in [p.read_text()] for m in PLAIN_LAUNCH.finditer(text)]
    assert len(documents()) > 20
    assert not bad, "launch with `mpiexec -n R python -m mpi4py -m mpifl.main`:\n" + "\n".join(bad)


def algorithm_rows() -> dict[str, list[str]]:
    """The README's algorithm table: name -> its cells."""
    text = (REPO / "README.md").read_text()
    table = text[text.index("### Algorithms"):].split("\n\n")[1].splitlines()
    head = [c.strip() for c in table[0].strip("|").split("|")]
    rows = {}
    for line in table[2:]:
        # a cell may hold escaped pipes (a norm, \|\|w\|\|): split on the others only
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        rows[cells[0].strip("`")] = dict(zip(head, cells))
    return rows


ISSUE_21 = {"local", "fedavg", "fedavg_ft", "oracle", "federico", "dpfl", "fedc2i", "pfedlia"}


def test_every_algorithm_has_a_row_with_a_job_file_that_the_quickstart_sweep_runs():
    import yaml

    from mpifl import algorithms, config

    rows = algorithm_rows()
    assert set(rows) == set(algorithms.NAMES)
    # the algorithms of issue 21 must have theirs; one added since may say "–" until its owner picks one
    assert {n for n, row in rows.items() if row["job file"] != "–"} >= ISSUE_21
    rows = {n: row for n, row in rows.items() if row["job file"] != "–"}
    sweep = yaml.safe_load((REPO / "jobs" / "sweeps" / "quickstart-algorithms.yaml").read_text())
    swept = {(REPO / "jobs" / "sweeps" / b).resolve() for b in sweep["grid"]["base"]}
    for name, row in rows.items():
        job = re.fullmatch(r"`(jobs/[\w.-]+\.yaml)`(?: \(`algorithm\.name=(\w+)`\))?", row["job file"])
        assert job, f"{name}: job file cell {row['job file']!r}"
        cfg = config.load(REPO / job.group(1), [f"algorithm.name={job.group(2)}"] if job.group(2) else [])
        assert cfg.algorithm.name == name
        assert (REPO / job.group(1)).resolve() in swept, f"{name}: {job.group(1)} is not in the sweep"
        assert re.search(r"\d", row["final test acc %"]), f"{name}: no expected accuracy"
