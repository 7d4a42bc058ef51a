"""The shipped files submit as written: every job file passes mpifl.check's local
preflight, and every sweep and seed table ``python -m mpifl.sweep FILE --submit``
(preflight included) against a stand-in ``sbatch``, wherever their data is on this
machine (the built-in data, and Debian's Fashion-MNIST read in place); the others
are skipped, naming the dataset that is missing."""

import os
import re
import stat
from pathlib import Path

import pytest
from helpers import REPO

from mpifl import check, config
from mpifl.data import datasets
from mpifl.data.datasets import BUILTIN, data_path
from mpifl.sweep import cli as sw
from mpifl.sweep import spec as sweep_spec

JOBS = sorted((REPO / "jobs").glob("*.yaml"))
SWEEPS = sorted([*(REPO / "jobs" / "sweeps").glob("*.yaml"), *(REPO / "jobs" / "tables").glob("*.sweep.yaml")])


def _absent(cfg: config.Config) -> str | None:
    """Why this config's dataset is not on this machine, or None."""
    if cfg.data.name in BUILTIN:
        return None
    where = data_path(cfg.data)
    if where is None:
        return f"data.name={cfg.data.name!r}: the file leaves data.root to the user"
    return None if where.exists() else f"data.name={cfg.data.name!r} is not on this machine ({where})"


def test_every_shipped_file_is_walked():
    assert len(JOBS) > 30 and len(SWEEPS) >= 14
    assert {p.name for p in SWEEPS} >= {"dpfl-table1.sweep.yaml", "fedc2i-table1.sweep.yaml",
                                        "federico-table1.sweep.yaml", "pfedlia-table1.sweep.yaml"}


def test_debian_fashion_mnist_counts_as_present_without_a_root(tmp_path, monkeypatch):
    cfg = config.load(str(REPO / "jobs" / "dpfl-fashionmnist-dir.yaml"), [])
    assert cfg.data.root == "" and data_path(cfg.data) == Path("/usr/share/datasets/fashion-mnist")
    if not _absent(cfg):
        assert check.local_problems(cfg, 1) == []
    # a machine without the package: one line naming the folder and the fix
    monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST", tmp_path / "fashion-mnist")
    problems = check.local_problems(cfg, 1)
    assert len(problems) == 1 and problems[0].startswith(
        f"data.name='fashionmnist' with no data.root is read from '{tmp_path / 'fashion-mnist'}', which does not "
        f"exist on {os.uname().nodename}; install Debian's package dataset-fashion-mnist"), problems


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.name)
def test_each_job_file_passes_the_local_preflight_as_written(path):
    cfg = config.load(str(path), [])
    why = _absent(cfg)
    if why:
        pytest.skip(why)
    assert check.local_problems(cfg, 1) == []


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _indices(spec: str) -> set[int]:
    """'0,2-4%8' -> {0, 2, 3, 4}."""
    out: set[int] = set()
    for part in spec.split("%")[0].split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


@pytest.mark.slow  # the preflight starts the interpreter, --submit a stand-in sbatch
@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_each_sweep_submits_as_written(path, tmp_path, monkeypatch, capsys):
    s = sweep_spec.load(path, out_dir=str(tmp_path / "out"))
    why = next((w for w in (_absent(p.config) for p in s.points) if w), None)
    if why:
        pytest.skip(why)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    _exe(bin_ / "sbatch", f'#!/bin/sh\necho "$@" >> {tmp_path}/sbatch.args\necho 4242\n')
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the interpreter check imports mpifl from the workdir
    monkeypatch.chdir(REPO)
    # the output folder is under this machine's /tmp, which only a one-node cluster may use
    rc = sw.main([str(path), "--out-dir", str(tmp_path / "out"), "--allow-local-paths", "--submit"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "submitted array job 4242" in out
    calls = (tmp_path / "sbatch.args").read_text().splitlines()
    submitted: set[int] = set()
    for call in calls:
        args = call.split()
        assert args[-1].endswith(".sbatch") and Path(args[-1]).is_file()
        submitted |= _indices(re.search(r"--array=(\S+)", call).group(1))
    assert submitted == set(range(len(s.points)))
