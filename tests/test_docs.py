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
