"""--submit of many points: job arrays split at SLURM's MaxArraySize (asked of
``scontrol show config``, else 1001) with an index offset the array script reads,
array specs as short ranges, and nothing written before sbatch is known to be
there. Stand-in ``sbatch`` and ``scontrol`` on PATH."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_sweep import ROOT, _exe, _sweep_file

from mpifl.errors import ConfigError
from mpifl.sweep import cli as sw
from mpifl.sweep import rundirs as sweep_rundirs
from mpifl.sweep import slurm as sweep_slurm
from mpifl.sweep import spec as sweep_spec
from mpifl.sweep import status as st

SCONTROL = "#!/bin/sh\necho 'Configuration data as of 2024-01-01T00:00:00'\necho 'MaxArraySize            = {n}'\n" \
           "echo 'MaxJobCount             = 10000'\n"


def _indices(spec: str) -> list[int]:
    """'0-2,5%8' -> [0, 1, 2, 5]."""
    out: list[int] = []
    for part in spec.split("%")[0].split(","):
        a, _, b = part.partition("-")
        out += range(int(a), int(b or a) + 1)
    return out


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    """A stand-in sbatch (one line of arguments per call, job ids from 5000) and,
    when ``max_array`` is set, a stand-in scontrol reporting it."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    calls = tmp_path / "sbatch.args"
    _exe(bin_ / "sbatch", f'#!/bin/sh\necho "$@" >> {calls}\necho $((5000 + $(wc -l < {calls})))\n')
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")

    def setup(max_array: int | None) -> Path:
        if max_array is not None:
            _exe(bin_ / "scontrol", SCONTROL.format(n=max_array))
        return calls

    return setup


def _many(tmp_path: Path, n: int, slurm_opts: dict | None = None) -> sweep_spec.Sweep:
    """A sweep of ``n`` points sharing one config (loading 25,000 distinct ones
    takes 20 s; submit reads only each point's index and whether it is done)."""
    s = sweep_spec.load(_sweep_file(tmp_path, {"run.seed": [0]}, slurm=slurm_opts), out_dir=str(tmp_path / "out"))
    one = s.points[0]
    s.points = [sweep_spec.Point(i, f"{i:05d}", {}, one.config) for i in range(n)]
    s.log_dir.mkdir(parents=True)
    return s


@pytest.mark.slow  # a stand-in sbatch (a script) per array
@pytest.mark.parametrize("max_array", [None, 1001, 5000, 40000])
def test_25000_points_go_in_ceil_n_over_max_array_size_arrays(tmp_path, slurm, max_array):
    calls = slurm(max_array)
    s = _many(tmp_path, 25000)
    jobs = sweep_slurm.submit(s)
    size = max_array or 1001  # SLURM's default when scontrol does not answer
    lines = calls.read_text().splitlines()
    assert len(jobs) == len(lines) == math.ceil(25000 / size)
    covered = []
    for line in lines:
        args = line.split()
        assert all(len(a) < 200 for a in args) and args[-1] == str(s.script)
        spec = next(a for a in args if a.startswith("--array=")).removeprefix("--array=")
        offset = next((int(a.rsplit("=", 1)[1]) for a in args if a.startswith("--export=ALL,MPIFL_ARRAY_OFFSET=")), 0)
        tasks = _indices(spec)
        assert 0 <= min(tasks) and max(tasks) < size  # task ids below MaxArraySize
        covered += [offset + t for t in tasks]
    assert covered == list(range(25000))
    # --status maps each point to its array task: point 24999 is the last array's task
    tasks = st._submitted(s)
    assert len(tasks) == 25000 and tasks[24999] == f"{jobs[-1]}_{24999 - (len(jobs) - 1) * size}"


@pytest.mark.slow  # a stand-in sbatch (a script) per array
def test_a_throttle_holds_across_arrays_and_gaps_become_ranges(tmp_path, slurm):
    calls = slurm(1000)
    s = _many(tmp_path, 2500, {"max_parallel": 8})
    todo = [i for i in range(2500) if i % 7]  # some points done
    plan = sweep_slurm.plan_arrays(todo, st.max_array_size())
    jobs = sweep_slurm.submit(s, plan)
    lines = [line.split() for line in calls.read_text().splitlines()]
    assert len(lines) == 3 and all(any(a.endswith("%8") for a in args) for args in lines)
    assert not any(a.startswith("--dependency") for a in lines[0])
    assert f"--dependency=afterany:{jobs[0]}" in lines[1] and f"--dependency=afterany:{jobs[1]}" in lines[2]
    # todo reaches past MaxArraySize: every array has an offset, its first point
    assert lines[0][1].startswith("--array=0-5,7-12,") and "--export=ALL,MPIFL_ARRAY_OFFSET=1" in lines[0]


