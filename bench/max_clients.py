"""How many clients one FedAvg run holds on this machine: peak memory and time
per round for growing N (one rank, MLP on synthetic data, every client trains
every round).

    python bench/max_clients.py                         # N = 1000, 10000, 30000
    python bench/max_clients.py --clients 10000 50000 --samples 50 --rounds 3
    python bench/max_clients.py --clients 1000 --data digits --algorithms fedavg fedem fedem.components=4

``--algorithms`` runs each N once per algorithm (the first is the baseline of
the ratio column); ``section.key=value`` words among them are passed to every
run. ``--data digits`` uses scikit-learn's digits (1,797 samples in all,
however many clients) instead of ``--samples`` synthetic samples per client.

Each N is a separate ``python -m mpifl.main`` process; its peak resident memory
comes from ``os.wait4`` (the kernel's ru_maxrss for that process), its time per
round from the run's own log (``/rounds/wall_s``, training + evaluation + comm).
An N is skipped when a linear extrapolation of the previous peaks exceeds 60% of
the memory available now, so the script never drives a shared machine into swap.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, REPO)
from mpifl.logging.h5 import open_run  # noqa: E402 - after the sys.path line


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def run(n: int, a, out: str, algo: str = "fedavg", extra: list[str] = ()) -> tuple[int, float, float, int]:
    """(peak RSS bytes, median s/round, wall s of the process, n_params) of one run."""
    data = (["data.name=digits"] if a.data == "digits" else
            ["data.name=synthetic", f"data.n_samples={a.samples * n}", f"data.synthetic_dim={a.dim}"])
    args = [sys.executable, "-m", "mpifl.main", *data, f"data.n_clients={n}", "data.partition=iid",
            f"model.hidden={a.hidden}", f"algorithm.name={algo}", f"run.rounds={a.rounds}", "run.threads=1",
            f"run.out_dir={out}", f"run.name=n{n}-{algo}", f"run.eval_every={a.rounds}", *extra]
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    text = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise RuntimeError(f"N={n} failed:\n{text[-2000:]}")
    r = open_run(os.path.join(out, f"n{n}-{algo}"))
    return usage.ru_maxrss * 1024, float(np.median(r.get("rounds/wall_s"))), wall, int(r.attrs["n_params"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", nargs="+", type=int, default=[1000, 10000, 30000])
    ap.add_argument("--samples", type=int, default=50, help="samples per client (60%% train)")
    ap.add_argument("--dim", type=int, default=20)
    ap.add_argument("--hidden", default="[128,128]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data", choices=["synthetic", "digits"], default="synthetic")
    ap.add_argument("--algorithms", nargs="+", default=["fedavg"],
                    help="algorithm names, and section.key=value overrides for every run")
    a = ap.parse_args()
    algos = [w for w in a.algorithms if "=" not in w]
    extra = [w for w in a.algorithms if "=" in w]
    out = tempfile.mkdtemp(prefix="mpifl-maxclients-")
    what = "digits" if a.data == "digits" else f"synthetic dim {a.dim}, {a.samples} samples/client"
    print(f"# load average {os.getloadavg()[0]:.2f}, MemAvailable {available_bytes() / 2**30:.1f} GiB, "
          f"{what}, MLP {a.hidden}, {a.rounds} rounds (evaluation in the last) {' '.join(extra)}")
    print(f"| N | algorithm | parameters/client | peak RSS | peak RSS / client | x {algos[0]} | s/round (median) "
          "| process wall s |")
    print("|---|---|---|---|---|---|---|---|")
    seen: list[tuple[int, int]] = []
    for n in a.clients:
        if len(seen) >= 1:
            (n0, m0), (n1, m1) = (seen[0], seen[-1]) if len(seen) > 1 else ((0, 0), seen[-1])
            est = m1 + (m1 - m0) / max(1, n1 - n0) * (n - n1)
            if est > 0.6 * available_bytes():
                print(f"| {n} | | | skipped: about {est / 2**30:.1f} GiB expected, "
                      f"{available_bytes() / 2**30:.1f} GiB available | | | | |", flush=True)
                continue
        base = None
        for algo in algos:
            peak, per_round, wall, P = run(n, a, out, algo, extra)
            base = base or peak
            if algo == algos[0]:
                seen.append((n, peak))
            print(f"| {n} | {algo} | {P:,} | {peak / 2**30:.2f} GiB | {peak / n / 2**10:.0f} KiB | "
                  f"{peak / base:.2f} | {per_round:.2f} | {wall:.0f} |", flush=True)


if __name__ == "__main__":
    main()
