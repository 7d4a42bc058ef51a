"""python -m mpifl.sweep: grid -> configs -> scripts, golden SLURM scripts,
--submit. The --local path against the SLURM script: test_sweep_local.py."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from shlex import join as shlex_join

import numpy as np
import pytest
import yaml
from helpers import REPO

from mpifl.check import node_local
from mpifl.errors import ConfigError
from mpifl.sweep import cli as sw
from mpifl.sweep import rundirs as sweep_rundirs
from mpifl.sweep import slurm as sweep_slurm
from mpifl.sweep import spec as sweep_spec

ROOT = REPO
GOLDEN = Path(__file__).resolve().parent / "golden"
TINY = {  # seconds per run, also under mpiexec -n 2
    "run": {"rounds": 2, "threads": 1},
    "data": {"name": "synthetic", "n_samples": 240, "n_clients": 4, "n_clusters": 2},
    "model": {"hidden": [8]},
}


def _sweep_file(tmp: Path, grid: dict | list, slurm: dict | None = None, name: str = "s", **extra) -> Path:
    base = tmp / "base.yaml"
    base.write_text(yaml.safe_dump(TINY))
    spec = {"name": name, "base": "base.yaml", "grid": grid, **extra}
    if slurm is not None:
        spec["slurm"] = slurm
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# --------------------------------------------------------------------------- loading


def test_grid_is_the_cartesian_product_with_values_applied(tmp_path):
    path = _sweep_file(tmp_path, {"algorithm.name": ["fedavg", "local", "oracle"], "run.seed": [0, 1]},
                       set={"train.lr": 0.1})
    s = sweep_spec.load(path, out_dir=str(tmp_path / "out"))
    assert len(s.points) == 6
    assert len({p.name for p in s.points}) == 6
    seen = set()
    for p in s.points:
        c = p.config
        assert c.algorithm.name == p.values["algorithm.name"] and c.run.seed == p.values["run.seed"]
        assert c.train.lr == 0.1 and c.data.name == "synthetic"  # set: and base
        assert c.run.name == p.name and Path(c.run.out_dir) == s.root / "runs"
        assert "=" not in p.name  # mpifl.main reads a "=" argument as an override
        seen.add((c.algorithm.name, c.run.seed))
    assert len(seen) == 6
    assert s.root == (tmp_path / "out" / "s").resolve()


def test_point_names_use_distinct_key_suffixes(tmp_path):
    path = _sweep_file(tmp_path, {"algorithm.name": ["fedavg"], "run.seed": [3], "data.n_clients": [4]})
    (p,) = sweep_spec.load(path, out_dir=str(tmp_path)).points
    assert p.name == "000_algorithm-fedavg_seed-3_n_clients-4"


@pytest.mark.parametrize("grid, extra, message", [
    ({"run.name": ["a", "b"]}, {}, "run.name is not allowed in a sweep"),
    ({"run.seed": []}, {}, "grid.run.seed=[] is not allowed"),
    ({"train.lr": [0.1, -1.0]}, {}, "point 001_lr--1.0: train.lr=-1.0 is not allowed"),
    ({"train.nope": [1]}, {}, "unknown key 'train.nope'"),
    ({"run.seed": [0]}, {"slurm": {"ntasks": 8}},
     "data.n_clients=4 is not allowed; must be >= the number of MPI ranks (8)"),
    ({"run.seed": [0]}, {"slurm": {"gpus": 1}}, "unknown key 'slurm.gpus'"),
    ({"run.seed": [0]}, {"bogus": 1}, "unknown key 'bogus' in sweep file"),
])
def test_bad_sweeps_fail_with_one_line_naming_the_key(tmp_path, grid, extra, message):
    slurm = extra.pop("slurm", None)
    path = _sweep_file(tmp_path, grid, slurm, **extra)
    with pytest.raises(ConfigError) as e:
        sweep_spec.load(path, out_dir=str(tmp_path))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_write_is_idempotent_and_refuses_a_different_config(tmp_path):
    path = _sweep_file(tmp_path, {"run.seed": [0, 1]})
    s = sweep_spec.load(path, out_dir=str(tmp_path / "out"))
    sweep_rundirs.write(s, ROOT)
    first = {p: p.read_text() for p in s.root.rglob("*") if p.is_file()}
    assert (s.root / "runs.txt").read_text().splitlines() == [str(p.config.run_dir) for p in s.points]
    assert os.access(s.script, os.X_OK)
    sweep_rundirs.write(sweep_spec.load(path, out_dir=str(tmp_path / "out")), ROOT)
    assert {p: p.read_text() for p in s.root.rglob("*") if p.is_file()} == first

    changed = _sweep_file(tmp_path, {"run.seed": [0, 1]}, set={"train.lr": 0.2})
    with pytest.raises(ConfigError, match="holds a different config"):
        sweep_rundirs.write(sweep_spec.load(changed, out_dir=str(tmp_path / "out")), ROOT)
    sweep_rundirs.write(sweep_spec.load(changed, out_dir=str(tmp_path / "out")), ROOT, force=True)
    assert yaml.safe_load(s.points[0].config.run_dir.joinpath("config.yaml").read_text())["train"]["lr"] == 0.2


def test_dry_run_lists_points_and_writes_nothing(tmp_path, capsys):
    path = _sweep_file(tmp_path, {"algorithm.name": ["fedavg", "local"]})
    assert sw.main([str(path), "--out-dir", str(tmp_path / "out"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "000_algorithm-fedavg" in out and "001_algorithm-local" in out and "(new)" in out
    assert not (tmp_path / "out").exists()


def test_cli_reports_config_errors_with_exit_2(tmp_path, capsys):
    path = _sweep_file(tmp_path, {"train.lr": [0]})
    assert sw.main([str(path), "--out-dir", str(tmp_path), "--dry-run"]) == 2
    assert "mpifl.sweep: error: point 000_lr-0: train.lr=0.0 is not allowed" in capsys.readouterr().err


# --------------------------------------------------------------------------- scripts


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("MPIFL_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; rerun with MPIFL_UPDATE_GOLDEN=1 if on purpose"


def _fixed(s: sweep_spec.Sweep) -> sweep_spec.Sweep:
    s.root = Path("/scratch/me/results/dpfl-budget")
    return s


def test_array_script_matches_golden_file(tmp_path):
    path = _sweep_file(tmp_path, {"algorithm.name": ["fedavg", "oracle"], "run.seed": [0, 1, 2]},
                       slurm={"ntasks": 4, "cpus_per_task": 2, "gpus_per_task": 1, "time": "02:00:00",
                              "partition": "gpu", "max_parallel": 3, "python": "/opt/venv/bin/python",
                              "setup": ["module load cuda/12.4"], "sbatch": ["--qos=normal"]},
                       name="dpfl-budget")
    s = _fixed(sweep_spec.load(path, out_dir=str(tmp_path)))
    text = sweep_slurm.array_script(s, Path("/home/me/mpifl"))
    _golden("array.sbatch", text)
    assert "#SBATCH --array=0-5%3" in text and "srun --mpi=pmi2" in text


def test_run_script_matches_golden_file(tmp_path):
    from mpifl import config

    cfg = config.from_dict({**TINY, "run": {**TINY["run"], "name": "q", "out_dir": "/scratch/me/results"}})
    opts = sweep_spec.SlurmOptions(python="/opt/venv/bin/python", mpi="pmix")
    text = sweep_slurm.run_script(cfg, opts, Path("/home/me/mpifl"))
    _golden("run.sbatch", text)
    assert "--gpus-per-task" not in text and "srun --mpi=pmix" in text


@pytest.mark.slow
@pytest.mark.parametrize("name", ["array.sbatch", "run.sbatch"])
def test_golden_scripts_are_valid_bash(name):
    assert subprocess.run(["bash", "-n", str(GOLDEN / name)], check=False).returncode == 0


def test_render_refuses_missing_or_unknown_placeholders():
    with pytest.raises(KeyError, match="needs"):
        sweep_slurm.render("run.sbatch", {"job_name": "x"})


def test_run_mode_writes_the_script_into_the_run_dir(tmp_path, capsys):
    base = tmp_path / "c.yaml"
    base.write_text(yaml.safe_dump(TINY))
    assert sw.main(["--run", str(base), f"run.out_dir={tmp_path}", "run.name=one", "--ntasks", "2",
                    "--allow-local-paths"]) == 0  # tmp_path is under /tmp
    script = (tmp_path / "one" / "run.sbatch").read_text()
    assert f"RUN_DIR={tmp_path / 'one'}" in script and "#SBATCH --ntasks=2" in script
    assert (tmp_path / "one" / "config.yaml").is_file()


@pytest.mark.parametrize("where", ["out_dir", "python", "workdir"])
def test_node_local_paths_are_refused_unless_allowed(tmp_path, monkeypatch, capsys, where):
    if node_local(tmp_path) is None:
        pytest.skip(f"tmp_path {tmp_path} is not node-local here")
    path = _sweep_file(tmp_path, {"run.seed": [0]})
    out = tmp_path / "out" if where == "out_dir" else ROOT / "results" / "mpifl-test-never-written"
    args = [str(path), "--out-dir", str(out)]
    if where == "python":
        args += ["--python", str(tmp_path / "venv" / "bin" / "python")]
    if where == "workdir":
        monkeypatch.chdir(tmp_path)
    else:
        monkeypatch.chdir(ROOT)
    assert sw.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "node-local /tmp" in err and "allow_local_paths" in err, err
    assert not out.exists()  # refused before anything was written
    if where == "out_dir":
        assert sw.main([*args, "--allow-local-paths"]) == 0
        assert "node-local paths allowed" in (out / "s" / "array.sbatch").read_text()


# --------------------------------------------------------------------------- --submit / --local / SLURM path


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.slow
def test_submit_sends_only_unfinished_points(tmp_path, monkeypatch):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    _exe(bin_ / "sbatch", f'#!/bin/sh\necho "$@" >> {tmp_path}/sbatch.args\necho 4242\n')
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    path = _sweep_file(tmp_path, {"run.seed": [0, 1, 2]}, slurm={"max_parallel": 2})
    s = sweep_spec.load(path, out_dir=str(tmp_path / "out"))
    sweep_rundirs.write(s, ROOT)
    # a finished run: make point 1's log by running it here (1 rank, in this process)
    from mpifl.comm import world
    from mpifl.run import runtime

    runtime.run(s.points[1].config, world())
    assert sweep_slurm.submit(s) == ["4242"]
    args = (tmp_path / "sbatch.args").read_text().split()
    assert args == ["--parsable", "--array=0,2%2", str(s.script)]


@pytest.mark.slow
def test_submit_runs_the_local_preflight_first(tmp_path, monkeypatch, capsys):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    _exe(bin_ / "sbatch", f'#!/bin/sh\necho "$@" >> {tmp_path}/sbatch.args\necho 4243\n')
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the interpreter check imports mpifl from the workdir
    monkeypatch.chdir(ROOT)
    missing = _sweep_file(tmp_path, {"run.seed": [0, 1]}, name="m",
                          set={"data.name": "mnist", "data.root": str(tmp_path / "no-mnist")})
    out = ["--out-dir", str(tmp_path / "out"), "--allow-local-paths", "--submit"]
    assert sw.main([str(missing), *out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"mpifl.sweep: error: data.root='{tmp_path / 'no-mnist'}' does not "
                                               "exist"), err  # once for both points
    assert not (tmp_path / "sbatch.args").exists()
    assert sw.main([str(missing), *out, "--python", str(tmp_path / "nope")]) == 2
    assert "the interpreter" in capsys.readouterr().err
    fine = _sweep_file(tmp_path, {"run.seed": [0, 1]}, name="f")
    assert sw.main([str(fine), *out]) == 0
    assert "submitted array job 4243" in capsys.readouterr().out


@pytest.mark.parametrize("path", sorted([*(ROOT / "jobs" / "sweeps").glob("*.yaml"),
                                         *(ROOT / "jobs" / "tables").glob("*.sweep.yaml"),
                                         *(ROOT / "jobs" / "regimes").glob("*.sweep.yaml")]), ids=lambda p: p.name)
def test_shipped_sweeps_validate_where_their_base_exists(path, tmp_path):
    base = yaml.safe_load(path.read_text()).get("base")
    if base and not (path.parent / base).is_file():
        pytest.skip(f"{path.name}: base {base} arrives with its algorithm's branch")
    s = sweep_spec.load(path, out_dir=str(tmp_path))
    grids = s.grid if isinstance(s.grid, list) else [s.grid]
    assert len(s.points) == sum(np.prod([len(v) for v in g.values()]) for g in grids)
    assert len({p.name for p in s.points}) == len(s.points)


def test_a_list_of_grids_is_the_union_of_their_products(tmp_path):
    path = _sweep_file(tmp_path, [{"algorithm.name": ["fedavg", "local"], "run.seed": [0, 1]},
                                  {"algorithm.name": ["pfedlia"], "pfedlia.mode": ["p2p"], "run.seed": [0]}],
                       set={"pfedlia.warmup_rounds": 1})
    s = sweep_spec.load(path, out_dir=str(tmp_path / "out"))
    got = [(p.name, p.config.algorithm.name, p.config.pfedlia.mode, p.config.run.seed) for p in s.points]
    assert got == [("000_algorithm-fedavg_seed-0", "fedavg", "central", 0),
                   ("001_algorithm-fedavg_seed-1", "fedavg", "central", 1),
                   ("002_algorithm-local_seed-0", "local", "central", 0),
                   ("003_algorithm-local_seed-1", "local", "central", 1),
                   ("004_algorithm-pfedlia_seed-0_mode-p2p", "pfedlia", "p2p", 0)]
    assert s.points[0].values == {"algorithm.name": "fedavg", "run.seed": 0}
    assert s.points[4].values == {"algorithm.name": "pfedlia", "pfedlia.mode": "p2p", "run.seed": 0}
    with pytest.raises(ConfigError, match=r"grid=\[\] is not allowed"):
        sweep_spec.load(_sweep_file(tmp_path, []), out_dir=str(tmp_path / "out"))
    with pytest.raises(ConfigError, match=r"grid.run.seed=\[\] is not allowed"):
        sweep_spec.load(_sweep_file(tmp_path, [{"run.seed": [0]}, {"run.seed": []}]), out_dir=str(tmp_path / "out"))


def test_grid_over_base_files_keeps_each_files_own_values(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump({**TINY, "algorithm": {"name": "oracle"},
                                                     "train": {"lr": 0.2}}))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({**TINY, "algorithm": {"name": "fedavg_ft"}}))
    spec = {"name": "jobs", "set": {"run.rounds": 3},
            "grid": {"base": ["a.yaml", "b.yaml"], "algorithm.name": [None, "local"], "run.seed": [0]}}
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    s = sweep_spec.load(path, out_dir=str(tmp_path / "out"))
    got = [(p.name, p.config.algorithm.name, p.config.train.lr, p.config.run.rounds) for p in s.points]
    assert got == [("000_base-a_algorithm-base_seed-0", "oracle", 0.2, 3),
                   ("001_base-a_algorithm-local_seed-0", "local", 0.2, 3),
                   ("002_base-b_algorithm-base_seed-0", "fedavg_ft", 0.05, 3),
                   ("003_base-b_algorithm-local_seed-0", "local", 0.05, 3)]
    spec["base"] = "a.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(ConfigError, match="grid.base and base="):
        sweep_spec.load(path, out_dir=str(tmp_path / "out"))
    spec.pop("base")
    spec["grid"]["base"] = ["a.yaml", "missing.yaml"]
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(ConfigError, match="grid.base='missing.yaml' is not allowed; no such file"):
        sweep_spec.load(path, out_dir=str(tmp_path / "out"))


def test_write_puts_an_absolute_workdir_in_the_array_script(tmp_path, monkeypatch):
    path = _sweep_file(tmp_path, {"run.seed": [0]})
    s = sweep_spec.load(path, out_dir=str(tmp_path / "out"))
    monkeypatch.chdir(tmp_path)
    sweep_rundirs.write(s, Path("."))
    assert f"cd {tmp_path.resolve()} " in s.script.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("args", [["mpifl.sweep", "{sweep}", "--out-dir", "{out}", "--dry-run"], ["mpifl.config"]])
def test_output_cut_short_by_head_closes_quietly(tmp_path, args):
    path = _sweep_file(tmp_path, {"run.seed": list(range(2000))})
    argv = [a.format(sweep=path, out=tmp_path / "o") for a in args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(f"{shlex_join([sys.executable, '-m', *argv])} | head -1", shell=True, capture_output=True,
                         text=True, cwd=ROOT, env=env, check=False)
    assert len(res.stdout.splitlines()) == 1 and res.stderr == "", res.stderr[-2000:]
