"""Trust: no code from data files, no shell from configs, no lost results.

A user on a shared disk may find files planted by someone else in a run
directory, a dataset folder or a sweep; none of them may run code, and mpifl
may not delete or damage what it did not write.

Bits: bench/kill_test.py compares resumed runs bit for bit with uninterrupted ones
launched on the same machine with the same settings, so it holds on whichever CPU
runs both."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO, launch

from mpifl.errors import ConfigError
from mpifl.logging.h5 import open_run

TINY = ["data.name=synthetic", "data.n_samples=240", "data.n_clients=4", "data.n_clusters=2", "model.hidden=[8]",
        "run.rounds=2", "run.threads=1"]


class _Planted:
    """Unpickling this creates ``path``: what a hostile file would do instead."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _one_error_line(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mpifl: error: "), res.stderr
    return lines[0]


# --------------------------------------------------------------------------- checkpoints


@pytest.mark.slow
@pytest.mark.parametrize("where", ["meta", "part", "pointer"])
def test_a_planted_checkpoint_runs_no_code(tmp_path, where):
    args = [*TINY, f"run.out_dir={tmp_path}", "run.name=r"]
    assert launch(args, n=0).returncode == 0
    ck = tmp_path / "r" / "checkpoint"
    marker = tmp_path / "PWNED"
    if where == "meta":
        torch.save({"round": 1, "x": _Planted(marker)}, ck / "round-000001" / "meta.pt")
    elif where == "part":
        torch.save({"ids": _Planted(marker)}, ck / "round-000001" / "part-0000.pt")
    else:  # latest may only name a round-NNNNNN directory beside it
        evil = tmp_path / "elsewhere"
        shutil.copytree(ck / "round-000001", evil)
        torch.save({"round": 1, "x": _Planted(marker)}, evil / "meta.pt")
        (ck / "latest").write_text("../../elsewhere")
    line = _one_error_line(launch([*args, "run.rounds=3"], n=0))
    assert ("checkpoint file" if where != "pointer" else "names '../../elsewhere'") in line
    assert "run.resume=never" in line
    assert not marker.exists()


# --------------------------------------------------------------------------- the log


