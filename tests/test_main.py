"""End to end through ``python -m mpifl.main`` under mpiexec, as users launch it.

Bits: the exact comparisons are of the partition, the sampled clients (the mixing
rows' support) and the placement (integers, booleans); accuracies across rank counts
are compared within 0.5 points."""

import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
from helpers import MPIEXEC, REPO, launch

from mpifl.logging.h5 import open_run

pytestmark = pytest.mark.slow  # every test launches mpiexec

SMALL = ["data.name=mnist1d", "data.n_samples=2000", "data.n_clients=8", "data.n_clusters=2",
         "model.hidden=[32]", "run.threads=1"]


def test_same_results_for_1_2_4_ranks(tmp_path):
    args = [*SMALL, "algorithm.name=fedavg", "algorithm.fraction=0.5", "run.rounds=6", f"run.out_dir={tmp_path}"]
    runs = {}
    for n in (1, 2, 4):
        res = launch([*args, f"run.name=n{n}"], n=n)
        assert res.returncode == 0, res.stderr
        runs[n] = open_run(tmp_path / f"n{n}")
    ref = runs[1]
    assert ref.n_rounds == 6
    for n in (2, 4):
        r = runs[n]
        assert r.attrs["n_ranks"] == n
        for key in ("clients/cluster", "clients/n_train", "clients/n_val", "clients/n_test", "clients/label_hist"):
            assert np.array_equal(r.get(key), ref.get(key)), key  # identical partition
        for t in range(6):  # identical sampled clients: the mixing rows' support
            assert np.array_equal(r.mixing(t) > 0, ref.mixing(t) > 0)
        final = np.nanmean(r.metric("test_acc")[-1])
        assert abs(final - np.nanmean(ref.metric("test_acc")[-1])) <= 0.005
        assert not np.array_equal(r.get("clients/rank"), ref.get("clients/rank"))


def test_log_readable_during_and_after_run(tmp_path):
    args = [*SMALL, "data.name=synthetic", "data.n_samples=400", "algorithm.name=local", "run.rounds=400",
            "run.eval_every=50", f"run.out_dir={tmp_path}", "run.name=live"]
    proc = subprocess.Popen([str(MPIEXEC), "-n", "2", sys.executable, "-m", "mpifl.main", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "live" / "run.h5"
    seen_mid = None
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if log.exists():
                try:
                    n = open_run(log).n_rounds
                    if n >= 1:
                        with h5py.File(log, "r", locking=False) as f:
                            width = f["metrics/train_loss"].shape[1]
                except (OSError, KeyError):  # caught the writer mid-round; try again
                    n = 0
                if n >= 1:
                    assert width == 8
                    seen_mid = n
                    break
            time.sleep(0.05)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert seen_mid is not None and seen_mid < 400, "the log was not readable while the run went on"
    run = open_run(log)
    assert run.n_rounds == 400
    keys = set(run.keys())
    for k in ("clients/cluster", "clients/rank", "clients/node", "clients/n_train", "clients/n_val", "clients/n_test",
              "clients/label_hist", "rounds/round", "rounds/wall_s", "rounds/comm_s", "rounds/compute_s",
              "metrics/train_loss", "metrics/val_loss", "metrics/val_acc", "metrics/test_loss",
              "metrics/test_acc", "comm/bytes_sent", "comm/bytes_recv", "comm/models_recv", "graph/mixing"):
        assert k in keys, k
    assert run.get("graph/mixing").shape == (400, 8, 8)
    assert np.allclose(run.mixing(3), np.eye(8))
    a = run.attrs
    for k in ("mpifl_version", "algorithm", "seed", "n_clients", "n_ranks", "config_yaml", "versions",
              "hostname", "started_at"):
        assert k in a, k
    assert run.config["run"]["rounds"] == 400
    assert (tmp_path / "live" / "config.yaml").read_text() == a["config_yaml"]
    assert "done: 400 rounds" in out
