"""mpifl.results: run logs as pandas DataFrames (hand-written logs, this process)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from mpifl import config, results
from mpifl.logging.h5 import Writer
from mpifl.results import open_run

pd = pytest.importorskip("pandas")

N, R = 4, 3
CLUSTER = np.array([1, 0, 1, 0])


def _log(rd: Path, algo: str, seed: int, lr: float = 0.05, rounds: int = R, done: int = R,
         every: int = 1) -> np.ndarray:
    """A log of ``done`` of ``rounds`` rounds; round t evaluated when (t + 1) % every == 0;
    returns test_acc [done, N] as written."""
    cfg = config.from_dict({"run": {"name": rd.name, "out_dir": str(rd.parent), "rounds": rounds, "seed": seed},
                            "data": {"n_clients": N}, "train": {"lr": lr}, "algorithm": {"name": algo}})
    rd.mkdir(parents=True)
    (rd / "config.yaml").write_text(cfg.to_yaml())
    w = Writer(rd / "run.h5", {"algorithm": algo, "seed": seed, "n_clients": N, "config_yaml": cfg.to_yaml()},
               {"cluster": CLUSTER, "rank": np.array([0, 0, 1, 1]), "n_test": np.array([10, 10, 20, 20])}, N)
    acc = np.array([[0.1 * (t + 1) + 0.01 * c + 0.1 * seed for c in range(N)] for t in range(done)])
    for t in range(done):
        ev = (t + 1) % every == 0
        test = acc[t] if ev else np.full(N, np.nan)
        w.write_round(t, {"wall_s": 1.0}, {"metrics/test_acc": test, "metrics/val_acc": test,
                                           "comm/bytes_sent": np.full(N, 100.0 * t)})
    w.close()
    return acc


def test_frame_is_long_with_rounds_from_one_and_the_client_placement(tmp_path):
    acc = _log(tmp_path / "a", "fedavg", 0)
    run = open_run(tmp_path / "a")
    df = run.frame("test_acc")
    assert list(df.columns) == ["round", "client", "cluster", "rank", "value"]
    assert len(df) == R * N and sorted(df["round"].unique()) == [1, 2, 3]
    row = df[(df["round"] == 2) & (df["client"] == 3)].iloc[0]
    assert row["value"] == pytest.approx(acc[1, 3]) and row["cluster"] == 0 and row["rank"] == 1
    traffic = run.frame("comm/bytes_sent")
    assert traffic.loc[traffic["round"] == 3, "value"].tolist() == [200.0] * N
    with pytest.raises(KeyError, match="metrics/nope"):
        run.frame("nope")
    with pytest.raises(ValueError, match="clients/cluster"):
        run.frame("clients/cluster")


def test_frame_leaves_out_rounds_without_evaluation_unless_asked(tmp_path):
    _log(tmp_path / "a", "fedavg", 0, rounds=4, done=4, every=2)
    run = open_run(tmp_path / "a")
    assert sorted(run.frame("test_acc")["round"].unique()) == [2, 4]
    assert len(run.frame("test_acc", dropna=False)) == 4 * N


def test_summary_is_a_series_in_percent_with_the_final_round_from_one(tmp_path):
    acc = _log(tmp_path / "a", "fedavg", 1, rounds=5, done=3)
    s = open_run(tmp_path / "a").summary()
    assert s["final_acc_pct"] == pytest.approx(100 * acc[-1].mean())
    assert s["final_acc_w_pct"] == pytest.approx(100 * (acc[-1] * [1, 1, 2, 2]).sum() / 6)
    assert s["final_round"] == 3 and s["rounds_done"] == 3 and s["rounds_planned"] == 5 and not s["complete"]
    assert s["seed"] == 1


def _sweep(root: Path) -> dict[str, np.ndarray]:
    """A sweep directory: algorithm.name [~ (fedavg), local] x run.seed [0, 1]."""
    points, accs = [], {}
    for i, (algo, value, seed) in enumerate([("fedavg", None, 0), ("fedavg", None, 1), ("local", "local", 0),
                                             ("local", "local", 1)]):
        name = f"{i:03d}_algorithm-{value or 'base'}_seed-{seed}"
        accs[name] = _log(root / "runs" / name, algo, seed)
        points.append({"name": name, "values": {"algorithm.name": value, "run.seed": seed}})
    (root / "sweep.yaml").write_text(yaml.safe_dump({"name": root.name, "points": points}))
    return accs


def test_load_sweep_has_a_column_per_swept_key_with_the_values_runs_used(tmp_path):
    accs = _sweep(tmp_path / "sw")
    df = results.load_sweep(tmp_path / "sw")
    assert list(df.columns[:3]) == ["algorithm.name", "run.seed", "name"]
    assert len(df) == 4 and sorted(df["algorithm.name"]) == ["fedavg", "fedavg", "local", "local"]  # ~ resolved
    for _, row in df.iterrows():
        assert row["final_acc_pct"] == pytest.approx(100 * accs[row["name"]][-1].mean())
        assert row["complete"] and row["final_round"] == R
    means = df.groupby("algorithm.name")["final_acc_pct"].mean()
    assert means["fedavg"] == pytest.approx(100 * np.mean([accs[n][-1].mean() for n in accs if "base" in n]))
    assert "ari_graph.mixing" not in df.columns  # no mixing matrix logged, no ARI source


def test_load_sweep_of_a_plain_folder_uses_the_keys_that_differ(tmp_path):
    _log(tmp_path / "x" / "a", "fedavg", 0, lr=0.1)
    _log(tmp_path / "x" / "b", "fedavg", 1, lr=0.2)
    df = results.load_sweep(tmp_path / "x")
    assert list(df.columns[:2]) == ["algorithm.name", "train.lr"]
    assert sorted(df["train.lr"]) == [0.1, 0.2]


def test_without_pandas_one_line_says_how_to_install_it(tmp_path, monkeypatch):
    _log(tmp_path / "a", "fedavg", 0)
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError
    for call in (lambda: results.load_sweep(tmp_path), lambda: open_run(tmp_path / "a").frame("test_acc")):
        with pytest.raises(ImportError) as e:
            call()
        assert "\n" not in str(e.value) and "pip install -e '.[analysis]'" in str(e.value)
