"""DPFL under MPI: BGGC driven through ``pull`` gives GGC's sets and never hands
a client more than B_c models in one batch (byte counters); a full run keeps
every round within the budget and matches a one-rank run.

Bits: the exact comparisons are of counters and of the candidate and collaborator
sets (booleans) of a run on every rank and the same run on rank 0 alone, in one job
on one CPU with one thread (``run.threads=1``): both runs decide on the same CPU,
whichever kind it is. Accuracies are compared within a tolerance."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from serial_ref import ggc

from mpifl import config
from mpifl.algorithms.dpfl import BGGC, drive
from mpifl.comm import F32, Comm
from mpifl.logging.h5 import open_run
from mpifl.rng import rng
from mpifl.run import runtime

N, P = 11, 6  # 11 clients: uneven blocks on 2 and 4 ranks


def reward_for(k: int):
    """A random non-monotone reward per client, the same on every rank."""
    g = np.random.default_rng([k, 5])
    w1, w2 = torch.as_tensor(g.normal(0, 1.5, (8, P))), torch.as_tensor(g.normal(0, 1, (3, 8)))
    c = torch.as_tensor(g.normal(0, 1, 3))
    return lambda m: (-((torch.tanh(m.double() @ w1.T) @ w2.T - c) ** 2).sum(1)).numpy()


@pytest.mark.parametrize("budget", [1, 2, 3, math.inf])
def test_bggc_over_pull(mpi, budget):
    comm = Comm(N, mpi)
    everyone = torch.as_tensor(np.random.default_rng(3).normal(0, 1, (N, P)), dtype=torch.float32)
    p = np.random.default_rng(4).dirichlet(np.ones(N))
    rows = everyone[comm.local_ids].clone()
    runs = {i: BGGC(int(k), np.delete(np.arange(N), k), rows[i], p, reward_for(int(k)), budget,
                    rng(budget if math.isfinite(budget) else 99, 0, int(k), "bggc"))
            for i, k in enumerate(comm.local_ids)}
    comm.reset_counters()
    most = drive(comm, rows, runs)
    assert (most <= budget).all() and most.max() == min(budget, N - 1)
    got = np.array([runs[i].received for i in range(comm.n_local)])
    np.testing.assert_array_equal(comm.models_recv, got)  # the counters saw every batch
    np.testing.assert_array_equal(comm.bytes_recv, got * P * F32)
    assert (got >= N - 1).all()  # phase 1 saw everyone
    models = {j: everyone[j] for j in range(N)}
    for i, k in enumerate(comm.local_ids):
        ref = ggc(int(k), np.delete(np.arange(N), k), models, p, reward_for(int(k)), budget,
                  rng(budget if math.isfinite(budget) else 99, 0, int(k), "bggc"))
        assert runs[i].result.members == ref.members
        assert len(ref.members) <= budget


def _cfg(out, name, budget):
    return config.from_dict({
        "run": {"name": name, "out_dir": str(out), "rounds": 4, "threads": 1},
        "data": {"name": "synthetic", "partition": "patho", "n_clients": N, "n_samples": 1100},
        "algorithm": {"name": "dpfl"},
        "dpfl": {"budget": budget, "tau_init": 2, "tau_train": 1},
    }, n_ranks=1)


@pytest.mark.parametrize("budget", ["2", "0.3N"])
def test_run_keeps_budget_and_matches_one_rank(mpi, shared_tmp, budget):
    cfg = _cfg(shared_tmp, "many", budget)
    runtime.run(cfg, mpi)
    sub = mpi.Split(mpi.Get_rank(), 0)  # every rank alone; rank 0 runs the reference
    if mpi.Get_rank() == 0:
        runtime.run(_cfg(shared_tmp, "one", budget), sub)
    sub.Free()
    mpi.Barrier()
    if mpi.Get_rank() != 0:
        return
    B = cfg.dpfl.budget_for(N)
    r, one = open_run(shared_tmp / "many"), open_run(shared_tmp / "one")
    assert r.attrs["n_ranks"] == mpi.Get_size()
    cand, coll = r.get("dpfl/candidates"), r.get("dpfl/collaborators")
    assert (cand.sum(2) <= B).all() and not (coll & ~cand).any()
    assert (r.get("dpfl/max_batch_models") <= B).all()
    assert (r.get("comm/models_recv")[1:] <= B).all()
    np.testing.assert_array_equal(r.get("comm/models_recv"), one.get("comm/models_recv"))
    np.testing.assert_array_equal(cand, one.get("dpfl/candidates"))
    np.testing.assert_array_equal(coll, one.get("dpfl/collaborators"))
    np.testing.assert_allclose(r.metric("test_acc"), one.metric("test_acc"), atol=1e-6)