WRITER = """
import sys
import numpy as np
from mpifl.logging.h5 import Writer
from mpifl.logging.mixing import Dense
N = 100
w = Writer(sys.argv[1], {"n_ranks": 1}, {"cluster": np.zeros(N, int)}, N, flush_s=float(sys.argv[2]))
for t in range(20):
    rows = {k: np.full(N, t, float) for k in ("metrics/train_loss", "metrics/val_loss", "comm/bytes_sent")}
    w.write_round(t, {"wall_s": 1.0}, rows, mixing=Dense(np.full((N, N), t, np.float32)))
    print(t, flush=True)
w.close()
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to kill at a chosen write")
@pytest.mark.parametrize("flush_s", [0.0, 0.05, 1e9])  # every round into run.h5; some; none before the end
def test_sigkill_at_any_write_of_the_log_loses_no_finished_round(tmp_path, flush_s):
    """strace kills the writer at its k-th write call (run.h5's, the journal's, the
    appends to run.h5.rounds), for k across rounds (mid-flush included); every round
    it reported finished must read back whole."""
    script = tmp_path / "w.py"
    script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    kills = 0
    for k in range(20, 200, 7):
        log = tmp_path / f"k{k}" / "run.h5"
        log.parent.mkdir()
        res = subprocess.run(["strace", "-f", "-o", "/dev/null", "-e", "trace=pwrite64,pwritev",
                              "-e", f"inject=pwrite64,pwritev:signal=SIGKILL:when={k}",
                              sys.executable, str(script), str(log), str(flush_s)],
                             env=env, capture_output=True, text=True, timeout=120, check=False)
        finished = len(res.stdout.split())
        if res.returncode == 0:  # fewer writes than k: the whole log, and no k further can kill
            assert finished == 20 and open_run(log).n_rounds == 20 and k > 40, f"k={k}"
            break
        kills += 1
        if finished == 0 and not log.exists():
            continue
        run = open_run(log)
        assert run.n_rounds >= finished, f"k={k}"
        for key in run.keys():
            run.get(key)
        if run.n_rounds:
            assert (run.metric("val_loss")[:, 0] == range(run.n_rounds)).all(), f"k={k}"
    assert kills >= 5  # the kills landed across the rounds


# --------------------------------------------------------------------------- command line


@pytest.mark.slow
def test_a_sweep_over_lr_runs_every_point_though_its_paths_hold_equals_signs(tmp_path):
    from test_sweep import _sweep_file

    path = _sweep_file(tmp_path, {"train.lr": [0.1, 0.01]}, name="lr=0.1-0.01")
    res = subprocess.run([sys.executable, "-m", "mpifl.sweep", str(path), "--out-dir", str(tmp_path / "out"),
                          "--local", "--ranks", "1"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    runs = sorted((tmp_path / "out" / "lr=0.1-0.01" / "runs").iterdir())
    assert [r.name for r in runs] == ["000_lr-0.1", "001_lr-0.01"]
    for r, lr in zip(runs, (0.1, 0.01)):
        assert "=" in str(r / "config.yaml")
        run = open_run(r)
        assert run.complete and run.config["train"]["lr"] == lr


# --------------------------------------------------------------------------- config input


@pytest.mark.parametrize(("text", "value"), [('".05"', 0.05), ('".1e3"', 100.0), ('".5E+1"', 5.0), ('".5e-2"', 0.005),
                                             ('" .5"', 0.5)])
def test_quoted_numbers_read_as_yaml_numbers_never_shifted(tmp_path, text, value):
    from mpifl import config

    f = tmp_path / "c.yaml"
    f.write_text(f"train:\n  weight_decay: {text}\n")
    assert config.load(f).train.weight_decay == value
    assert config.load(None, [f"train.weight_decay={text}"]).train.weight_decay == value


@pytest.mark.parametrize("text", ['"1_0"', '"infinity"', '"..5"'])
def test_strings_that_are_no_yaml_number_are_refused(text):
    from mpifl import config

    with pytest.raises(ConfigError, match=r"^train\.weight_decay=.* must be a number"):
        config.load(None, [f"train.weight_decay={text}"])


@pytest.mark.slow
@pytest.mark.parametrize("nest", ["[", "{a: "])
def test_a_3000_deep_yaml_exits_2_in_one_line(tmp_path, nest):
    f = tmp_path / "deep.yaml"
    f.write_text("run: " + nest * 3000 + "1" + ("]" if nest == "[" else "}") * 3000 + "\n")
    line = _one_error_line(launch([str(f)], n=0))
    assert "deep.yaml" in line and "levels deep" in line


def test_huge_values_are_cut_in_error_messages():
    from mpifl import config

    with pytest.raises(ConfigError) as e:
        config.load(None, ["train.optimizer=" + "x" * 100_000])
    msg = str(e.value)
    assert len(msg) < 500 and msg.startswith("train.optimizer='xxx") and msg.endswith("sgd, adam")
    assert "characters)..." in msg


@pytest.mark.parametrize("key", ["name", "out_dir"])
def test_control_characters_in_run_paths_are_config_errors(tmp_path, key):
    from mpifl import config

    f = tmp_path / "c.yaml"
    f.write_text(f'run:\n  {key}: "x\\ntouch PWNED"\n')
    with pytest.raises(ConfigError, match=rf"^run\.{key}='x\\ntouch PWNED' is not allowed; no newlines"):
        config.load(f)


# --------------------------------------------------------------------------- run directories


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["not a run", "another config"])
def test_a_fresh_run_into_a_foreign_directory_deletes_nothing(tmp_path, kind):
    d = tmp_path / "r"
    (d / "checkpoint" / "round-000001").mkdir(parents=True)
    (d / "checkpoint" / "round-000001" / "meta.pt").write_bytes(b"someone's")
    (d / "checkpoint" / "latest").write_text("round-000001")
    (d / "run.h5").write_bytes(b"precious results")
    (d / "notes.txt").write_text("mine")
    args = [*TINY, f"run.out_dir={tmp_path}", "run.name=r", "run.resume=never"]
    if kind == "another config":
        assert launch([*args[:-1], "run.name=other", "train.lr=0.2"], n=0).returncode == 0
        (d / "config.yaml").write_bytes((tmp_path / "other" / "config.yaml").read_bytes().replace(b"other", b"r"))
    before = _tree(d)
    line = _one_error_line(launch(args, n=0))
    assert "use another run.name" in line and ("train.lr" in line) == (kind == "another config")
    assert _tree(d) == before


@pytest.mark.slow
def test_a_fresh_start_of_the_same_config_replaces_only_its_own_files(tmp_path):
    args = [*TINY, f"run.out_dir={tmp_path}", "run.name=r"]
    assert launch(args, n=0).returncode == 0
    d = tmp_path / "r"
    (d / "checkpoint" / "keep.txt").write_text("not mpifl's")
    (d / "notes.txt").write_text("mine")
    res = launch([*args, "run.resume=never", "run.rounds=3"], n=0)
    assert res.returncode == 0, res.stderr
    assert "resumed" not in res.stdout and open_run(d).n_rounds == 3
    assert (d / "checkpoint" / "keep.txt").read_text() == "not mpifl's" and (d / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (d / "checkpoint").iterdir()) == ["keep.txt", "latest", "round-000002"]


# --------------------------------------------------------------------------- sbatch scripts


@pytest.mark.parametrize(("key", "value"), [
    ("time", "01:00:00\nrm -rf ~"), ("time", "01:00:00; touch PWNED"), ("time", "$(touch PWNED)"),
    ("partition", "gpu\ntouch PWNED"), ("partition", "gpu`touch PWNED`"), ("account", "me;touch PWNED"),
    ("mem", "4G $(touch PWNED)"), ("python", "/opt/py\ntouch PWNED"), ("sbatch", ["--qos=x\ntouch PWNED"]),
    ("srun", ["--x\ntouch PWNED"]), ("setup", ["module load x\ntouch PWNED"]), ("mpi", "pmi2\ntouch PWNED"),
])
def test_hostile_slurm_options_are_errors_naming_the_key(tmp_path, key, value):
    from mpifl.errors import ConfigError
    from mpifl.sweep import slurm as sweep_slurm
    from mpifl.sweep import spec as sweep_spec

    with pytest.raises(ConfigError) as e:
        sweep_spec.SlurmOptions.from_dict({key: value})
    assert str(e.value).startswith(f"slurm.{key}") and "\n" not in str(e.value)
    opts = sweep_spec.SlurmOptions(**{key: value})  # built directly: rendering checks again
    cfg = _cfg(tmp_path / "o", "r")
    with pytest.raises(ConfigError, match=f"^slurm.{key}"):
        sweep_slurm.run_script(cfg, opts, tmp_path)


@pytest.mark.parametrize(("key", "value"), [("name", "r\ntouch PWNED"), ("out_dir", "/scratch/o\ntouch PWNED")])
def test_newlines_in_run_paths_never_reach_a_script(tmp_path, key, value):
    from mpifl.errors import ConfigError
    from mpifl.sweep import cli as sw
    from mpifl.sweep import slurm as sweep_slurm
    from mpifl.sweep import spec as sweep_spec

    f = tmp_path / "c.yaml"
    f.write_text(f"run: {{{key}: {value!r}}}\n".replace("'", '"').replace("\n", "\\n", 1))
    assert sw.main(["--run", str(f), "--dry-run"]) == 2
    with pytest.raises(ConfigError, match=f"^run.{key}="):
        sweep_slurm.run_script(_cfg(*(("/scratch/o", value) if key == "name" else (value, "r"))),
                               sweep_spec.SlurmOptions(), tmp_path)


HOSTILE = "$(touch PWNED1) `touch PWNED2`; touch PWNED3"


def _cfg(out_dir, name: str):
    from mpifl import config

    raw = {"run": {"out_dir": str(out_dir), "name": name, "rounds": 2}, "data": {"name": "synthetic"}}
    try:
        return config.from_dict(raw)
    except ConfigError:
        return config.Config(config.RunConfig(out_dir=str(out_dir), name=name))  # as a caller might build it


def _hostile_script(out_dir, workdir: Path) -> str:
    from mpifl.sweep import slurm as sweep_slurm
    from mpifl.sweep import spec as sweep_spec

    opts = sweep_spec.SlurmOptions(python=f"/opt/py {HOSTILE}", srun=[f"--x={HOSTILE}", "`touch PWNED4`;"],
                                   sbatch=[f"--comment={HOSTILE}"], partition="gpu,debug", account="lab-1", mem="16G")
    return sweep_slurm.run_script(_cfg(out_dir, f"r {HOSTILE}"), opts, workdir)


@pytest.mark.slow
def test_hostile_values_render_inert_in_the_run_script(tmp_path):
    from test_sweep import _exe, _golden

    text = _hostile_script(f"/scratch/o {HOSTILE}", Path(f"/home/me/mpifl {HOSTILE}"))
    _golden("run-hostile.sbatch", text)
    assert subprocess.run(["bash", "-n"], input=text, text=True, check=False).returncode == 0
    for line in text.splitlines():  # the values land in comments (#SBATCH too) or in single quotes
        if not line.startswith("#"):
            assert "PWNED" not in re.sub(r"'[^']*'", "", line), line
    assert "#SBATCH --job-name=r___touch_PWNED1___touch_PWNED2___touch_PWNED3\n" in text

    # run it, with srun and scontrol stand-ins that print their arguments
    out, work, bin_ = tmp_path / f"o {HOSTILE}", tmp_path / f"w {HOSTILE}", tmp_path / "bin"
    work.mkdir()
    bin_.mkdir()
    _exe(bin_ / "srun", '#!/bin/bash\nprintf "<%s>\\n" "$@"\n')
    script = tmp_path / "run.sbatch"
    script.write_text(_hostile_script(out, work))
    env = {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "7"}
    res = subprocess.run(["bash", str(script)], cwd=work, env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"<--x={HOSTILE}>" in res.stdout and "<`touch PWNED4`;>" in res.stdout
    assert f"</opt/py {HOSTILE}>" in res.stdout  # the interpreter path, one word, as written
    assert not [p for p in tmp_path.rglob("PWNED*")], "a hostile value ran"


# --------------------------------------------------------------------------- datasets


@pytest.mark.parametrize(("name", "file"), [("cifar10", "data_batch_2"), ("cifar10", "batches.meta"),
                                            ("cifar100", "test")])
def test_a_hostile_cifar_pickle_is_refused(tmp_path, name, file):
    import pickle

    import numpy as np
    from test_datasets import cfg_for, write_cifar

    from mpifl.data import datasets
    from mpifl.errors import ConfigError

    write_cifar(tmp_path, name == "cifar100", np.random.default_rng(0))
    folder = tmp_path / ("cifar-10-batches-py" if name == "cifar10" else "cifar-100-python")
    marker = tmp_path / "PWNED"
    (folder / file).write_bytes(pickle.dumps({"data": _Planted(marker)}, protocol=2))
    with pytest.raises(ConfigError) as e:
        datasets.load(cfg_for(name, tmp_path), 0)
    # open pickles as io.open on Python 3.11 and as _io.open on 3.12
    assert "\n" not in str(e.value) and re.search(r"refused global _?io\.open", str(e.value))
    assert not marker.exists()


# --------------------------------------------------------------------------- analysis


@pytest.mark.slow
@pytest.mark.parametrize("lie", ["wide metric", "long clients", "more rounds than planned"])
def test_analyze_skips_a_log_whose_shapes_do_not_match_its_attributes(tmp_path, lie):
    import h5py
    from test_analyze import N, R, _write_log

    from mpifl import analyze as an

    _write_log(tmp_path / "good" / "run.h5", extras=False).close()
    bad = tmp_path / "bad" / "run.h5"
    _write_log(bad, extras=False).close()
    with h5py.File(bad, "a") as f:  # declared, not stored: the file stays small
        if lie == "wide metric":
            del f["metrics/test_acc"]
            f.create_dataset("metrics/test_acc", shape=(R, 2_000_000), maxshape=(None, None), dtype="f8",
                             chunks=(1, 1024)).attrs["per_round"] = True
        elif lie == "long clients":
            del f["clients/n_test"]
            f.create_dataset("clients/n_test", shape=(20_000_000,), dtype="f8", chunks=(1024,))
        else:
            f["rounds/round"].resize(10_000_000, axis=0)
    assert bad.stat().st_size < 1_000_000
    lines = []
    res = an.analyze([tmp_path / "good", tmp_path / "bad"], tmp_path / "out", heatmaps="none",
                     echo=lambda *a, **k: lines.append(a[0]))
    assert len(res["runs"]) == 1 and [p for p, _ in res["skipped"]] == [bad]
    (line,) = [ln for ln in lines if ln.startswith("skipped")]
    assert "does not match its own attributes" in line and "\n" not in line
    assert str(N) in line


@pytest.mark.slow
def test_random_sigkills_under_mpiexec_then_resume_bitwise(tmp_path):
    """bench/kill_test.py with a small count (the README's run uses --count 50)."""
    res = subprocess.run([sys.executable, str(REPO / "bench" / "kill_test.py"), "--count", "2", "--seed", "3",
                          "--algorithms", "fedavg", "dpfl", "--out", str(tmp_path)], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=900,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "kill test: 2/2 passed" in res.stdout
