"""End to end: mnist1d and digits through ``python -m mpifl.main`` with every
partition; bad data inputs exit 2 with one line; ``python -m mpifl.data``."""

from __future__ import annotations

import subprocess
import sys

import h5py
import numpy as np
import pytest
from helpers import REPO

from mpifl import main as entry
from mpifl.data.partition import PARTITIONS

ROOT = REPO
TINY = ["run.rounds=2", "run.threads=1", "data.n_clients=6", "data.n_clusters=2", "data.min_client_size=5",
        "train.batch_size=64", "model.hidden=[16]"]
SIZE = {"mnist1d": ["data.n_samples=600"], "digits": ["data.subsample=0.4"]}


@pytest.mark.parametrize("partition", sorted(PARTITIONS))
@pytest.mark.parametrize("dataset", ["mnist1d", "digits"])
def test_main_runs_every_partition(tmp_path, dataset, partition):
    algo = "fedavg" if partition in ("iid", "patho", "dirichlet") else "oracle"
    args = [*TINY, *SIZE[dataset], f"data.name={dataset}", f"data.partition={partition}",
            f"algorithm.name={algo}", f"run.out_dir={tmp_path}", "run.name=e2e"]
    assert entry.main(args) == 0
    with h5py.File(tmp_path / "e2e" / "run.h5", "r") as f:
        acc = f["metrics/test_acc"][...]
        cluster = f["clients/cluster"][...]
        hist = f["clients/label_hist"][...]
    assert acc.shape == (2, 6) and np.isfinite(acc).all()
    assert (cluster >= 0).all() if algo == "oracle" else (cluster == -1).all()
    assert hist.sum() > 0


def run_cli(*args: str, module: str = "mpifl.main") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


# user errors of a run, through a real `python -m mpifl.main` process each
BAD_CLI = {
    "unknown dataset": (["data.name=imagenet"], "data.name='imagenet' is not allowed"),
    "more clusters than labels": (["data.name=digits", "data.n_clusters=11", "data.n_clients=12"],
                                  "at most 10 clusters"),
    "missing root": (["data.name=cifar10", "data.root=/nonexistent/data"],
                     "'/nonexistent/data/cifar-10-batches-py'"),
}
# more of the same, through main() in this process (same code path, no interpreter start-up)
BAD = {
    "patho with more classes than labels": (["data.name=digits", "data.partition=patho",
                                             "data.classes_per_client=12"], "data.classes_per_client=12"),
    "no root": (["data.name=mnist"], "set data.root"),
    "empty root": (["data.name=digit5", "data.root={tmp}"], "digit5"),
    "image model on vectors": (["data.name=mnist1d", "model.name=lenet"], "needs image inputs"),
    "image too small": (["data.name=digits", "model.name=lenet"], "does not fit images of shape (1, 8, 8)"),
    "test set of a dataset without one": (["data.name=digits", "data.test_source=test_set"], "no test set"),
    "oracle without clusters": (["data.partition=dirichlet", "algorithm.name=oracle"], "oracle needs true clusters"),
    "dirichlet minimum unreachable": (["data.name=digits", "data.partition=dirichlet", "data.n_clients=100",
                                       "data.min_client_size=100"], "data.min_client_size=100"),
    "bad alpha": (["data.dirichlet_alpha=0"], "data.dirichlet_alpha=0.0"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD_CLI))
def test_bad_data_inputs_exit_2_with_one_line(tmp_path, case):
    args, expect = BAD_CLI[case]
    p = run_cli(*args, "run.threads=1", f"run.out_dir={tmp_path}", "run.rounds=1")
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mpifl: error:") and expect in lines[0], p.stderr


@pytest.mark.parametrize("case", sorted(BAD))
def test_more_bad_data_inputs(tmp_path, capsys, case):
    args, expect = BAD[case]
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert entry.main([*args, "run.threads=1", f"run.out_dir={tmp_path}", "run.rounds=1"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mpifl: error:") and expect in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_data_summary_cli(tmp_path, capsys):
    from mpifl.data.__main__ import main as data_main  # python -m mpifl.data, in this process

    png = tmp_path / "part.png"
    assert data_main(["data.name=digits", "data.partition=clusters", "data.n_clients=4", "data.n_clusters=2",
                      "--png", str(png)]) == 0
    out = capsys.readouterr().out
    rows = [t for t in (line.split() for line in out.splitlines()) if len(t) > 1 and t[0].isdigit()
            and t[1].isdigit()]
    assert [int(r[0]) for r in rows] == [0, 1, 2, 3]
    assert [int(r[4]) for r in rows] == [0, 1, 0, 1]  # true clusters
    hist = np.array([[int(v) for v in r[5:]] for r in rows])
    assert hist.shape == (4, 10) and (hist.sum(1) == [int(r[1]) for r in rows]).all()
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    assert data_main(["data.name=digits", "data.n_clusters=11", "data.n_clients=12"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
