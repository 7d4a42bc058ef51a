"""A write the file system refuses (full disk, quota, I/O error) while the log or a
checkpoint is written: one StorageError line, nothing committed is lost, no
temporary file stays, and writing on once there is space gives the same log.

A fake disk stands in for the file system: ``os.pwrite``/``os.pwritev`` (the
journal's only writes) take bytes from a budget, cut the write that exhausts it
short and refuse the next one, as a filling disk does. The mounted-tmpfs runs of
the whole program are in tests/test_disk_full.py.

Bits: a log written on after refused writes is compared bit for bit with one written
from the same hand-made values in this process: stored values, equal on any CPU."""

from __future__ import annotations

import errno
import io
import os
import sys

import numpy as np
import pytest
import torch
from fakedisk import FakeDisk, FullFile

from mpifl import config
from mpifl.comm import world
from mpifl.errors import StorageError
from mpifl.logging.h5 import Writer, open_run
from mpifl.logging.journal import journal_path, read_journal
from mpifl.logging.mixing import Dense
from mpifl.run import checkpoint, runtime

N, ROUNDS = 5, 6
TAIL = "free space and rerun the same command to resume"


def _rows(t: int) -> dict[str, np.ndarray]:
    """Round t's rows: values that differ per round and client, and one row big
    enough to be gzip'd (a chunk per round)."""
    rng = np.random.default_rng(t)
    return {"metrics/test_acc": rng.random(N), "metrics/skipped": np.arange(N) * t,
            "algo/big": rng.random((N, 40)).astype(np.float32)}


def _write(path, first: int = 0, keep: int | None = None) -> int:
    """Rounds first..ROUNDS-1 into the log at ``path`` (a new one, or the existing
    one cut to ``keep`` rounds); returns how many write_round calls returned."""
    w = Writer(path, {"n_ranks": 1, "n_clients": N}, {"cluster": np.arange(N) % 2}, N, keep_rounds=keep)
    done = first
    try:
        for t in range(first, ROUNDS):
            m = np.full((N, N), 1.0 / N, np.float32) + np.float32(t)
            w.write_round(t, {"wall_s": 0.5}, _rows(t), mixing=Dense(m), once={"algo/once": np.arange(8.0) + t})
            done = t + 1
    finally:
        w.close()
    return done


def _same(a, b, rows: int | None = None) -> None:
    """Every dataset of log ``a`` equals ``b``'s (its first ``rows`` rounds; a
    dataset written once holds what its round wrote)."""
    assert a.n_rounds == (b.n_rounds if rows is None else rows)
    assert set(a.keys()) <= set(b.keys())
    for k, info in a.datasets.items():
        x, y = a.get(k), b.get(k)
        if info.per_round:
            y = y[:a.n_rounds]
        elif info.round is not None and rows is not None:
            assert info.round == rows - 1
            y = np.arange(8.0) + info.round  # what _write logs once a round
        assert np.array_equal(x, y), k


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The log of an undisturbed run, and the bytes the journal wrote for it."""
    path = tmp_path_factory.mktemp("clean") / "run.h5"
    mp = pytest.MonkeyPatch()
    try:
        disk = FakeDisk(mp, float("inf"))
        assert _write(path) == ROUNDS
    finally:
        mp.undo()
    return open_run(path), disk.written


def _fill_points(total: int, k: int = 24) -> list[int]:
    return sorted({int(x) for x in np.linspace(0, total - 1, k)})


# ENOSPC in the fast tier; the same walk for a quota and an I/O error in the slow one
@pytest.mark.parametrize("err", [errno.ENOSPC, pytest.param(errno.EDQUOT, marks=pytest.mark.slow),
                                 pytest.param(errno.EIO, marks=pytest.mark.slow)])
def test_a_refused_log_write_keeps_every_committed_round_and_writing_on_gives_the_same_log(
        tmp_path, monkeypatch, clean, err):
    ref, total = clean
    points = _fill_points(total)
    said = set()
    for budget in points:
        d = tmp_path / str(budget)
        d.mkdir()
        path = d / "run.h5"
        disk = FakeDisk(monkeypatch, budget, err)
        with pytest.raises(StorageError) as e:
            _write(path)
        monkeypatch.undo()
        msg = str(e.value)
        assert "\n" not in msg and str(path) in msg and os.strerror(err) in msg and msg.endswith(TAIL), msg
        assert disk.left <= 0 or err != errno.ENOSPC
        said.add(msg.split("; ")[1])
        # no temporary file; a journal only where it holds a commit the log is behind
        left = {p.name for p in d.iterdir()}
        assert left <= {"run.h5", "run.h5.journal"}, left
        assert "run.h5.journal" not in left or read_journal(journal_path(path)) is not None
        if "run.h5" not in left:  # refused while the new log was built
            assert "nothing was logged yet" in msg
            kept = 0
        else:
            kept = open_run(path).n_rounds  # opens, and every round it holds is the clean run's
            _same(open_run(path), ref, kept)
            told = int(msg.split("its first ")[1].split()[0]) if "its first" in msg else 0
            assert told == kept or (told + 1 == kept and "run.h5.journal" in left), (told, kept)
        # space again: the rounds after the kept ones, and the log is the clean run's
        _write(path, kept, keep=kept if "run.h5" in left else None)
        _same(open_run(path), ref)
        assert not journal_path(path).exists()
    assert len(said) >= 3, said  # refused while creating, and after some rounds


@pytest.mark.slow
def test_a_write_cut_short_is_never_committed(tmp_path, monkeypatch, clean):
    """The journal used to take a short ``pwrite`` for a complete one and commit a
    file end past bytes that never reached the disk: the log did not open."""
    ref, total = clean
    path = tmp_path / "run.h5"
    for budget in _fill_points(total, 60):
        path.unlink(missing_ok=True)
        FakeDisk(monkeypatch, budget)
        with pytest.raises(StorageError):
            _write(path)
        monkeypatch.undo()
        if path.exists():
            run = open_run(path)
            _same(run, ref, run.n_rounds)


@pytest.mark.parametrize("room", [0, 100, 3000, 40_000])
def test_a_refused_checkpoint_file_is_one_line_and_leaves_no_temporary_file(tmp_path, monkeypatch, room):
    """torch.save reports a refused write as a RuntimeError of its own; the
    checkpoint writer names the file and the system's reason instead."""
    monkeypatch.setattr(checkpoint, "open", lambda p, mode: io.BufferedWriter(FullFile(p, room)), raising=False)
    target = tmp_path / "part-0000.pt"
    with pytest.raises(StorageError) as e:
        checkpoint._save({"params": torch.zeros(20_000)}, target, "the checkpoint round-000003 is kept")
    msg = str(e.value)
    assert msg == (f"cannot write the checkpoint file {str(target)!r} (No space left on device); "
                   f"the checkpoint round-000003 is kept; {TAIL}")
    assert e.value.__cause__ is None and e.value.__suppress_context__
    assert list(tmp_path.iterdir()) == []


