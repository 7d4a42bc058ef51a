"""The docs' counts and quoted results are checked against their sources
(mpifl/docs/counts.py, part of python -m mpifl.docs --check): each kind of drift
(a stale test, config or run count, a quote of another page that no longer holds,
a README example ruff rejects) fails the check, and the docs as they are pass it."""

from __future__ import annotations

import pytest

from mpifl.docs import counts as doccounts

TRANSCRIPT = """
    $ srun -n 2 --mpi=pmi2 .venv/bin/python -m mpi4py -m mpifl.check jobs/quickstart.yaml
    mpifl.check: jobs/quickstart.yaml
{lines}
    mpifl.check: ok, no problems
"""
DOC = doccounts.REPO / "docs" / "page.md"  # a page among the docs (not on disk)
CHECK = {k: f"      {k:<10} something" for k in doccounts.CHECK_LINES}


@pytest.mark.parametrize("page, complaint", [
    ("    sweep quickstart-algorithms: 9 configs under .../runs; script ...",
     "sweep quickstart-algorithms: 9 configs, but jobs/sweeps/quickstart-algorithms.yaml has 42 points"),
    ("    sweep pfedlia-table1: 72 configs under .../runs",
     "sweep pfedlia-table1: 72 configs, but jobs/tables/pfedlia-table1.sweep.yaml has 80 points"),
    ("so that the 285<!-- points: jobs/tables/pfedlia-table1.sweep.yaml jobs/tables/dpfl-table1.sweep.yaml "
     "jobs/tables/fedc2i-table1.sweep.yaml jobs/tables/federico-table1.sweep.yaml --> runs queued",
     "285 points of jobs/tables/pfedlia-table1.sweep.yaml"),
    ("Local <!-- quote: docs/sweeps.md quickstart-baselines-table local final_acc_pct -->73.46 ± 0.51<!-- /quote -->",
     "quotes '73.46 ± 0.51' from docs/sweeps.md (quickstart-baselines-table, local, final_acc_pct), which holds "
     "'74.42 ± 2.55' there"),
    (TRANSCRIPT.format(lines="\n".join(v for k, v in CHECK.items() if k != "layout")),
     "an mpifl.check transcript lacks its layout line(s)"),
])
def test_each_drift_of_the_issue_fails_the_check(page, complaint):
    found = doccounts.problems(pages={DOC: page})
    assert len(found) == 1 and found[0].startswith(f"docs/page.md: {complaint}"), found


def test_a_full_check_transcript_passes_and_one_cut_with_dots_is_not_judged():
    whole = TRANSCRIPT.format(lines="\n".join(CHECK.values()))
    cut = TRANSCRIPT.format(lines="      launch     x\n      ...")
    assert doccounts.problems(pages={DOC: whole}) == doccounts.problems(pages={DOC: cut}) == []


def test_the_docs_counts_and_quotes_hold():
    assert doccounts.problems() == []


def test_write_fills_a_quote_from_its_page():
    stale = "<!-- quote: docs/sweeps.md quickstart-baselines-table oracle final_acc_pct -->77.60<!-- /quote -->"
    assert doccounts.fill(stale) == stale.replace("77.60", doccounts.quoted("docs/sweeps.md",
                                                                            "quickstart-baselines-table", "oracle",
                                                                            "final_acc_pct"))


@pytest.mark.slow  # starts pytest --collect-only and ruff
def test_the_test_count_and_the_readmes_python_blocks_hold():
    assert doccounts.problems(tests=True) == []
    bad = "```python\nfrom dataclasses import dataclass\nimport math\n```\n"
    found = doccounts.readme_ruff(bad)
    assert len(found) == 1 and "I001" in found[0], found
