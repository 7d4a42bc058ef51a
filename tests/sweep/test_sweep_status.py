"""python -m mpifl.sweep: --set shortens every point, --status reads the run
directories (and SLURM, faked here), --local's lines per finished point and its
summary. Logs are written by hand; nothing is launched."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_sweep import _sweep_file

from mpifl.logging.h5 import Writer
from mpifl.paths import RunDir
from mpifl.sweep import cli as sw
from mpifl.sweep import rundirs as sweep_rundirs
from mpifl.sweep import runner as sweep_runner
from mpifl.sweep import spec as sweep_spec
from mpifl.sweep import status as st


def _log(p: sweep_spec.Point, rounds: int, every: int = 1, wall: float = 2.0) -> float:
    """Log ``rounds`` complete rounds of point ``p`` (evaluated every ``every``);
    returns the last evaluated mean accuracy."""
    cfg = p.config
    rd = RunDir(cfg.run_dir)
    rd.root.mkdir(parents=True, exist_ok=True)
    n = cfg.data.n_clients
    w = Writer(rd.log, {"algorithm": cfg.algorithm.name, "seed": cfg.run.seed, "n_clients": n,
                        "config_yaml": cfg.to_yaml()}, {"cluster": np.zeros(n, int)}, n)
    last = float("nan")
    for t in range(rounds):
        acc = np.full(n, 0.5 + 0.01 * t) if (t + 1) % every == 0 else np.full(n, np.nan)
        if (t + 1) % every == 0:
            last = float(acc.mean())
        w.write_round(t, {"wall_s": wall}, {"metrics/test_acc": acc})
    w.close()
    return last


@pytest.fixture
def sweep(tmp_path) -> sweep_spec.Sweep:
    path = _sweep_file(tmp_path, {"run.seed": list(range(7))})
    s = sweep_spec.load(path, out_dir=str(tmp_path / "out"), overrides=["run.rounds=10"])
    sweep_rundirs.write(s, tmp_path)
    return s


def _lines(s: sweep_spec.Sweep) -> tuple[dict[int, str], str, dict[str, int]]:
    out: list[str] = []
    counts = st.report(s, echo=out.append)
    return {i: out[i] for i in range(len(s.points))}, out[-1], counts


# --------------------------------------------------------------------------- --set


def test_set_applies_to_every_point_and_is_recorded_in_its_config(tmp_path):
    path = _sweep_file(tmp_path, {"algorithm.name": ["fedavg", "local"]})
    s = sweep_spec.load(path, out_dir=str(tmp_path / "o"), overrides=["run.rounds=3", "train.lr=0.2"])
    assert [(p.config.run.rounds, p.config.train.lr) for p in s.points] == [(3, 0.2), (3, 0.2)]
    sweep_rundirs.write(s, tmp_path)
    for p in s.points:
        assert "rounds: 3" in RunDir(p.config.run_dir).config.read_text()
    assert "run.rounds: 3" in (s.root / "sweep.yaml").read_text()


def test_set_on_a_grid_key_or_a_bad_value_is_one_line(tmp_path, capsys):
    path = _sweep_file(tmp_path, {"run.seed": [0, 1]})
    with pytest.raises(sw.ConfigError, match="grid.run.seed varies it"):
        sweep_spec.load(path, overrides=["run.seed=3"])
    assert sw.main([str(path), "--out-dir", str(tmp_path / "o"), "--dry-run", "--set", "run.rounds=0"]) == 2
    err = capsys.readouterr().err
    assert "run.rounds" in err and err.count("\n") == 1


def test_overrides_after_the_sweep_file_act_as_set(tmp_path, capsys):
    path = _sweep_file(tmp_path, {"run.seed": [0, 1]})
    assert sw.main([str(path), "run.rounds=4", "--out-dir", str(tmp_path / "o"), "--allow-local-paths"]) == 0
    s = sweep_spec.load(path, out_dir=str(tmp_path / "o"), overrides=["run.rounds=4"])
    assert all("rounds: 4" in RunDir(p.config.run_dir).config.read_text() for p in s.points)


# --------------------------------------------------------------------------- --status


def test_status_names_each_points_state_from_its_run_directory(sweep):
    p = sweep.points
    acc_done = _log(p[0], 10)  # done
    acc_run = _log(p[1], 4, wall=3.0)  # running: this process holds its pid file
    st.mark_started(sweep, 1, os.getpid())
    _log(p[2], 2)  # failed: exit 1, an error in its output
    st.local_log(sweep, 2).write_text("round 1/10 ...\nmpifl: error: something broke\nAbort(1) MPI_Abort\n")
    st.mark_finished(sweep, 2, 1)
    _log(p[3], 5)  # preempted: exit 75
    st.mark_finished(sweep, 3, 75)
    _log(p[4], 3, every=2)  # stopped: partial log, nothing running it
    lines, total, counts = _lines(sweep)  # 5, 6: waiting
    assert "done" in lines[0] and f"final test_acc {acc_done:.4f}" in lines[0] and "10/10" in lines[0]
    assert "running" in lines[1] and "4/10" in lines[1] and f"test_acc {acc_run:.4f}" in lines[1]
    assert "eta 18s" in lines[1]  # 6 rounds left at the logged 3 s per round
    assert "failed" in lines[2] and str(st.local_log(sweep, 2)) in lines[2]
    assert lines[2].endswith("mpifl: error: something broke")
    assert "preempted" in lines[3] and "5/10" in lines[3]
    assert "stopped" in lines[4] and "3/10" in lines[4] and "(round 2)" in lines[4]  # last evaluated
    assert "waiting" in lines[5] and "waiting" in lines[6]
    assert counts == {"done": 1, "running": 1, "failed": 1, "preempted": 1, "stopped": 1, "waiting": 2}
    assert total.startswith("sweep s: 7 points: 1 done, 1 running, 2 waiting, 1 preempted, 1 stopped, 1 failed")


def test_a_local_runner_that_died_leaves_its_point_stopped_not_running(sweep):
    _log(sweep.points[0], 4)
    st.mark_started(sweep, 0, 2 ** 22 + 12345)  # no such process
    lines, _, _ = _lines(sweep)
    assert "stopped" in lines[0]


def test_status_asks_slurm_for_the_submitted_arrays(sweep, monkeypatch):
    st.record_submission(sweep, "77", [0, 1, 2, 3, 4, 5, 6])
    _log(sweep.points[1], 2)
    _log(sweep.points[3], 6)
    (sweep.log_dir / "77_2.out").write_text("mpifl: task 77_2\nslurmstepd: error: JOB CANCELLED DUE TO TIME LIMIT\n")
    answers = {"sacct": "77_0|PENDING\n77_1|RUNNING\n77_2|TIMEOUT\n77_3|REQUEUED\n77_4|COMPLETED\n",
               "squeue": "77_0|PENDING\n77_1|RUNNING\n77_3|PENDING\n"}
    asked = []
    monkeypatch.setattr(st, "_ask", lambda cmd: asked.append(cmd) or answers[cmd[0]])
    lines, total, counts = _lines(sweep)
    assert "queued" in lines[0]
    assert "running" in lines[1] and "2/10" in lines[1]
    assert "failed" in lines[2] and "timeout" in lines[2] and "77_2.out" in lines[2] and "TIME LIMIT" in lines[2]
    assert "preempted" in lines[3] and "requeued" in lines[3]
    assert "failed" in lines[4] and "completed" in lines[4]  # SLURM finished it, the log did not
    assert "waiting" in lines[5]
    assert {c[0] for c in asked} == {"sacct", "squeue"} and all("77" in c for c in asked)
    assert "SLURM jobs 77" in total


def test_status_without_slurm_reads_the_files_alone(sweep, monkeypatch):
    st.record_submission(sweep, "77", [0])
    monkeypatch.setattr(st, "_ask", lambda cmd: None)
    _, total, counts = _lines(sweep)
    assert counts == {"waiting": 7} and "SLURM did not answer" in total


def test_status_from_the_command_line_writes_nothing(tmp_path, capsys):
    path = _sweep_file(tmp_path, {"run.seed": [0, 1]})
    assert sw.main([str(path), "--out-dir", str(tmp_path / "o"), "--status"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[-1] == "sweep s: 2 points: 2 waiting"
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- --local's lines


def test_local_prints_a_line_per_finished_point_and_a_summary(sweep):
    p = sweep.points
    acc = _log(p[0], 10)
    assert sweep_runner.finished_line(p[0], 0, 12.3, st.local_log(sweep, 0)) == \
        f"[0] {p[0].name}: done in 12s, 10/10 rounds, final test_acc {acc:.4f}"
    _log(p[1], 3)
    st.local_log(sweep, 1).write_text("mpifl: rank 0 of 1: error: client 3 produced a non-finite loss\n")
    line = sweep_runner.finished_line(p[1], 1, 200, st.local_log(sweep, 1))
    assert line.startswith(f"[1] {p[1].name}: FAILED (exit 1) after 3.3min, 3/10 rounds; ")
    assert line.endswith(f"{st.local_log(sweep, 1)}: mpifl: rank 0 of 1: error: client 3 produced a non-finite loss")
    assert "preempted" in sweep_runner.finished_line(p[2], 75, 1, st.local_log(sweep, 2))
    summary = sweep_runner.local_summary(sweep, {1: 1, 2: 0, 3: 75}).splitlines()
    assert summary[0] == "sweep s: 1 done (4 were already complete), 2 failed:"
    assert summary[1:] == [f"  [1] {p[1].name}: exit 1, {st.local_log(sweep, 1)}",
                           f"  [3] {p[3].name}: exit 75, {st.local_log(sweep, 3)}"]


def test_local_marks_each_point_for_status(sweep, monkeypatch, tmp_path):
    seen = []

    class Proc:  # a run that reports what --status sees while it goes
        pid = os.getpid()

        def __init__(self, cmd, **kw):
            self.index = int(cmd[-1])

        def wait(self):
            lines, _, _ = _lines(sweep)
            seen.append(lines[self.index])
            return 0 if self.index != 2 else 1

    monkeypatch.setattr(sweep_runner, "local_command", lambda cfg, ranks, python=None: ["run", str(cfg.run.seed)])
    monkeypatch.setattr(subprocess, "Popen", Proc)
    assert sweep_runner.run_local(sweep, 1, Path(tmp_path), warm=False) == 1  # the mpiexec path
    assert all("running" in line for line in seen) and len(seen) == 7
    lines, _, counts = _lines(sweep)
    assert "failed" in lines[2] and counts["failed"] == 1 and counts["waiting"] == 6  # the others logged nothing
