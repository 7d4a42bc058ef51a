"""The documentation a new user copies from: one launch form for several ranks."""

from __future__ import annotations

import re
from pathlib import Path

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


def table_rows(text: str, heading: str) -> dict[str, dict[str, str]]:
    """The first Markdown table after ``heading`` in ``text``: first cell -> its cells."""
    lines = text[text.index(heading):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    table = lines[start:start + next(i for i, line in enumerate(lines[start:]) if not line.startswith("|"))]
    head = [c.strip() for c in table[0].strip("|").split("|")]
    rows = {}
    for line in table[2:]:
        # a cell may hold escaped pipes (a norm, \|\|w\|\|): split on the others only
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        rows[cells[0].strip("`")] = dict(zip(head, cells))
    return rows


# the seed algorithms: each is shown on a job file of its own in the README
SEED_ALGORITHMS = {"local", "fedavg", "fedavg_ft", "oracle", "federico", "dpfl", "fedc2i", "pfedlia"}


def test_generated_blocks_are_current():
    from mpifl.docs import blocks as docs

    assert docs.stale() == [], "run python -m mpifl.docs --write"
    text = (REPO / "README.md").read_text()
    assert {m.group(2) for m in docs.BLOCK.finditer(text)} == set(docs.BLOCKS)
    # a block left behind by its text is found, and --write would mend it
    old = text.replace("| `fedavg` |", "| `fedavg_old` |", 1)
    assert docs.render(old) == text != old
    # --write refreshes every page whose blocks --check judges, the reproduction pages' records included
    assert all(docs.rendered(REPO / f) for f in docs.FILES) and "docs/reproductions/fedc2i.md" in docs.FILES
    assert not docs.rendered(REPO / "docs" / "analysis.md")


def test_every_algorithm_has_a_row_and_every_job_file_a_result():
    import yaml

    from mpifl import algorithms, config

    text = (REPO / "README.md").read_text()
    rows = table_rows(text, "<!-- generated:algorithms -->")
    assert list(rows) == list(algorithms.NAMES)
    assert {n for n, row in rows.items() if row["job file"] != "–"} >= SEED_ALGORITHMS
    sweep = yaml.safe_load((REPO / "jobs" / "sweeps" / "quickstart-algorithms.yaml").read_text())
    swept = {(REPO / "jobs" / "sweeps" / b).resolve() for b in sweep["grid"]["base"]}
    results = table_rows(text, "| job file | algorithm | final test acc % |")
    for name, row in rows.items():
        if row["job file"] == "–":
            continue
        job = re.fullmatch(r"`(jobs/[\w.-]+\.yaml)`(?: \(`algorithm\.name=(\w+)`\))?", row["job file"])
        assert job, f"{name}: job file cell {row['job file']!r}"
        cfg = config.load(REPO / job.group(1), [f"algorithm.name={job.group(2)}"] if job.group(2) else [])
        assert cfg.algorithm.name == name
        assert (REPO / job.group(1)).resolve() in swept, f"{name}: {job.group(1)} is not in the sweep"
        if job.group(2) is None:  # the job's own algorithm: its accuracy and Local's on that job
            result = results[f"jobs/{Path(job.group(1)).name}"]
            assert result["algorithm"] == f"`{name}`"
            assert all(re.search(r"\d", result[k]) for k in ("final test acc %", "Local on the same job")), name


def test_every_test_the_reliability_page_cites_exists():
    """docs/reliability.md backs each guarantee with a test by name: a renamed or
    deleted test must not leave a guarantee pointing at nothing."""
    import ast

    cited = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", (REPO / "docs/reliability.md").read_text())
    assert len(cited) > 20
    for path, name in cited:
        tree = ast.parse((REPO / path).read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert name in names, f"docs/reliability.md cites {path}::{name}, which does not exist"
