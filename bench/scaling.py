"""Strong scaling of one CPU-bound FedAvg job: 1 rank (torch using both cores)
against 2 ranks (one thread each), same config, same results.

    python bench/scaling.py                      # 256 clients, MLP, 5 rounds
    python bench/scaling.py --clients 512 --rounds 8
    python bench/scaling.py --clients 64 train.batched=off                 # overrides for the built-in job
    python bench/scaling.py --job jobs/federico-digits.yaml run.rounds=100   # any jobs file + overrides

It runs, as a user would:

    python -m mpifl.main <job> run.threads=2                   # 1 rank, 2 threads
    mpiexec -n 2 python -m mpifl.main <job> run.threads=1      # 2 ranks, 1 thread each
    python -m mpifl.main <job> run.threads=1                   # reference: 1 rank, 1 thread

and compares the summed round times of the logs (``/rounds/wall_s``: training,
evaluation and communication, not process start-up or data generation).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, REPO)
from mpifl.logging.h5 import open_run  # noqa: E402 - after the sys.path line


def job(a, out: str, name: str) -> list[str]:
    if a.job:  # a jobs file as users run it, with the given overrides
        return [a.job, *a.overrides, f"run.out_dir={out}", f"run.name={name}"]
    return ["data.name=synthetic", f"data.n_clients={a.clients}", f"data.n_samples={a.samples * a.clients}",
            "data.partition=iid", "data.synthetic_dim=64", f"model.hidden={a.hidden}", "algorithm.name=fedavg",
            f"train.local_epochs={a.epochs}", f"run.rounds={a.rounds}", f"run.out_dir={out}", f"run.name={name}",
            *a.overrides]


def launch(ranks: int, threads: int, a, out: str) -> tuple[float, float]:
    name = f"r{ranks}t{threads}"
    cmd = [sys.executable, "-m", "mpifl.main", *job(a, out, name), f"run.threads={threads}"]
    if ranks > 1:
        cmd = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", str(ranks), *cmd]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if res.returncode:
        raise RuntimeError(res.stdout + res.stderr)
    r = open_run(os.path.join(out, name))
    return float(np.sum(r.get("rounds/wall_s"))), float(np.nanmean(r.metric("test_acc")[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=256)
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--hidden", default="[256,256]")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--job", help="a jobs file to run instead of the built-in FedAvg MLP job")
    ap.add_argument("overrides", nargs="*", help="section.key=value for --job or the built-in job")
    a = ap.parse_args()
    out = tempfile.mkdtemp(prefix="mpifl-scaling-")
    what = (f"{a.job} {' '.join(a.overrides)}" if a.job else
            f"{a.clients} clients, MLP {a.hidden}, {a.epochs} local epochs, {a.rounds} rounds {' '.join(a.overrides)}")
    print(f"# load average {os.getloadavg()[0]:.2f}, {what}, best of {a.repeats}")
    res = {}
    for _ in range(a.repeats):  # interleaved, so load drift hits all three alike
        for ranks, threads in ((1, 2), (2, 1), (1, 1)):
            t, acc = launch(ranks, threads, a, out)
            if (ranks, threads) not in res or t < res[ranks, threads][0]:
                res[ranks, threads] = (t, acc)
    base = res[1, 2][0]
    print("| ranks x threads | round time summed (s) | speed-up over 1 rank x 2 threads | final test acc |")
    print("|---|---|---|---|")
    for (ranks, threads), (t, acc) in res.items():
        print(f"| {ranks} x {threads} | {t:.2f} | {base / t:.2f}x | {acc:.4f} |")
    print(f"# load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
