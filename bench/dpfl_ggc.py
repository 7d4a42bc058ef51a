"""DPFL's graph rounds apart from its training: per round, the time in local
training, the rest of the round (BGGC in round 0, GGC after: the reward pairs,
their running sums, the pulls and the averaging) and the reward pairs scored,
beside a FedAvg round on the same clients. A measurement for Performance V
(bench/README.md), not a test.

    python bench/dpfl_ggc.py --clients 100 --samples 400 --rounds 4
    python bench/dpfl_ggc.py --clients 100 400 1000 --samples 40 --rounds 3

Setting: the room (jobs/room-fashionmnist.yaml: real Fashion-MNIST, 4 groups of
permuted labels, MLP 784-64-10, Adam, batch 20) at ``--samples`` training samples a
client, DPFL at one local epoch a round (``dpfl.tau_init 1``, ``tau_train 1``), its
budget ``--budget`` (inf: every other client a candidate in round 0), 1 rank, 1
thread. Pairs: GGC's decisions each score two models, X + j and Y - j, on the
client's validation split; round 0 considers all N - 1 others, a later round the
client's candidates Omega_k, and each run scores one pair more to start. So a round
costs O(N |Omega_k|) pair scorings per rank, O(N^2) in round 0 (and later ones with
B_c = inf, where Omega_k grows with the group).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from mpifl import config, models
from mpifl.algorithms import dpfl, fedavg
from mpifl.algorithms.base import Context
from mpifl.comm import Comm, solo
from mpifl.data import build
from mpifl.train import Clients
from mpifl.train.plan import SPLIT_INDEX


def context(n: int, samples: int, budget: str, seed: int = 0) -> Context:
    cfg = config.load("jobs/room-fashionmnist.yaml", [
        f"data.n_clients={n}", f"data.train_per_client={samples}", "algorithm.name=dpfl", "dpfl.tau_init=1",
        "dpfl.tau_train=1", f"dpfl.budget={budget}", "run.threads=1", f"run.seed={seed}"])
    comm = Comm(n, solo())
    data = build(cfg.data, seed, comm.local_ids)
    model = models.build(cfg.model, data.in_shape, data.n_classes, seed)
    return Context(cfg, comm, Clients(model, data, cfg.train, torch.device("cpu"), seed), data)


def timed_train(ctx: Context) -> list[float]:
    """Wrap the clients' ``train`` to add up its seconds (the list's one entry)."""
    spent = [0.0]
    train = ctx.clients.train

    def wrapper(*a, **k):
        t0 = time.perf_counter()
        out = train(*a, **k)
        spent[0] += time.perf_counter() - t0
        return out

    ctx.clients.train = wrapper
    return spent


def pairs_scored(n: int, t: int, omega: np.ndarray | None, budget: float) -> int:
    """Reward pairs one round scores over all clients: a start pair per run and one per considered candidate."""
    if t == 0:
        return n * (1 + int(min(n - 1, budget)))
    return int(sum(1 + min(int(k), budget) for k in omega.sum(1) if k))


def measure(n: int, samples: int, budget: str, rounds: int) -> None:
    ctx = context(n, samples, budget)
    spent = timed_train(ctx)
    state = dpfl.init(ctx)
    n_val = round(float(ctx.data.sizes[:, SPLIT_INDEX["val"]].mean()))
    omega = None
    for t in range(rounds):
        spent[0] = 0.0
        ctx.comm.reset_counters()
        t0 = time.perf_counter()
        out = dpfl.round(ctx, state, t)
        wall = time.perf_counter() - t0
        pairs = pairs_scored(n, t, omega, state.budget)
        omega = out.extras["candidates"]
        print(f"| {n} | {samples} | {n_val} | dpfl | {t} | {wall:.2f} | {spent[0]:.2f} | {wall - spent[0]:.2f} | "
              f"{pairs:,} | {1e6 * (wall - spent[0]) / max(pairs, 1):.0f} |", flush=True)
    ref = context(n, samples, budget)
    spent = timed_train(ref)
    fstate = fedavg.init(ref)
    for t in range(min(rounds, 3)):
        spent[0] = 0.0
        t0 = time.perf_counter()
        fedavg.round(ref, fstate, t)
        wall = time.perf_counter() - t0
        print(f"| {n} | {samples} | {n_val} | fedavg | {t} | {wall:.2f} | {spent[0]:.2f} | {wall - spent[0]:.2f} | "
              "- | - |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[100])
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--budget", default="inf")
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    torch.set_num_threads(1)
    print("| N | samples | val a client | method | round | s | training s | rest s | pairs | rest us a pair |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in a.clients:
        measure(n, a.samples, a.budget, a.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
