"""The disk fills up under a real run (a small tmpfs as run.out_dir, two ranks):
the run stops on every rank with exit 74 and one line, run.h5 opens with every
round committed before the failure, no temporary file stays, and once space is
freed the same command finishes a log bitwise equal to an uninterrupted run's.

Mounting a tmpfs needs root; where it cannot be mounted the tests are skipped,
saying why. tests/test_storage.py covers the same without a mount (a fake disk).

Bits: the finished log is compared bit for bit with an uninterrupted run's: two-rank
launches on one machine with the same settings and one thread per rank
(``run.threads=1``), so it holds on whichever CPU runs both."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import launch

from mpifl.logging import pending
from mpifl.logging.h5 import open_run
from mpifl.logging.journal import journal_path, read_journal

pytestmark = pytest.mark.slow  # every test launches mpiexec

# 200 short rounds, a checkpoint every 50: the log grows by whole chunks every 64
# rounds (after a checkpoint, between two) and a checkpoint is 3 small files
ARGS = ["data.name=synthetic", "data.n_samples=480", "data.n_clients=8", "data.n_clusters=2", "model.hidden=[4]",
        "run.rounds=200", "run.checkpoint_every=50", "run.threads=1", "run.name=x"]
TIMING = {"rounds/wall_s", "rounds/comm_s", "rounds/compute_s"}
DISK_KIB = 1024
# free space at the start, as fractions of what the uninterrupted run leaves on
# disk: the config, the new log, its first rounds, the first checkpoint's parts
# and meta, the log growing after a checkpoint, later checkpoints
FILL = (0.0, 0.1, 0.42, 0.55, 0.62, 0.66, 0.72, 0.86, 0.95, 1.04)
# with log.flush_s = 1 the ten points fall on seven outcomes (the refused write, the rounds
# logged, the checkpoint kept; 0.42 = 0.55 and 0.72 = 0.86 = 0.95, seen 2026-11-27):
# one point of each, as every launch pair costs ~20 CPU-s
FILL_BY_FLUSH = {"0": FILL, "1": (0.0, 0.1, 0.42, 0.62, 0.66, 0.72, 1.04)}
LINE = re.compile(r"mpifl: error: cannot write the (log|config|run lock|checkpoint \w+) '([^']+)' "
                  r"\(No space left on device\); (.+); free space and rerun the same command(?: to resume after "
                  r"round (\d+) \(its last checkpoint\)|: it starts the run over, as no checkpoint was written yet "
                  r"\(the first comes after round 50\))")


@pytest.fixture
def small_disk(tmp_path):
    """A DISK_KIB tmpfs mounted under tmp_path (unmounted after the test)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where = tmp_path / "disk"
    where.mkdir()
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_KIB}k", "tmpfs", str(where)],
                         capture_output=True, text=True, check=False)
    if got.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {got.stderr.strip()}")
    try:
        yield where
    finally:
        for _ in range(20):  # the launcher's processes may still hold it for a moment
            if subprocess.run(["umount", str(where)], capture_output=True, check=False).returncode == 0:
                break
            subprocess.run(["sleep", "0.2"], check=False)
        else:
            subprocess.run(["umount", "-l", str(where)], check=False)


def _sizes(run_dir: Path) -> list[tuple[str, int]]:
    """Each file's size: what a failing check shows."""
    return sorted((str(p.relative_to(run_dir)), p.stat().st_size) for p in run_dir.rglob("*") if p.is_file())


def _used(root: Path) -> int:
    """Bytes the files under ``root`` take on disk."""
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


def _leftovers(run_dir: Path) -> list[str]:
    """Files in the run directory that are not mpifl's results: temporary files, and
    a journal holding no commit the log lacks."""
    out = []
    for p in run_dir.rglob("*"):
        rel = p.relative_to(run_dir)
        if p.is_dir():
            if rel.parts[0] != "checkpoint" or (len(rel.parts) == 2 and not re.fullmatch(r"round-\d{6}", p.name)):
                out.append(str(rel))
            continue
        ok = (str(rel) in ("config.yaml", "run.h5", "checkpoint/latest")
              or re.fullmatch(r"checkpoint/round-\d{6}/((meta|part-\d{4})\.pt|manifest\.json)", str(rel))
              or (p.name == "run.h5.journal" and read_journal(p) is not None)
              or (p.name == "run.h5.rounds" and pending.read(p) != []))  # rounds run.h5 lacks yet
        if not ok:
            out.append(str(rel))
    return out