def test_one_array_keeps_task_ids_equal_to_point_indices():
    assert [(a.offset, a.spec) for a in sweep_slurm.plan_arrays([0, 1, 2, 5, 7, 8], 1001)] == [(0, "0-2,5,7-8")]
    # past MaxArraySize: each array starts at task 0 and spans fewer than MaxArraySize indices
    arrays = sweep_slurm.plan_arrays([3, 999, 1000, 1003, 2500], 1000)
    assert [(a.offset, a.spec) for a in arrays] == [(3, "0,996-997"), (1003, "0"), (2500, "0")]
    # a spec is kept short however scattered the points
    scattered = sweep_slurm.plan_arrays(list(range(0, 400_000, 2)), 4_000_001, spec_max=4096)
    assert all(len(a.spec) <= 4096 for a in scattered) and [i for a in scattered for i in a.indices] == \
        list(range(0, 400_000, 2))
    assert all(max(_indices(a.spec)) < 4_000_001 for a in scattered)


def test_max_array_size_read_from_scontrol_else_the_default(monkeypatch):
    monkeypatch.setattr(st, "_ask", lambda cmd: None)
    assert st.max_array_size() == 1001
    monkeypatch.setattr(st, "_ask", lambda cmd: "MaxArraySize            = 77\nMaxJobCount = 10000\n"
                        if cmd == ["scontrol", "show", "config"] else None)
    assert st.max_array_size() == 77


@pytest.mark.slow  # bash runs the rendered script
def test_the_array_script_runs_the_point_at_offset_plus_task(tmp_path):
    s = sweep_spec.load(_sweep_file(tmp_path, {"run.seed": [0, 1, 2, 3, 4, 5]}), out_dir=str(tmp_path / "out"))
    sweep_rundirs.write(s, ROOT)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    _exe(bin_ / "srun", f'#!/bin/sh\necho "$@" > {tmp_path}/srun.args\n')
    for offset, task, point in ((None, 2, 2), ("3", 1, 4), ("5", 0, 5)):
        env = {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}", "SLURM_ARRAY_TASK_ID": str(task),
               "SLURM_ARRAY_JOB_ID": "9"}
        env.pop("MPIFL_ARRAY_OFFSET", None)
        if offset is not None:
            env["MPIFL_ARRAY_OFFSET"] = offset
        res = subprocess.run(["bash", str(s.script)], env=env, capture_output=True, text=True, timeout=60,
                             check=False)
        assert res.returncode == 0, res.stdout + res.stderr
        assert (tmp_path / "srun.args").read_text().split()[-1] == str(s.points[point].config.run_dir /
                                                                       "config.yaml")


@pytest.mark.slow  # the preflight starts the interpreter
def test_without_sbatch_nothing_is_written(tmp_path, monkeypatch, capsys):
    path = _sweep_file(tmp_path, {"run.seed": [0, 1, 2]})
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "sbatch" else "/bin/true")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.chdir(ROOT)
    rc = sw.main([str(path), "--out-dir", str(tmp_path / "out"), "--allow-local-paths", "--submit"])
    assert rc == 2 and "--submit needs sbatch" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a stand-in sbatch (a script) per array
def test_a_failed_sbatch_after_some_arrays_names_the_submitted_ones(tmp_path, slurm, monkeypatch):
    slurm(1000)
    s = _many(tmp_path, 2500)
    real = sweep_slurm._sbatch

    def third_refused(args: list[str]) -> str:
        if "--export=ALL,MPIFL_ARRAY_OFFSET=2000" in args:
            raise ConfigError("sbatch failed (exit 1): QOSMaxSubmitJobPerUserLimit")
        return real(args)

    monkeypatch.setattr(sweep_slurm, "_sbatch", third_refused)
    with pytest.raises(ConfigError, match=r"QOSMaxSubmitJobPerUserLimit \(after 2 of 3 arrays were submitted: "
                                          r"jobs 5001, 5002; `--status` shows their points\)"):
        sweep_slurm.submit(s)


@pytest.mark.slow  # the preflight starts the interpreter, --submit a stand-in sbatch
def test_submit_from_the_command_line_past_max_array_size(tmp_path, slurm, monkeypatch, capsys):
    calls = slurm(250)
    path = _sweep_file(tmp_path, {"run.seed": list(range(600))})
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.chdir(ROOT)
    rc = sw.main([str(path), "--out-dir", str(tmp_path / "out"), "--allow-local-paths", "--submit"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "submitted 3 array jobs (600 points; SLURM's MaxArraySize bounds each array): 5001, 5002, 5003" in out
    assert [line.split()[1] for line in calls.read_text().splitlines()] == ["--array=0-249"] * 2 + ["--array=0-99"]
