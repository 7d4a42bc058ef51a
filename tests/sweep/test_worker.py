"""Warm workers of ``--local`` sweeps (mpifl/sweep/worker.py): one-rank points run in a
child forked from a worker that imported everything once give bitwise the logs
of ``mpiexec -n 1``; a crash, a kill or a user error fails that point alone.

Bits: a warm worker's log is compared bit for bit with ``mpiexec -n 1``'s: runs on
one machine with the same settings and threads, the conv net's path pinned
(``train.batched=on``), so it holds on whichever CPU runs both."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import yaml
from test_sweep import _sweep_file

from mpifl.logging.h5 import open_run
from mpifl.sweep import rundirs as sweep_rundirs
from mpifl.sweep import runner as sweep_runner
from mpifl.sweep import spec as sweep_spec
from mpifl.sweep import status as sweep_status
from mpifl.sweep import worker

pytestmark = pytest.mark.slow  # every test starts worker processes or mpiexec

TIMING = {"rounds/wall_s", "rounds/comm_s", "rounds/compute_s"}
ATTRS_OF_THE_MACHINE = {"started_at", "hostname", "config_yaml", "train_path_times", "conv_kernel_times"}


def _run(tmp_path, grid, out: str, warm: bool, parallel: int = 2, keep_going: bool = False,
         **extra) -> tuple[sweep_spec.Sweep, int]:
    s = sweep_spec.load(_sweep_file(tmp_path, grid, **extra), out_dir=str(tmp_path / out))
    sweep_rundirs.write(s, tmp_path)
    return s, sweep_runner.run_local(s, 1, tmp_path, parallel, warm=warm, keep_going=keep_going)


def test_warm_and_mpiexec_points_write_bitwise_the_same_logs(tmp_path, monkeypatch):
    if sweep_runner._mpiexec() is None:
        pytest.skip("needs mpiexec")
    pids = []
    monkeypatch.setattr(sweep_status, "mark_started", lambda sweep, index, pid: pids.append(pid))
    grid = [{"algorithm.name": ["fedavg", "local", "dpfl", "fedc2i"]},
            # a conv net's path pinned: under train.batched=auto each run times both paths
            # and takes the faster, so a busy machine could send the two runs down
            # different paths, which agree to float tolerance only
            {"algorithm.name": ["oracle"], "model.name": ["cnn2"], "data.name": ["digits"], "data.subsample": [0.3],
             "train.batched": ["on"]},
            {"algorithm.name": ["fedavg"], "run.threads": [2], "train.batched": ["off"], "data.name": ["digits"]}]
    warm, failed_w = _run(tmp_path, grid, "warm", warm=True)
    cold, failed_c = _run(tmp_path, grid, "cold", warm=False)
    assert failed_w == failed_c == 0
    heads = [[(s.log_dir / f"local_{p.index}.out").read_text().splitlines()[0] for p in s.points] for s in (warm, cold)]
    assert all(h.endswith("(warm worker)") for h in heads[0]) and all(" -n 1 " in h for h in heads[1])
    assert len(set(pids)) == 2 * len(warm.points)  # --status saw each point's own process
    for pw, pc in zip(warm.points, cold.points):
        a, b = open_run(pw.config.run_dir), open_run(pc.config.run_dir)
        assert a.complete and b.complete and a.attrs["n_ranks"] == b.attrs["n_ranks"] == 1
        assert set(a.keys()) == set(b.keys()) and len(a.keys()) > 10
        for k in sorted(set(a.keys()) - TIMING):
            x, y = a.get(k), b.get(k)
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y, equal_nan=True), (pw.name, k)
        for k in sorted(set(a.attrs) | set(b.attrs)):
            if k not in ATTRS_OF_THE_MACHINE:
                assert str(a.attrs.get(k)) == str(b.attrs.get(k)), (pw.name, k)
        ca, cb = (yaml.safe_load(p.config.run_dir.joinpath("config.yaml").read_text()) for p in (pw, pc))
        ca["run"].pop("out_dir"), cb["run"].pop("out_dir")
        assert ca == cb


@pytest.mark.parametrize("fault", ["kill", "raise"])
def test_a_crash_or_a_user_error_fails_that_point_alone(tmp_path, monkeypatch, capsys, fault):
    # a run reaching round 3 dies there (SIGKILL, or an exception); the two-round
    # points never reach it; the features point names a file that is not there
    monkeypatch.setenv("MPIFL_FAULT", f"0:3:{fault}")
    grid = [{"run.rounds": [2, 5]}, {"data.name": ["features"], "data.root": [str(tmp_path / "none.npz")]},
            {"run.rounds": [2], "run.seed": [1]}]
    # one worker takes every point in turn; --keep-going: the user error does not stop the launching
    s, failed = _run(tmp_path, grid, "out", warm=True, parallel=1, keep_going=True)
    assert failed == 2
    ok, crashed, user, after = s.points
    assert open_run(ok.config.run_dir).complete and open_run(after.config.run_dir).complete
    log = {p.index: (s.log_dir / f"local_{p.index}.out").read_text() for p in s.points}
    assert "injected fault" in log[crashed.index] if fault == "raise" else "round    3/5" in log[crashed.index]
    assert "mpifl: error: data.name='features'" in log[user.index]
    out = capsys.readouterr().out
    assert f"{crashed.name}: FAILED (exit {-9 if fault == 'kill' else 1}) after" in out
    assert f"{user.name}: FAILED (exit 2) after" in out and f"  [{user.index}] {user.name}: exit 2, {s.log_dir}" in out
    assert f"{ok.name}: FAILED" not in out and f"{after.name}: FAILED" not in out


def test_a_worker_that_dies_fails_its_point_and_is_replaced(tmp_path):
    pool = worker.Pool.__new__(worker.Pool)  # workers that take one job and die without answering
    pool.cmd = [sys.executable, "-c", "import sys; sys.stdin.readline(); sys.exit(3)"]
    pool.cwd = tmp_path
    pool.idle = worker.queue.Queue()
    pool.idle.put(pool._start())
    log = tmp_path / "a.out"
    started = []
    assert pool.run(tmp_path / "config.yaml", log, started.append) == 3 and started == []
    assert "warm worker running this point died (exit 3)" in log.read_text()
    assert pool.run(tmp_path / "config.yaml", tmp_path / "b.out") == 3  # a new worker took the next point
    pool.close()


def test_a_worker_whose_sweep_is_gone_finishes_its_point_and_ends_quietly(tmp_path):
    """The sweep killed (its terminal closed, its job cancelled): the worker cannot
    answer any more, runs its point on and ends with its stdin, without a traceback."""
    import subprocess

    proc = subprocess.Popen([sys.executable, "-m", "mpifl.sweep.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    proc.stdout.close()  # nobody reads the answers
    log = tmp_path / "point.out"
    proc.stdin.write(f'{{"config": "{tmp_path / "missing.yaml"}", "log": "{log}"}}\n')
    proc.stdin.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err, err
    assert "missing.yaml" in log.read_text()  # the point ran: its user error is in its log
