"""Time ``mpifl.results.load_sweep`` on a sweep directory of synthetic logs.

    python bench/load_sweep.py                       # 100 runs, 20 clients, 30 rounds
    python bench/load_sweep.py --runs 400 --clients 100 --rounds 100

Writes ``--runs`` logs shaped like the quickstart's (per-client metrics and
traffic every round, the dense [N, N] mixing matrix, true clusters) through
``mpifl.logging.h5.Writer`` into a temporary sweep directory with its
``sweep.yaml`` (a grid over algorithm.name and run.seed), then loads it
``--repeat`` times and prints the wall time of each load (the first one reads
from a cold page cache only if the files were dropped from it meanwhile).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from mpifl import config  # noqa: E402
from mpifl.logging.h5 import Writer  # noqa: E402
from mpifl.logging.mixing import Dense  # noqa: E402
from mpifl.results import load_sweep  # noqa: E402

ALGOS = ("local", "fedavg", "oracle", "dpfl")


def write_sweep(root: Path, runs: int, clients: int, rounds: int) -> None:
    rng = np.random.default_rng(0)
    cluster = np.arange(clients) % 4
    same = (cluster[:, None] == cluster[None, :]).astype(np.float32)
    mixing = same / same.sum(1, keepdims=True)
    points = []
    for i in range(runs):
        algo, seed = ALGOS[i % len(ALGOS)], i // len(ALGOS)
        name = f"{i:03d}_algorithm-{algo}_seed-{seed}"
        cfg = config.from_dict({"run": {"name": name, "out_dir": str(root / "runs"), "rounds": rounds,
                                        "seed": seed}, "data": {"n_clients": clients}, "algorithm": {"name": algo}})
        rd = root / "runs" / name
        rd.mkdir(parents=True)
        (rd / "config.yaml").write_text(cfg.to_yaml())
        w = Writer(rd / "run.h5", {"algorithm": algo, "seed": seed, "n_clients": clients,
                                   "config_yaml": cfg.to_yaml()},
                   {"cluster": cluster, "rank": np.arange(clients) * 2 // clients,
                    "n_test": rng.integers(10, 50, clients), "label_hist": rng.integers(0, 9, (clients, 10))},
                   clients, flush_s=3600)
        for t in range(rounds):
            acc = np.clip(0.5 + 0.01 * t + 0.05 * rng.standard_normal(clients), 0, 1)
            w.write_round(t, {"wall_s": 0.1, "comm_s": 0.01, "compute_s": 0.09},
                          {"metrics/train_loss": rng.random(clients), "metrics/val_loss": rng.random(clients),
                           "metrics/val_acc": acc, "metrics/test_loss": rng.random(clients),
                           "metrics/test_acc": acc, "metrics/skipped": np.zeros(clients, np.int64),
                           "comm/bytes_sent": np.full(clients, 1e5), "comm/bytes_recv": np.full(clients, 1e5),
                           "comm/models_recv": np.ones(clients, np.int64)}, mixing=Dense(mixing))
        w.close()
        points.append({"name": name, "values": {"algorithm.name": algo, "run.seed": seed}})
    (root / "sweep.yaml").write_text(yaml.safe_dump({"name": root.name, "points": points}, sort_keys=False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "bench-sweep"
        t0 = time.perf_counter()
        write_sweep(root, a.runs, a.clients, a.rounds)
        print(f"wrote {a.runs} logs ({a.clients} clients, {a.rounds} rounds) in {time.perf_counter() - t0:.1f}s")
        for i in range(a.repeat):
            t0 = time.perf_counter()
            df = load_sweep(root)
            dt = time.perf_counter() - t0
            assert len(df) == a.runs, len(df)
            print(f"load_sweep {i + 1}/{a.repeat}: {dt:.2f}s for {len(df)} runs, {df.shape[1]} columns")


if __name__ == "__main__":
    main()
