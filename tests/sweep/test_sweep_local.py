"""``--local`` gives the same files as the SLURM path: the array script that
``python -m mpifl.sweep`` renders, run task by task with a stand-in ``srun`` that
starts the ranks with mpiexec (the real SLURM test is .ci/slurm.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_sweep import ROOT, _exe, _sweep_file

from mpifl.logging.h5 import open_run
from mpifl.sweep import cli as sw
from mpifl.sweep import rundirs as sweep_rundirs
from mpifl.sweep import runner as sweep_runner
from mpifl.sweep import spec as sweep_spec
from mpifl.sweep import status as sweep_status


def _fake_srun(bin_: Path) -> None:
    """srun's launch without SLURM: drop srun's options, start the ranks with mpiexec."""
    mpiexec = sweep_runner._mpiexec()
    _exe(bin_ / "srun", "#!/bin/bash\n"
                        'while [[ "$1" == --* ]]; do shift; done\n'
                        f'exec {mpiexec} -n "$SLURM_NTASKS" "$@"\n')


@pytest.mark.slow
def test_local_gives_the_same_files_as_the_slurm_array(tmp_path):
    if sweep_runner._mpiexec() is None:
        pytest.skip("needs mpiexec")
    path = _sweep_file(tmp_path, {"algorithm.name": ["fedavg", "oracle"]}, slurm={"ntasks": 2})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    py = sys.executable

    local = subprocess.run([py, "-m", "mpifl.sweep", str(path), "--out-dir", str(tmp_path / "local"), "--local",
                            "--allow-local-paths"],  # as below: sweep.yaml records it
                           cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=300)
    assert local.returncode == 0, local.stdout + local.stderr

    # the SLURM path: the same sweep written, then each array task run by the rendered script
    written = subprocess.run([py, "-m", "mpifl.sweep", str(path), "--out-dir", str(tmp_path / "slurm"),
                              "--allow-local-paths"],  # tmp_path is under /tmp
                             cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=120)
    assert written.returncode == 0, written.stderr
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    _fake_srun(bin_)
    script = tmp_path / "slurm" / "s" / "array.sbatch"
    for task in range(2):
        task_env = {**env, "PATH": f"{bin_}{os.pathsep}{env['PATH']}", "SLURM_ARRAY_TASK_ID": str(task),
                    "SLURM_ARRAY_JOB_ID": "77", "SLURM_NTASKS": "2", "SLURM_CPUS_PER_TASK": "1"}
        res = subprocess.run(["bash", str(script)], env=task_env, check=False, capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "mpifl: task 77_" in res.stdout

    a, b = tmp_path / "local" / "s", tmp_path / "slurm" / "s"
    files = lambda root: sorted(str(p.relative_to(root)) for p in (root / "runs").rglob("*") if p.is_file())
    # per point: config.yaml, run.h5 and the final checkpoint (latest, meta, manifest, one part per rank)
    assert files(a) == files(b) and len(files(a)) == 2 * 7
    for run in sorted((a / "runs").iterdir()):
        other = b / "runs" / run.name
        ca, cb = (yaml.safe_load((d / "config.yaml").read_text()) for d in (run, other))
        assert ca["run"].pop("out_dir") == str(a / "runs") and cb["run"].pop("out_dir") == str(b / "runs")
        assert ca == cb
        ra, rb = open_run(run), open_run(other)
        assert ra.complete and rb.complete and ra.attrs["n_ranks"] == rb.attrs["n_ranks"] == 2
        assert set(ra.keys()) == set(rb.keys())
        for key in ("metrics/test_acc", "metrics/val_acc", "graph/mixing", "comm/bytes_sent"):
            np.testing.assert_allclose(ra.get(key), rb.get(key), rtol=1e-5, atol=1e-6)
    assert (a / "sweep.yaml").read_text() == (b / "sweep.yaml").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [1, 2])
def test_local_runs_at_most_parallel_points_at_once_and_counts_failures(tmp_path, monkeypatch, parallel):
    path = _sweep_file(tmp_path, {"run.seed": [0, 1, 2, 3, 4]})
    s = sweep_spec.load(path, out_dir=str(tmp_path / "out"))
    sweep_rundirs.write(s, tmp_path)
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    # each "run" records when it starts and ends; seed 3 fails
    job = ("import sys, time, pathlib; d = pathlib.Path(sys.argv[1]); seed = sys.argv[2]; "
           "(d / f'{seed}.start').write_text(repr(time.time())); time.sleep(0.6); "
           "(d / f'{seed}.end').write_text(repr(time.time())); sys.exit(seed == '3')")
    monkeypatch.setattr(sweep_runner, "local_command", lambda cfg, ranks, python=None:
                        [sys.executable, "-c", job, str(stamps), str(cfg.run.seed)])
    assert sweep_runner.run_local(s, 1, tmp_path, parallel, warm=False) == 1  # the mpiexec path's throttle
    spans = [(float((stamps / f"{i}.start").read_text()), float((stamps / f"{i}.end").read_text()))
             for i in range(5)]
    most = max(sum(a <= t < b for a, b in spans) for t, _ in spans)
    assert most == parallel
    assert all((s.log_dir / f"local_{p.index}.out").exists() for p in s.points)


def test_parallel_below_one_is_refused_in_one_line(tmp_path, capsys):
    path = _sweep_file(tmp_path, {"run.seed": [0]})
    assert sw.main([str(path), "--out-dir", str(tmp_path / "o"), "--local", "--parallel", "0"]) == 2
    err = capsys.readouterr().err
    assert "--parallel=0" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()  # refused before anything is written


# --------------------------------------------------------------------------- fail fast


def test_local_runs_the_preflight_on_every_point_before_starting_any(tmp_path, monkeypatch, capsys):
    missing = _sweep_file(tmp_path, {"run.seed": [0, 1, 2]},
                          set={"data.name": "mnist", "data.root": str(tmp_path / "no-mnist")})
    monkeypatch.setattr(sweep_runner, "run_point", lambda *a, **k: pytest.fail("a point started"))
    assert sw.main([str(missing), "--out-dir", str(tmp_path / "out"), "--local"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("mpifl.sweep: error: point 000_seed-0 (and 2 more): data.root=") and \
        "does not exist" in err[0]
    assert not (tmp_path / "out").exists()  # nothing written either
    # a selection is checked alone: the other points' problems are not its own
    fine = _sweep_file(tmp_path, {"run.seed": [0, 1]}, name="f")
    monkeypatch.setattr(sweep_runner, "run_point", lambda *a, **k: 0)
    assert sw.main([str(fine), "--out-dir", str(tmp_path / "out"), "--local", "--mpiexec", "--points", "1"]) == 0


@pytest.mark.parametrize("parallel, keep_going", [(1, False), (2, False), (1, True)])
def test_a_user_error_stops_the_launching_unless_keep_going(tmp_path, monkeypatch, capsys, parallel, keep_going):
    s = sweep_spec.load(_sweep_file(tmp_path, {"run.seed": [0, 1, 2, 3, 4]}), out_dir=str(tmp_path / "out"))
    sweep_rundirs.write(s, tmp_path)
    ran = []

    def fake(cfg, *a, **k):  # seed 1 ends with a user error while seed 0 still runs
        ran.append(cfg.run.seed)
        if cfg.run.seed == 0 and parallel > 1:
            time.sleep(0.1)
        return 2 if cfg.run.seed == 1 else 0

    monkeypatch.setattr(sweep_runner, "run_point", fake)
    assert sweep_runner.run_local(s, 1, tmp_path, parallel, warm=False, keep_going=keep_going) == 1
    out = capsys.readouterr().out.splitlines()
    if keep_going:
        assert sorted(ran) == [0, 1, 2, 3, 4] and not any("stopped launching" in x for x in out)
        return
    assert sorted(ran) == [0, 1]  # what was already running when seed 1 failed, no more
    assert out[-3] == "sweep s: 1 done, 1 failed, 3 not started:"
    assert out[-2].startswith(f"  [1] {s.points[1].name}: exit 2, ")
    assert out[-1] == (f"stopped launching: [1] {s.points[1].name} ended with a user error (exit 2); 3 "
                       "point(s) not started; fix it and run the sweep again, or pass --keep-going to run them anyway")


# --------------------------------------------------------------------------- two drivers, stop signals


def test_two_drivers_on_one_sweep_share_the_points_and_both_end_done(tmp_path, monkeypatch):
    """In one process, two threads: each driver's claims are flocks of its own open files."""
    import threading

    from mpifl.sweep import driver as sweep_driver

    s = sweep_spec.load(_sweep_file(tmp_path, {"run.seed": [0, 1, 2, 3, 4, 5]}), out_dir=str(tmp_path / "out"))
    sweep_rundirs.write(s, tmp_path)
    done, ran, lines = set(), [], {}
    monkeypatch.setattr(sweep_runner, "is_complete", lambda cfg: cfg.run.seed in done)
    monkeypatch.setattr(sweep_driver, "driver_log", lambda sweep: sweep.log_dir / f"driver_{threading.get_ident()}.out")
    monkeypatch.setattr(sweep_driver, "POLL_S", 0.01)

    def fake(cfg, *a, **k):
        ran.append(cfg.run.seed)
        time.sleep(0.05)
        done.add(cfg.run.seed)
        return 0

    monkeypatch.setattr(sweep_runner, "run_point", fake)

    def driver(name):
        lines[name] = sweep_runner.run_local(s, 1, tmp_path, 1, warm=False)

    threads = [threading.Thread(target=driver, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert lines == {"a": 0, "b": 0}  # neither counts a point as failed
    assert sorted(ran) == list(range(6))  # each point ran once
    logs = sorted(s.log_dir.glob("driver_*.out"))
    assert len(logs) == 2  # each driver its own log
    text = [x.read_text() for x in logs]
    assert all("sweep s: " in t and ", 0 failed" in t for t in text)
    assert any("running elsewhere" in t or "done elsewhere" in t for t in text)


def _driver(path: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "mpifl.sweep", str(path), "--out-dir", str(out), "--local", *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _rounds(run_dir: Path) -> int:
    try:
        return open_run(run_dir).rounds_done
    except Exception:  # noqa: BLE001 - a log being written, read mid-round: look again
        return 0


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_stop_signal_to_the_driver_checkpoints_its_runs_and_exits_75(tmp_path, sig):
    import signal

    path = _sweep_file(tmp_path, {"run.seed": [0, 1, 2]}, set={"run.rounds": 100000, "run.checkpoint_every": 0})
    s = sweep_spec.load(path, out_dir=str(tmp_path / "out"))
    proc = _driver(path, tmp_path / "out", "--parallel", "2")
    runs = [p.config.run_dir for p in s.points[:2]]
    deadline = time.monotonic() + 300
    while not all(_rounds(d) >= 2 for d in runs):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.5)
    proc.send_signal(getattr(signal, sig))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, out + err
    assert out.strip().splitlines()[-1].startswith(f"mpifl.sweep: stopped by {sig}: no more points launched; "
                                                   "2 running point(s) stopped at a round boundary with a checkpoint")
    for i, d in enumerate(runs):
        assert (s.log_dir / f"local_{i}.exit").read_text().strip() == "75"
        latest = (d / "checkpoint" / "latest").read_text().strip()
        assert int(latest.removeprefix("round-")) + 1 == _rounds(d)  # the checkpoint holds the last logged round
    assert not s.points[2].config.run_dir.joinpath("run.h5").exists()  # not launched


@pytest.mark.slow
def test_two_driver_processes_on_one_sweep_both_exit_0_with_their_own_logs(tmp_path):
    path = _sweep_file(tmp_path, {"run.seed": [0, 1, 2, 3]}, set={"run.rounds": 40})
    s = sweep_spec.load(path, out_dir=str(tmp_path / "out"))
    a = _driver(path, tmp_path / "out")
    time.sleep(3)
    b = _driver(path, tmp_path / "out")
    outs = [p.communicate(timeout=600) for p in (a, b)]
    assert [a.returncode, b.returncode] == [0, 0], outs
    assert all(sweep_status.is_complete(p.config) for p in s.points)
    text = "".join(o for o, _ in outs)
    assert "FAILED" not in text and "in use by another" not in text
    assert len(list(s.log_dir.glob("driver_*.out"))) == 2