def test_a_failing_fsync_of_a_checkpoint_is_a_storage_error(tmp_path, monkeypatch):
    def eio(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", eio)
    with pytest.raises(StorageError, match="Input/output error"):
        checkpoint._save({"x": torch.ones(3)}, tmp_path / "meta.pt", "kept")
    assert list(tmp_path.iterdir()) == []


def test_a_stdout_on_a_full_disk_costs_the_progress_lines_not_the_run(tmp_path, monkeypatch):
    """A direct launch with stdout in a file on the full disk: printing a round's
    line failed and aborted the run."""
    class Full(io.TextIOBase):
        def write(self, s):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    cfg = config.load(None, ["data.name=synthetic", "data.n_samples=160", "data.n_clients=4", "model.hidden=[4]",
                             "run.rounds=3", "run.threads=1", f"run.out_dir={tmp_path}", "run.name=r"], n_ranks=1)
    monkeypatch.setattr(sys, "stdout", Full())
    runtime.run(cfg, world())
    monkeypatch.undo()
    assert open_run(tmp_path / "r").n_rounds == 3


def test_a_run_directory_the_disk_cannot_hold_is_a_storage_error(tmp_path, monkeypatch):
    from pathlib import Path

    mkdir = Path.mkdir

    def full(self, *a, **k):
        if self.name == "r":
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
        return mkdir(self, *a, **k)

    cfg = config.load(None, ["data.name=synthetic", "data.n_samples=160", "data.n_clients=4", "model.hidden=[4]",
                             "run.rounds=1", "run.threads=1", f"run.out_dir={tmp_path}", "run.name=r"], n_ranks=1)
    monkeypatch.setattr(Path, "mkdir", full)
    with pytest.raises(StorageError, match=r"^cannot write the run directory .* \(Disk quota exceeded\); nothing "
                                           r"was logged yet; free space and rerun the same command: it starts the "
                                           r"run over, as no checkpoint was written yet \(the first comes after "
                                           r"round 10\)$"):
        runtime.run(cfg, world())


def test_a_refused_round_buffer_before_the_log_reopens_leaves_no_writers_mark(tmp_path, monkeypatch):
    """log.flush_s > 0: a round refused on its way into run.h5.rounds, before run.h5
    was opened again after its creation, is one StorageError; the writer's empty
    journal (the mark readers copy a live log by) goes with the writer."""
    path = tmp_path / "run.h5"
    w = Writer(path, {"n_ranks": 1, "n_clients": N}, {"cluster": np.arange(N) % 2}, N, flush_s=3600)
    assert journal_path(path).exists() and read_journal(journal_path(path)) is None  # the mark

    def refuse(record: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(w._appender, "append", refuse)
    with pytest.raises(StorageError, match="the log"):
        w.write_round(0, {"wall_s": 0.5}, _rows(0))
    w.close()
    assert not journal_path(path).exists()
    assert open_run(path).n_rounds == 0
