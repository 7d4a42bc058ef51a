"""Extending and moving runs: a larger run.rounds continues a finished run to the
same result as a run that had that many rounds from the start; a run directory
moved or renamed resumes; the stored config is the latest, so mpifl.analyze and
mpifl.sweep take the extended run as complete. In this process, one rank.

Bits: an extended, a moved and a resumed run are compared bit for bit with a
straight run in this process (one rank, one thread, the same training path: a resume
keeps its checkpoint's), so it holds on whichever CPU runs both. A conv net's two
paths are asserted to differ, not to agree."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml
from test_reliability import assert_same_logs  # bitwise, wall-clock fields aside

from mpifl import algorithms, config
from mpifl.analysis.summary import summarize
from mpifl.comm import world
from mpifl.config.identity import HOW, NOT_IDENTITY, WHERE, config_diff, flatten, unread_text
from mpifl.errors import ConfigError
from mpifl.logging.h5 import open_run
from mpifl.main import main
from mpifl.run import resume, runtime
from mpifl.sweep import cli as sw
from mpifl.sweep import rundirs as sweep_rundirs
from mpifl.sweep import slurm as sweep_slurm
from mpifl.sweep import spec as sweep_spec
from mpifl.sweep import status as sweep_status

TINY = {"run": {"threads": 1, "name": "r", "checkpoint_every": 2},
        "data": {"name": "synthetic", "n_samples": 240, "n_clients": 6, "n_clusters": 2}, "model": {"hidden": [8]},
        "algorithm": {"fraction": 0.5}, "train": {"momentum": 0.9}}


def _cfg(out, rounds: int, **over) -> config.Config:
    raw = {k: dict(v) for k, v in TINY.items()}
    raw["run"].update(out_dir=str(out), rounds=rounds)
    for key, value in over.items():
        config.assign(raw, key, value, "test")
    return config.from_dict(raw)


@pytest.mark.parametrize("algo", ["fedavg", "ditto", "cfl"])
def test_extending_3_to_5_rounds_equals_a_straight_5_round_run(tmp_path, algo):
    straight = _cfg(tmp_path / "a", 5, **{"algorithm.name": algo})
    runtime.run(straight, world())
    runtime.run(_cfg(tmp_path / "b", 3, **{"algorithm.name": algo}), world())
    extended = _cfg(tmp_path / "b", 5, **{"algorithm.name": algo})
    runtime.run(extended, world())
    a, b = open_run(straight.run_dir), open_run(extended.run_dir)
    assert_same_logs(a, b)
    # the stored config is the latest: config.yaml and run.h5's say run.rounds=5
    assert b.config["run"]["rounds"] == 5 and b.complete and b.rounds_done == 5
    assert yaml.safe_load((extended.run_dir / "config.yaml").read_text())["run"]["rounds"] == 5
    assert config_diff(a.config, b.config) == ""
    # analyze takes it as a complete 5-round run, the sweep as done
    s = summarize(b.path)
    assert s.complete and s.rounds_done == s.rounds_planned == 5
    assert s.final_acc == summarize(a.path).final_acc
    assert sweep_status.is_complete(extended) and sweep_status.status(extended) == "done"
    assert not sweep_status.is_complete(_cfg(tmp_path / "b", 6, **{"algorithm.name": algo}))


def test_fewer_rounds_than_done_is_refused_in_one_line(tmp_path, capsys):
    runtime.run(_cfg(tmp_path, 4), world())
    with pytest.raises(ConfigError) as e:
        resume.find_checkpoint(_cfg(tmp_path, 3))
    msg = str(e.value)
    assert "run.rounds=3 is fewer than the 4 rounds" in msg and "run.rounds>=4" in msg and "\n" not in msg
    assert resume.find_checkpoint(_cfg(tmp_path, 4)) is not None  # the same number: nothing to do
    # from the command line: exit 2, one line, and the run is left as it was
    rc = main(["run.rounds=3", *(f"{k}={v}" for k, v in [("run.out_dir", tmp_path), ("run.name", "r"),
                                                            ("run.threads", 1), ("run.checkpoint_every", 2),
                                                            ("data.name", "synthetic"), ("data.n_samples", 240),
                                                            ("data.n_clients", 6), ("data.n_clusters", 2),
                                                            ("model.hidden", "[8]"), ("algorithm.fraction", 0.5),
                                                            ("train.momentum", 0.9)])])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "run.rounds=3 is fewer than the 4 rounds" in err
    assert open_run(tmp_path / "r").rounds_done == 4 and open_run(tmp_path / "r").config["run"]["rounds"] == 4


def test_a_moved_and_renamed_run_directory_resumes(tmp_path, monkeypatch):
    straight = _cfg(tmp_path / "a", 5)
    runtime.run(straight, world())
    # fails at the start of round 4: 3 rounds logged, the checkpoint of round 2 (checkpoint_every=2)
    monkeypatch.setenv("MPIFL_FAULT", "0:3:raise")
    with pytest.raises(RuntimeError, match="injected fault"):
        runtime.run(_cfg(tmp_path / "b", 5), world())
    monkeypatch.delenv("MPIFL_FAULT")
    assert open_run(tmp_path / "b" / "r").n_rounds == 3
    (tmp_path / "elsewhere").mkdir()
    shutil.move(tmp_path / "b" / "r", tmp_path / "elsewhere" / "renamed")
    moved = _cfg(tmp_path / "elsewhere", 5, **{"run.name": "renamed", "run.resume": "require"})
    runtime.run(moved, world())
    run = open_run(moved.run_dir)
    assert run.attrs["resumed_from_round"] == 2
    assert_same_logs(open_run(straight.run_dir), run)
    assert run.config["run"]["out_dir"] == str(tmp_path / "elsewhere") and run.config["run"]["name"] == "renamed"


def test_run_control_keys_may_change_on_resume_experiment_keys_may_not(tmp_path):
    runtime.run(_cfg(tmp_path, 2), world())
    changed = {"run.checkpoint_every": 5, "log.flush_s": 1.5, "run.threads": 2, "run.device": "cpu",
               "run.out_dir": str(tmp_path), "run.rounds": 3}
    assert resume.find_checkpoint(_cfg(tmp_path, 2, **changed)) is not None
    for key, value in {"run.eval_every": 2, "log.every": 2, "train.lr": 0.1, "run.seed": 1}.items():
        with pytest.raises(ConfigError, match=f"different config: {key}"):
            resume.find_checkpoint(_cfg(tmp_path, 2, **{key: value}))
    # the one list, and every key of it a real config key
    keys = set(flatten(config.from_dict({}).to_dict()))
    assert NOT_IDENTITY == {*WHERE, *HOW, "run.rounds"} and NOT_IDENTITY <= keys


def test_a_sweep_extends_its_points_and_skips_those_done(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({k: v for k, v in TINY.items() if k != "run"}))
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "base": "base.yaml", "grid": {"run.seed": [0, 1]}}))

    def points(rounds: int) -> sweep_spec.Sweep:
        s = sweep_spec.load(path, out_dir=str(tmp_path / "out"), overrides=[f"run.rounds={rounds}", "run.threads=1"])
        sweep_rundirs.write(s, tmp_path)
        return s

    for p in points(2).points:
        runtime.run(p.config, world())
    longer = points(4)  # not refused: the same experiment, longer; each config.yaml now says 4
    assert [sweep_status.status(p.config) for p in longer.points] == ["2/4 rounds", "2/4 rounds"]
    assert all(yaml.safe_load((p.config.run_dir / "config.yaml").read_text())["run"]["rounds"] == 4
               for p in longer.points)
    runtime.run(longer.points[0].config, world())
    assert [sweep_status.is_complete(p.config) for p in longer.points] == [True, False]
    shorter = points(2)  # a point extended past the sweep's rounds is done and keeps its config
    assert all(sweep_status.is_complete(p.config) for p in shorter.points)
    said: list[str] = []
    assert sweep_status.report(longer, echo=said.append) == {"done": 1, "stopped": 1}
    assert "done      4/4" in said[0] and "stopped   2/4" in said[1]
    assert yaml.safe_load((shorter.points[0].config.run_dir / "config.yaml").read_text())["run"]["rounds"] == 4
    with pytest.raises(ConfigError, match=r"holds a different config than this sweep makes for point 000_seed-0: "
                                          r"train.lr \(0.05 -> 0.2\)"):
        sweep_rundirs.write(sweep_spec.load(path, out_dir=str(tmp_path / "out"), overrides=["train.lr=0.2"]), tmp_path)


@pytest.mark.slow  # --local starts a warm worker per run
def test_sweep_local_extends_a_finished_sweep_from_the_command_line(tmp_path, capsys, monkeypatch):
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({k: v for k, v in TINY.items() if k != "run"}))
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "base": "base.yaml", "grid": {"run.seed": [0]}}))
    monkeypatch.setenv("PYTHONPATH", str(sweep_slurm.TEMPLATES.parent))

    def local(rounds: int) -> str:
        rc = sw.main([str(path), "--out-dir", str(tmp_path / "out"), "--local", "--set", f"run.rounds={rounds}",
                      "--set", "run.threads=1"])
        out, err = capsys.readouterr()
        assert rc == 0, out + err
        return out

    local(2)
    out = local(4)  # not refused: the same experiment, longer
    assert "running 1 of 1 point(s)" in out and "done in" in out and "4/4 rounds" in out
    run = open_run(tmp_path / "out" / "s" / "runs" / "000_seed-0")
    assert run.attrs["resumed_from_round"] == 2 and run.complete and run.config["run"]["rounds"] == 4
    assert "done, skipped" in local(3)  # fewer rounds than the log holds: the point is done


def test_a_resumed_auto_run_keeps_the_training_path_it_resumes(tmp_path, monkeypatch):
    """train.batched=auto times both paths at every start; a conv net's paths agree
    to float tolerance only, so a resume that timed the other way round still
    trains on the checkpoint's path, to a straight run's bits."""
    from mpifl.train import Clients

    conv = {"data.name": "digits", "data.n_clients": 4, "data.subsample": 0.3, "model.name": "cnn2",
            "train.batched": "auto"}
    faster: list[bool] = []  # which path each start's timing finds faster: batched?
    monkeypatch.setattr(Clients, "measure_paths",
                        lambda self, *a, **k: (1.0, 2.0) if faster[-1] else (2.0, 1.0))
    faster.append(True)
    straight = _cfg(tmp_path / "a", 4, **conv)
    runtime.run(straight, world())
    runtime.run(_cfg(tmp_path / "b", 2, **conv), world())
    faster.append(False)  # the resume's timing says per client
    extended = _cfg(tmp_path / "b", 4, **conv)
    runtime.run(extended, world())
    a, b = open_run(straight.run_dir), open_run(extended.run_dir)
    assert a.attrs["train_path"] == b.attrs["train_path"] == "batched"
    assert_same_logs(a, b)
    fresh = _cfg(tmp_path / "c", 4, **conv)  # a fresh start follows its own timing
    runtime.run(fresh, world())
    c = open_run(fresh.run_dir)
    assert c.attrs["train_path"] == "per_client"
    assert not (c.get("metrics/train_loss") == a.get("metrics/train_loss")).all()


def test_keys_of_an_unselected_algorithm_are_not_the_runs_identity(tmp_path):
    """fedprox.mu does nothing in an oracle run: a rerun with another value resumes
    it; in a fedprox or fedprox_ft run (which trains as FedProx) it is the experiment."""
    def d(algo: str, mu: float) -> dict:
        return _cfg(tmp_path, 3, **{"algorithm.name": algo, "fedprox.mu": mu}).to_dict()

    assert config_diff(d("oracle", 0.5), d("oracle", 0.1)) == ""
    assert config_diff(d("fedprox", 0.5), d("fedprox", 0.1)) == "fedprox.mu (0.5 -> 0.1)"
    assert config_diff(d("fedprox_ft", 0.5), d("fedprox_ft", 0.1)) == "fedprox.mu (0.5 -> 0.1)"
    assert config_diff(d("oracle", 0.5), d("fedprox", 0.5)) == "algorithm.name ('oracle' -> 'fedprox')"
    assert unread_text(d("oracle", 0.5)) == "fedprox.mu=0.5" and unread_text(d("fedprox", 0.5)) == ""
    default_mu = config.Config().fedprox.mu
    assert unread_text(d("oracle", default_mu)) == ""  # a default is not a setting


def test_every_section_an_algorithm_reads_is_declared():
    """An algorithm that reads another's section (``cfg.fedprox.mu`` in fedprox_ft)
    names it in ``READS``, else that key would not count toward its runs' identity."""
    for name in algorithms.NAMES:
        files = [Path(algorithms.__file__).parent / f"{name}{end}.py" for end in ("", algorithms.PARAMS)]
        text = "".join(f.read_text() for f in files if f.is_file())
        read = {m for m in re.findall(r"cfg\.(\w+)\.", text) if m in algorithms.sections()}
        assert read <= set(algorithms.sections_of(name)), name


def test_main_warns_of_an_unselected_algorithms_keys_in_one_line(tmp_path, capsys):
    args = [f"run.out_dir={tmp_path}", "run.name=w", "run.rounds=1", "run.threads=1", "data.name=synthetic",
            "data.n_samples=240", "data.n_clients=4", "model.hidden=[8]", "algorithm.name=oracle", "fedprox.mu=0.5"]
    assert main(args) == 0
    warned = [ln for ln in capsys.readouterr().err.splitlines() if "warning" in ln]
    assert warned == ["mpifl: warning: fedprox.mu=0.5: not read by algorithm.name=oracle; ignored, and not part of "
                      "the run's identity"]
