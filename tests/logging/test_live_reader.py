"""Reading a log while its writer commits rounds (a sweep driver's progress, the
status command, a test polling a run): the reader gets one commit's rounds, never
pieces of two, which HDF5's C code may crash on rather than refuse.

Bits: the exact comparisons are of values read back as they were written (numpy's
draws for one seed): any CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpifl.logging import journal
from mpifl.logging.h5 import Writer, open_run
from mpifl.logging.journal import journal_path, still
from mpifl.logging.mixing import Dense

N = 6
ROOT = Path(__file__).resolve().parents[2]  # a child imports this module from its folder alone, without helpers


def _round(w: Writer, t: int) -> None:
    rng = np.random.default_rng(t)
    w.write_round(t, {"wall_s": 0.1}, {"metrics/test_acc": rng.random(N), "algo/big": rng.random((N, 50))},
                  mixing=Dense(np.full((N, N), 1.0 / N, np.float32)))


def _writer(path: Path) -> Writer:
    return Writer(path, {"n_ranks": 1, "n_clients": N}, {"cluster": np.arange(N) % 2}, N)


def test_a_log_without_a_writer_is_read_in_place(tmp_path):
    path = tmp_path / "run.h5"
    w = _writer(path)
    assert journal_path(path).exists()  # the writer's mark, from its first line on
    _round(w, 0)
    w.close()
    assert not journal_path(path).exists()
    with still(path) as image:
        assert image is None
    assert open_run(path).n_rounds == 1


def test_a_reader_holds_the_writers_next_commit_until_it_is_done(tmp_path):
    path = tmp_path / "run.h5"
    w = _writer(path)
    _round(w, 0)
    done = threading.Event()

    def write() -> None:
        _round(w, 1)  # flush_s 0: a commit
        done.set()

    with still(path) as image:
        assert image is None  # read in place, the log held still
        t = threading.Thread(target=write)
        t.start()
        assert not done.wait(0.5)
        assert open_run(path).n_rounds == 1  # another reader (a shared lock) reads meanwhile
    assert done.wait(60)
    t.join()
    assert open_run(path).n_rounds == 2
    w.close()


def test_without_locks_a_commit_during_the_copy_is_not_mixed_into_it(tmp_path, monkeypatch):
    """A file system without flock: the reader copies the log, and the first copy
    is torn (half before a commit, the rest after); the journal's header changed,
    so it copies again."""
    path = tmp_path / "run.h5"
    w = _writer(path)
    for t in range(3):
        _round(w, t)
    monkeypatch.setattr(journal, "_lock", lambda fd, how: False)
    real = Path.read_bytes
    calls = []

    def torn(self):
        if self != path or calls:
            return real(self)
        calls.append(1)
        before = real(self)
        _round(w, 3)
        after = real(self)
        return before[:len(before) // 2] + after[len(before) // 2:]

    monkeypatch.setattr(Path, "read_bytes", torn)
    with still(path) as image:
        monkeypatch.setattr(Path, "read_bytes", real)
        assert calls and image == path.read_bytes()  # copied again: the commit of round 3, whole
    assert open_run(path).n_rounds == 4
    w.close()


def test_a_commit_in_the_journal_but_not_in_the_log_is_read_from_the_journal(tmp_path, monkeypatch):
    """A writer killed after its journal's trailer, before the log was written:
    readers see the commit; the log on disk is untouched until the next writer."""
    path = tmp_path / "run.h5"
    w = _writer(path)
    for t in range(2):
        _round(w, t)

    def killed(self, extents):
        raise KeyboardInterrupt  # stands in for SIGKILL between the journal and the log

    monkeypatch.setattr(journal.Journaled, "_apply", killed)
    try:
        _round(w, 2)
    except KeyboardInterrupt:
        pass
    assert journal.read_journal(journal_path(path)) is not None
    with h5py.File(path, "r", locking=False) as f:  # in place: the commit before
        assert f["rounds/round"].shape[0] == 2
    assert open_run(path).n_rounds == 3
    assert np.array_equal(open_run(path).get("metrics/test_acc")[2], np.random.default_rng(2).random(N))


@pytest.mark.slow
def test_a_reader_polling_a_live_writer_sees_only_whole_rounds(tmp_path):
    """Two processes: one writes 150 rounds as fast as it can (and more until the
    reader has read 20 times, so that a loaded machine cannot leave the reader
    without reads during the writes), the other opens the log and reads it over and
    over. The reader must neither crash nor see a round count go back or a row that
    is not the one written."""
    path = tmp_path / "run.h5"
    writer = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})
        from pathlib import Path
        from test_live_reader import _round, _writer
        w = _writer(Path({str(path)!r}))
        Path({str(tmp_path / 'started')!r}).touch()
        counted = Path({str(tmp_path / 'reads')!r})
        t = 0
        while t < 150 or (t < 20000 and not (counted.exists() and int(counted.read_text() or 0) >= 20)):
            _round(w, t)
            t += 1
        w.close()
    """)
    reader = textwrap.dedent(f"""
        import sys, time; sys.path.insert(0, {str(Path(__file__).parent)!r})
        from pathlib import Path
        import numpy as np
        from mpifl.logging.h5 import open_run
        started, done = Path({str(tmp_path / 'started')!r}), Path({str(tmp_path / 'done')!r})
        while not started.exists():
            time.sleep(0.01)
        seen, reads = 0, 0
        while not done.exists():
            run = open_run({str(path)!r})
            with run.reading():
                n = run.n_rounds
                acc = run.get("metrics/test_acc") if n else np.zeros((0, {N}))
            assert n >= seen, (n, seen)
            assert acc.shape[0] == n
            if n:
                assert np.array_equal(acc[n - 1], np.random.default_rng(n - 1).random({N})), n
            seen, reads = n, reads + 1
            Path({str(tmp_path / 'reads.tmp')!r}).write_text(str(reads))
            Path({str(tmp_path / 'reads.tmp')!r}).replace({str(tmp_path / 'reads')!r})
        print(reads, seen)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.Popen([sys.executable, "-c", reader], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    wr = subprocess.run([sys.executable, "-c", writer], env=env, capture_output=True, text=True, timeout=300,
                        check=False)
    (tmp_path / "done").touch()
    out, err = r.communicate(timeout=300)
    assert wr.returncode == 0, wr.stderr
    assert r.returncode == 0, err  # a crash is -11
    reads, seen = map(int, out.split())
    assert reads >= 20 and seen >= 1


def test_closing_a_closed_writer_leaves_the_log_as_it_was(tmp_path):
    """The run's cleanup closes the writer its last round closed: the second close
    must not reopen the log (a commit, and every dataset's CRC-32 read back)."""
    path = tmp_path / "run.h5"
    w = _writer(path)
    _round(w, 0)
    w.close()
    before = path.stat()
    w.close()
    after = path.stat()
    assert (after.st_mtime_ns, after.st_size) == (before.st_mtime_ns, before.st_size)
    assert not journal_path(path).exists()
