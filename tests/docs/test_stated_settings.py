"""A reproduction page's settings come from its records: a run's setting is its
record's config over the defaults of the commit that ran it (``<!-- generated:settings
FILE -->``), and ``python -m mpifl.docs --check`` names a setting the prose states
that no run of the section's records used."""

from __future__ import annotations

import subprocess

import pytest

from mpifl.analysis import record
from mpifl.docs import blocks as docs
from mpifl.docs import settings
from mpifl.paths import REPO

THEN = "c" * 40  # a commit whose dpfl.py had another tau_train default


def _rows(commit: str | None) -> list[record.Row]:
    prov = {"mpifl": {"commit": commit, "dirty": False}} if commit else {}
    return [record.Row("table", "", m, "data.n_clients=8", s, "final_acc", 50.0 + s,
                       {"algorithm.name": m, "run.rounds": 150}, prov)
            for m in ("local", "dpfl") for s in (0, 1)]


@pytest.fixture
def root(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    record.write(tmp_path / "data" / "r.csv", _rows(THEN))
    record.write(tmp_path / "data" / "u.csv", _rows(None))

    # THEN's layout: the core sections and dpfl's Params in the files they were first written in
    moved = {"mpifl/config/sections.py": "mpifl/schema.py",
             "mpifl/algorithms/dpfl.py": "mpifl/algorithms/dpfl_params.py"}

    def show(commit: str, path: str) -> str | None:
        if commit != THEN or path in moved.values():
            return None
        text = (REPO / moved.get(path, path)).read_text()
        return text.replace("tau_train: int = 5", "tau_train: int = 7") if path.endswith("dpfl.py") else text

    monkeypatch.setattr(settings, "_show", show)
    settings.changed_since.cache_clear()
    yield tmp_path
    settings.changed_since.cache_clear()


def test_a_run_takes_the_defaults_of_its_own_commit_and_the_block_says_which_changed(root):
    page = "<!-- generated:settings data/r.csv keys=run.rounds,train.local_epochs -->\n<!-- /generated -->\n"
    fresh = docs.render(page, root)
    dpfl = next(line for line in fresh.splitlines() if line.startswith("| dpfl |"))
    assert "`dpfl.tau_train` 7" in dpfl and "`dpfl.tau_init` 10" in dpfl and "`run.rounds` 150" in dpfl
    assert "`train.local_epochs` 1" in dpfl and "| 2 | ccccccc |" in dpfl
    local = next(line for line in fresh.splitlines() if line.startswith("| local |"))
    assert "dpfl." not in local  # a section Local never reads
    assert "defaults changed since: `dpfl.tau_train` 7 then, 5 now" in fresh
    assert docs.render(fresh, root) == fresh


def test_an_unknown_commit_is_resolved_with_this_checkouts_defaults_and_says_so(root):
    fresh = docs.render("<!-- generated:settings data/u.csv -->\n<!-- /generated -->\n", root)
    assert "`dpfl.tau_train` 5" in fresh and "| unknown |" in fresh
    assert "resolved with this checkout's defaults" in fresh


def _page(root, prose: str) -> list[str]:
    (root / "docs" / "reproductions").mkdir(parents=True, exist_ok=True)
    (root / "docs" / "reproductions" / "p.md").write_text(
        "# P\n\n## Room\n\n" + prose + "\n\n<!-- generated:settings data/r.csv -->\n<!-- /generated -->\n\n"
        "## Elsewhere\n\nThe paper runs tau_train 9 and 100 rounds.\n")
    return settings.problems(root)


@pytest.mark.parametrize("prose, wrong", [
    ("DPFL ran with tau_init 2, tau_train 1, batch 32, 150 rounds.", {"dpfl.tau_init 2", "dpfl.tau_train 1"}),
    ("DPFL ran `dpfl.tau_train=1` over 150 rounds of 1 local epoch.", {"dpfl.tau_train 1"}),
    ("DPFL ran tau_init 10 and tau_train 7 over 150 rounds.", set()),
    ("Over the last 20 rounds Local moves little; `run.seed=S` reruns one.", set()),
    ("<!-- typed: the table's plan, not what ran -->\nThe plan was tau_train 1.", set()),
    ("Local ran 60 rounds.", {"run.rounds 60"}),
    ("Trained with Adam 1e-2, then lr 0.05 (SGD 5e-2).", {"train.lr 1e-2"}),
])
def test_a_stated_setting_no_run_used_is_named(root, prose, wrong):
    found = _page(root, prose)
    assert {" ".join(p.split("states ", 1)[1].split(";")[0].split()) for p in found} == wrong
    # only the section that renders a record is read; the line is the page's
    assert all(p.startswith("docs/reproductions/p.md:5:") or p.startswith("docs/reproductions/p.md:6:")
               for p in found)


def test_the_room_runs_of_dpfl_resolve_to_the_defaults_at_their_commit():
    """The record's DPFL runs set no tau: at their commit dpfl.py said 10 and 5."""
    commit = "89ff23c3af6cf61b334521c95a2352c6defce973"
    have = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO, capture_output=True,
                          check=False).returncode == 0
    if not have:
        pytest.skip(f"commit {commit[:7]} is not in this clone")
    settings.changed_since.cache_clear()
    got = settings.runs_of("docs/reproductions/data/room-dpfl.csv")
    assert {(c["dpfl.tau_init"], c["dpfl.tau_train"], c["train.local_epochs"]) for c in got.methods["dpfl"]} \
        == {(10, 5, 1)}
    assert got.commits["dpfl"] == {commit}
