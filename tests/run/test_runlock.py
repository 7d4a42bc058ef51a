"""One job per run directory (mpifl.run.lock): a second launch into a directory a
job holds exits 2 naming the holder and changes nothing; a killed holder never
blocks the next job.

Bits: the runs that held the lock are compared bit for bit with a reference run:
launches on one machine with the same settings and one thread per rank, so it holds
on whichever CPU runs them."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import MPIEXEC, REPO, assert_same_logs, launch

from mpifl import config
from mpifl.comm import world
from mpifl.errors import ConfigError
from mpifl.logging.h5 import open_run
from mpifl.paths import RunDir
from mpifl.run import lock as runlock
from mpifl.run import runtime


def _hold(root: str, ready) -> None:
    """A child process: lock ``root``, say so, wait to be killed."""
    runlock.acquire(RunDir(Path(root)))
    ready.set()
    time.sleep(60)


def test_a_second_lock_names_the_holder_and_a_killed_holder_blocks_nothing(tmp_path):
    rd = RunDir(tmp_path / "run")
    ctx = multiprocessing.get_context("fork")  # the child runs only fcntl and os calls
    ready = ctx.Event()
    child = ctx.Process(target=_hold, args=(str(rd.root), ready))
    child.start()
    try:
        assert ready.wait(30)
        before = rd.lock.read_bytes()
        with pytest.raises(ConfigError) as e:
            runlock.acquire(rd)
        msg = str(e.value)
        assert "in use by another mpifl job" in msg and f"pid {child.pid}" in msg and "\n" not in msg
        assert rd.lock.read_bytes() == before  # the loser wrote nothing
        os.kill(child.pid, signal.SIGKILL)  # no release: the kernel drops the lock, the file stays
        child.join(30)
        assert rd.lock.exists()
        lock = runlock.acquire(rd)
        assert f"pid={os.getpid()}\n" in rd.lock.read_text()
        lock.release()
        assert not rd.lock.exists() and rd.root.is_dir()  # the killed job's directory is not ours to remove
    finally:
        child.kill()
        child.join(30)


def test_one_process_cannot_lock_twice_and_release_lets_the_next_in(tmp_path):
    rd = RunDir(tmp_path / "a" / "run")
    first = runlock.acquire(rd)
    with pytest.raises(ConfigError, match=f"pid {os.getpid()}"):
        runlock.acquire(rd)  # flock: a second open file is a second locker, in one process too
    first.release()
    assert not (tmp_path / "a").exists()  # it made a/ and a/run and left them empty: removed
    second = runlock.acquire(rd)
    (rd.root / "config.yaml").write_text("x")
    second.release()
    assert sorted(p.name for p in rd.root.iterdir()) == ["config.yaml"]  # not empty: kept


def test_a_job_into_a_held_run_directory_changes_nothing(tmp_path):
    """In this process: a finished run, its directory held, then the same job with
    more rounds (which would resume and rewrite the log) is refused untouched."""
    raw = ["data.name=synthetic", "data.n_samples=120", "data.n_clients=2", "data.n_clusters=2", "model.hidden=[4]",
           "run.rounds=2", "run.threads=1", f"run.out_dir={tmp_path}", "run.name=r"]
    runtime.run(config.load(None, raw), world())
    rd = RunDir(tmp_path / "r")
    lock = runlock.acquire(rd)
    try:
        before = {p: p.read_bytes() for p in sorted(rd.root.rglob("*")) if p.is_file()}
        with pytest.raises(ConfigError, match="in use by another mpifl job"):
            runtime.run(config.load(None, [*raw, "run.rounds=4"]), world())
        assert {p: p.read_bytes() for p in sorted(rd.root.rglob("*")) if p.is_file()} == before
    finally:
        lock.release()
    assert open_run(rd.root).n_rounds == 2


def test_a_lock_file_mpifl_did_not_write_is_refused_and_kept(tmp_path):
    rd = RunDir(tmp_path)
    rd.lock.write_text("someone's\n")
    with pytest.raises(ConfigError, match="did not write"):
        runlock.acquire(rd)
    assert rd.lock.read_text() == "someone's\n"


def test_the_holder_names_its_slurm_job(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "4200")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "7")
    rd = RunDir(tmp_path)
    lock = runlock.acquire(rd)
    try:
        with pytest.raises(ConfigError, match="SLURM job 4200_7"):
            runlock.acquire(rd)
    finally:
        lock.release()


# a short job: ~2-3 s of start-up (torch, MPI), then ~0.5 s of rounds
JOB = ["jobs/quickstart.yaml", "data.n_clients=8", "run.rounds=20", "run.checkpoint_every=5", "run.threads=1",
       "log.flush_s=0"]
REPEATS = 8
MAX_DELAY = 1.0  # s between the two launches (not 5: see the test's doc)


@pytest.mark.slow
def test_two_launches_into_one_run_directory(tmp_path):
    """Eight times, two ``mpiexec -n 2`` launches of one job into one run
    directory, the second 0-1 s after the first (seeded): exactly one runs and the
    other exits 2 in one line naming it, or, when the second locks after the first
    ended, the second finds the run finished and changes nothing; either way the
    log equals a solo run's bit for bit. Delays of 0-1 s rather than 0-5 s: a
    launch spends 2-3 s starting (torch, MPI) before it takes the lock and its
    rounds take ~0.5 s, so 0-1 s spans both outcomes (most often one refused) and
    the eight pairs take ~40 s on two idle cores (each pair is ~8 CPU-seconds; 20
    pairs took 195 s of a loaded test run)."""
    solo = launch([*JOB, f"run.out_dir={tmp_path}", "run.name=solo"], n=2)
    assert solo.returncode == 0, solo.stderr
    ref = open_run(tmp_path / "solo")
    rng = random.Random(7)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    outcomes = []
    for i in range(REPEATS):
        cmd = [str(MPIEXEC), "-n", "2", sys.executable, "-m", "mpifl.main", *JOB, f"run.out_dir={tmp_path}",
               f"run.name=r{i}"]
        procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
        time.sleep(rng.uniform(0, MAX_DELAY))
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
        res = [(p, *p.communicate(timeout=120)) for p in procs]
        codes = sorted(p.returncode for p, _, _ in res)
        if codes == [0, 2]:
            (_, out, err), = [r for r in res if r[0].returncode == 2]
            lines = err.strip().splitlines()
            assert len(lines) == 1 and "is in use by another mpifl job (host " in lines[0], err
            assert "pid " in lines[0] and out == ""  # it stopped before its first line of output
            outcomes.append("one ran")
        else:
            assert codes == [0, 0], [e for _, _, e in res]
            # the later one locked after the first ended: a finished run, nothing to do
            assert sum("already finished all 20 rounds" in out for _, out, _ in res) == 1
            outcomes.append("in turn")
        assert_same_logs(ref, open_run(tmp_path / f"r{i}"))
        assert not (tmp_path / f"r{i}" / "run.lock").exists()
    print(f"two launches: {outcomes.count('one ran')} with one refused, {outcomes.count('in turn')} in turn")