def _same(a, b, rows: int | None = None) -> None:
    keys = set(a.keys()) - TIMING
    assert keys == set(b.keys()) - TIMING
    n = b.n_rounds if rows is None else rows
    assert a.n_rounds == n
    for k in sorted(keys):
        x, y = a.get(k), b.get(k)
        if a.datasets[k].per_round:
            y = y[:n]
        assert x.shape == y.shape and np.array_equal(x, y, equal_nan=True), k  # bitwise


# log.flush_s = 0: run.h5 grows every round, and the ten points fall on each kind of file; 1 (the
# default): rounds wait in run.h5.rounds between flushes, which come before each checkpoint (seven points)
@pytest.mark.parametrize("flush_s", ["0", "1"])
def test_a_full_disk_at_ten_points_costs_nothing_committed_and_the_same_command_resumes(tmp_path, small_disk,
                                                                                       flush_s):
    ref = launch([*ARGS, f"log.flush_s={flush_s}", f"run.out_dir={tmp_path / 'ref'}"], n=2, timeout=120)
    assert ref.returncode == 0, ref.stderr
    # the run's peak: until it ends it holds its previous checkpoint beside the latest, then keeps
    # the final one alone (run.keep_final_checkpoint), so the end leaves one checkpoint less on disk
    final_ck = tmp_path / "ref" / "x" / "checkpoint" / (tmp_path / "ref" / "x" / "checkpoint" / "latest").read_text()
    need = _used(tmp_path / "ref") + _used(final_ck)
    reference = open_run(tmp_path / "ref" / "x")
    seen = []
    for frac in FILL_BY_FLUSH[flush_s]:
        filler = small_disk / "filler"
        filler.write_bytes(bytes(DISK_KIB * 1024 - int(frac * need)))
        args = [*ARGS, f"log.flush_s={flush_s}", f"run.out_dir={small_disk}"]
        cut = launch(args, n=2, timeout=120)  # a hang on any rank would end here
        assert cut.returncode == 74, (frac, cut.returncode, cut.stderr[-2000:])
        lines = cut.stderr.strip().splitlines()
        assert len(lines) == 1 and LINE.fullmatch(lines[0]), (frac, cut.stderr[-2000:])
        what, path, kept, after = LINE.fullmatch(lines[0]).groups()
        assert Path(path).is_relative_to(small_disk / "x")
        run_dir = small_disk / "x"
        assert _leftovers(run_dir) == [], (frac, lines[0], *_sizes(run_dir))
        logged = open_run(run_dir / "run.h5").n_rounds if (run_dir / "run.h5").exists() else 0
        if logged:  # it opens, and holds the uninterrupted run's rounds
            _same(open_run(run_dir / "run.h5"), reference, logged)
        latest = run_dir / "checkpoint" / "latest"
        ck = latest.read_text() if latest.exists() else None
        seen.append((what, logged, ck))
        filler.unlink()
        again = launch(args, n=2, timeout=120)
        assert again.returncode == 0, (frac, again.stderr[-2000:])
        assert (f"resumed after round {int(ck[6:]) + 1})" in again.stdout) if ck else "resumed" not in again.stdout
        assert after == (str(int(ck[6:]) + 1) if ck else None), (lines[0], ck)  # the line said what the rerun did
        _same(open_run(run_dir), reference)
        assert not journal_path(run_dir / "run.h5").exists() and _leftovers(run_dir) == []
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    assert any(w == "log" and n == 0 for w, n, _ in seen), seen  # a new log
    assert any(w == "log" and ck for w, _, ck in seen), seen  # rounds after a checkpoint
    if flush_s == "1":
        return
    # the ten points between them fill the disk while writing each kind of file
    assert {w for w, _, _ in seen} >= {"log", "checkpoint file"}, seen
    assert {w for w, _, _ in seen} & {"run lock", "config"}, seen  # the run's first write (the lock's holder line)
    assert any(w == "checkpoint file" and ck is None for w, _, ck in seen), seen  # the first checkpoint
    assert any(w == "checkpoint file" and ck for w, _, ck in seen), seen  # a later one, the previous kept
