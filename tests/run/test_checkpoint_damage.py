"""A damaged checkpoint or log is never silently discarded: a bit flip, a missing
or truncated file, a dangling ``latest``, a lost ``run.h5`` stop the resume in one
line naming the damage and the ways forward, and change nothing; the ways
forward work (``run.resume=previous`` bitwise, ``run.resume=never`` keeping the
user's files). A symlinked ``checkpoint/`` is refused before anything there is
deleted.

Bits: ``run.resume=previous`` is compared bit for bit with an uninterrupted run: two
launches on one machine with the same ranks, settings and one thread per rank
(``run.threads=1``), so it holds on whichever CPU runs both, AVX2 or AVX-512."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers import assert_same_logs, launch

from mpifl.logging.h5 import open_run

pytestmark = pytest.mark.slow  # every test launches mpifl

BASE = ["data.name=synthetic", "data.n_samples=480", "data.n_clients=8", "data.n_clusters=2", "model.hidden=[16]",
        "run.rounds=6", "run.checkpoint_every=2", "run.threads=1", "algorithm.fraction=0.5", "algorithm.name=fedavg"]
TINY = ["data.name=synthetic", "data.n_samples=240", "data.n_clients=4", "data.n_clusters=2", "model.hidden=[8]",
        "run.rounds=4", "run.checkpoint_every=2", "run.threads=1", "run.name=r"]


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes; but ``run.lock``, which a killed job
    leaves and the next job takes over and removes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "run.lock"}


def _one_error_line(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mpifl: error: "), res.stderr
    return lines[0]


def _flip(path: Path) -> None:
    """Flip one bit in the middle of ``path`` (in a tensor's bytes: they are most of a part)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_bit_flip_in_a_part_stops_the_resume_and_previous_resumes_bitwise(tmp_path):
    args = [*BASE, f"run.out_dir={tmp_path}"]
    ref = launch([*args, "run.name=ref"], n=2)
    assert ref.returncode == 0, ref.stderr
    assert launch([*args, "run.name=cut"], n=2, env={"MPIFL_FAULT": "1:5:kill"}).returncode != 0  # at round 6
    d = tmp_path / "cut"
    ck = d / "checkpoint"
    assert sorted(p.name for p in ck.iterdir()) == ["latest", "round-000001", "round-000003"]  # the last two
    _flip(ck / "round-000003" / "part-0001.pt")
    before = _tree(d)
    line = _one_error_line(launch([*args, "run.name=cut"], n=2))
    assert "round-000003" in line and "part-0001.pt" in line and "sha256" in line
    assert "run.resume=previous" in line and "(round-000001)" in line and "run.resume=never" in line
    assert _tree(d) == before  # nothing deleted, nothing rewritten
    resumed = launch([*args, "run.name=cut", "run.resume=previous"], n=2)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed after round 2" in resumed.stdout
    assert_same_logs(open_run(tmp_path / "ref"), open_run(d))
    assert sorted(p.name for p in ck.iterdir()) == ["latest", "round-000005"]  # finished: its final one


def _damage(ck: Path, how: str) -> str:
    """Damage the latest checkpoint (round-000003) of a finished 4-round run; the
    fragment the error must name."""
    last = ck / "round-000003"
    if how == "latest dangles":
        (ck / "latest").write_text("round-000009")
        return "latest names round-000009, which is missing"
    if how == "meta missing":
        (last / "meta.pt").unlink()
        return "meta.pt is missing"
    if how == "manifest missing":
        (last / "manifest.json").unlink()
        return "has no manifest.json"
    if how == "part missing":
        (last / "part-0001.pt").unlink()
        return "part-0001.pt is missing"
    if how == "part truncated":
        data = (last / "part-0000.pt").read_bytes()
        (last / "part-0000.pt").write_bytes(data[: len(data) // 2])
        return "part-0000.pt is not the size it was written with"
    if how == "meta flipped":
        _flip(last / "meta.pt")
        return "meta.pt does not match the sha256"
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["latest dangles", "meta missing", "manifest missing", "part missing",
                                 "part truncated", "meta flipped"])
def test_a_damaged_checkpoint_stops_in_one_line_and_never_resumes_silently(tmp_path, how):
    """One rank, but two for a missing part: rank 1 finds it, every rank exits 2."""
    n = 2 if how == "part missing" else 0
    args = [*TINY, f"run.out_dir={tmp_path}"]
    assert launch(args, n=n).returncode == 0
    d = tmp_path / "r"
    (d / "notes.txt").write_text("mine")
    (d / "checkpoint" / "keep.txt").write_text("not mpifl's")
    needle = _damage(d / "checkpoint", how)
    before = _tree(d)
    line = _one_error_line(launch([*args, "run.rounds=6"], n=n))
    assert needle in line and "run.resume=never" in line, line
    # a finished run keeps its final checkpoint alone: only a dangling latest leaves one to fall back on
    assert ("run.resume=previous" in line) == (how == "latest dangles"), line
    assert _tree(d) == before
    fresh = launch([*args, "run.rounds=6", "run.resume=never"], n=n)  # the way forward that always works
    assert fresh.returncode == 0, fresh.stderr
    assert "resumed" not in fresh.stdout and open_run(d).n_rounds == 6
    assert (d / "notes.txt").read_text() == "mine" and (d / "checkpoint" / "keep.txt").read_text() == "not mpifl's"


@pytest.mark.parametrize("how", ["deleted", "truncated"])
def test_a_resume_without_its_log_stops_in_one_line_and_writes_nothing(tmp_path, how):
    args = [*TINY, f"run.out_dir={tmp_path}"]
    assert launch(args, n=0).returncode == 0
    d = tmp_path / "r"
    log = d / "run.h5"
    if how == "deleted":
        log.unlink()
    else:
        log.write_bytes(log.read_bytes()[: log.stat().st_size // 2])
    before = _tree(d)
    line = _one_error_line(launch([*args, "run.rounds=6"], n=0))
    assert "run.h5" in line and ("is missing" if how == "deleted" else "is unreadable") in line
    assert "cannot be rebuilt" in line and "run.resume=never" in line and "Traceback" not in line
    assert _tree(d) == before  # config.yaml not rewritten, no journal, no new log
    fresh = launch([*args, "run.rounds=6", "run.resume=never"], n=0)
    assert fresh.returncode == 0, fresh.stderr
    assert open_run(d).n_rounds == 6


def test_a_symlinked_checkpoint_folder_is_refused_and_another_runs_checkpoint_survives(tmp_path):
    scratch = tmp_path / "scratch"  # a shared folder where another run keeps its checkpoints
    (scratch / "round-000010").mkdir(parents=True)
    (scratch / "round-000010" / "meta.pt").write_bytes(b"another run's")
    (scratch / "latest").write_text("round-000010")
    d = tmp_path / "r"
    d.mkdir()
    (d / "checkpoint").symlink_to(scratch)
    theirs = _tree(scratch)
    for resume in ("auto", "never"):
        line = _one_error_line(launch([*TINY, f"run.out_dir={tmp_path}", f"run.resume={resume}"], n=0))
        assert "is a symbolic link" in line and "run.out_dir" in line
        assert _tree(scratch) == theirs
    assert sorted(p.name for p in d.iterdir()) == ["checkpoint"]


def test_a_finished_run_started_again_changes_nothing(tmp_path):
    args = [*TINY, f"run.out_dir={tmp_path}"]
    assert launch(args, n=0).returncode == 0
    d = tmp_path / "r"
    before = _tree(d)
    again = launch(args, n=0)
    assert again.returncode == 0, again.stderr
    assert "already finished all 4 rounds" in again.stdout
    assert _tree(d) == before
