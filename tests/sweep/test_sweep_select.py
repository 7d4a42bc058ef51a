"""--only KEY=V1,V2 and --points 0-9,15: the points --dry-run, --status,
--local and --submit act on (mpifl/sweep/select.py)."""

from __future__ import annotations

import pytest
from test_sweep import _sweep_file

from mpifl.errors import ConfigError
from mpifl.sweep import cli as sw
from mpifl.sweep import rundirs as sweep_rundirs
from mpifl.sweep import runner as sweep_runner
from mpifl.sweep import slurm as sweep_slurm
from mpifl.sweep import spec as sweep_spec
from mpifl.sweep import status as sweep_status
from mpifl.sweep.select import parse_points, select, split_values

GRID = {"algorithm.name": ["fedavg", "local", "oracle"], "train.lr": [0.1, 0.05], "run.seed": [0, 1]}


@pytest.fixture
def sweep(tmp_path) -> sweep_spec.Sweep:
    return sweep_spec.load(_sweep_file(tmp_path, GRID), out_dir=str(tmp_path / "out"))


def _picked(s: sweep_spec.Sweep, only=(), points=None) -> list[tuple]:
    return [(p.config.algorithm.name, p.config.train.lr, p.config.run.seed) for p in select(s.points, only, points)]


def test_only_compares_values_after_the_configs_coercion(sweep):
    # 0.10 and 1e-1 are the float 0.1 the config holds; a seed given as text is an int
    assert _picked(sweep, ["train.lr=0.10", "run.seed=1"]) == [("fedavg", 0.1, 1), ("local", 0.1, 1),
                                                               ("oracle", 0.1, 1)]
    assert _picked(sweep, ["train.lr=1e-1", "algorithm.name=local,oracle", "run.seed=0"]) == \
        [("local", 0.1, 0), ("oracle", 0.1, 0)]


def test_points_takes_indices_and_ranges_and_combines_with_only(sweep):
    assert [p.index for p in select(sweep.points, (), "0-2,9")] == [0, 1, 2, 9]
    assert [p.index for p in select(sweep.points, ["run.seed=1"], "0-5")] == [1, 3, 5]
    assert select(sweep.points) is None  # nothing asked: every point


@pytest.mark.parametrize("only, points, message", [
    (["run.seed=7"], None, "--only run.seed=7 selects none of the sweep's 12 points"),
    (["trian.lr=0.1"], None, "unknown key 'trian.lr' (did you mean 'train.lr'?)"),
    (["train.lr=fast"], None, "--only train.lr='fast' must be a number"),
    (["run.seed"], None, "must look like section.key=value"),
    ([], "3-1", "--points '3-1' is not allowed"),
    ([], "0-12", "this sweep's points are 0-11"),
])
def test_a_selection_of_nothing_or_a_bad_one_is_one_line(sweep, only, points, message):
    with pytest.raises(ConfigError) as e:
        select(sweep.points, only, points)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_commas_inside_brackets_stay_in_one_value():
    assert split_values("[64,64],[8]") == ["[64,64]", "[8]"]
    assert parse_points("0, 2-3", 4) == {0, 2, 3}


def test_dry_run_and_status_show_only_the_selection(tmp_path, capsys):
    path = _sweep_file(tmp_path, GRID)
    out = ["--out-dir", str(tmp_path / "out")]
    assert sw.main([str(path), *out, "--dry-run", "--only", "algorithm.name=oracle", "--points", "8-11"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("; 4 selected") and [x.split()[0] for x in lines[1:]] == ["[8]", "[9]", "[10]", "[11]"]
    assert sw.main([str(path), *out, "--status", "--only", "run.seed=1", "--only", "train.lr=0.05"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [x.split()[0] for x in lines[:-1]] == ["[3]", "[7]", "[11]"]
    assert lines[-1] == "sweep s: 3 points (3 of 12 selected): 3 waiting"
    assert sw.main([str(path), *out, "--local", "--only", "run.seed=5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "selects none" in err
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_local_and_submit_act_on_the_selection_only(tmp_path, monkeypatch):
    s = sweep_spec.load(_sweep_file(tmp_path, GRID), out_dir=str(tmp_path / "out"))
    s.selected = select(s.points, ["algorithm.name=local"], "0-4")
    ran = []
    monkeypatch.setattr(sweep_runner, "run_point", lambda cfg, *a, **k: ran.append(cfg.run.name) or 0)
    monkeypatch.setattr(sweep_slurm, "_sbatch_exe", lambda: "sbatch")
    sweep_rundirs.write(s, tmp_path)
    assert sweep_runner.run_local(s, 1, tmp_path, warm=False) == 0
    assert ran == [s.points[4].name]
    monkeypatch.setattr(sweep_status, "max_array_size", lambda: 1001)
    assert [a.indices for a in sweep_slurm.submission_plan(s)] == [[4]]
