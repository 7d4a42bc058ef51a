"""pFedLIA under MPI: the ring's all-pairs influence equals a serial double loop,
the ring verb's accounting, and a run's clusters do not depend on the ranks.

    mpiexec -n 3 python -m mpi4py -m pytest -x -q tests/mpi/algorithms/test_pfedlia_mpi.py

Bits: the exact comparisons are of a visited block's first column (client ids stored
as floats: copies), of traffic counters, and of the clusters and collaborator sets
(integers, booleans) of a run on every rank and the same run on rank 0 alone, in one
job on one CPU. Influences are compared within tolerances.
"""

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import DEVICE
from torch.func import functional_call

from mpifl import models
from mpifl.algorithms import pfedlia
from mpifl.algorithms.base import Context
from mpifl.comm import F32, Comm
from mpifl.config import from_dict
from mpifl.data import build as build_data
from mpifl.rng import torch_gen
from mpifl.run.runtime import run
from mpifl.train import Clients

N = 7  # under -n 3 the blocks are 2, 2, 3


def _context(cfg, mpi_comm) -> Context:
    comm = Comm(cfg.data.n_clients, mpi_comm)
    data = build_data(cfg.data, cfg.run.seed, comm.local_ids)
    model = models.build(cfg.model, data.in_shape, data.n_classes, cfg.run.seed)
    return Context(cfg, comm, Clients(model, data, cfg.train, DEVICE, cfg.run.seed), data)


def _cfg(**pf):
    return from_dict({
        "run": {"seed": 3, "rounds": 6, "threads": 1},
        "data": {"name": "synthetic", "partition": "clusters", "n_clients": N, "n_clusters": 3, "n_samples": 700},
        "model": {"hidden": [16]},
        "algorithm": {"name": "pfedlia"},
        "pfedlia": {"warmup_rounds": 2, "fraction": 0.5, "lia_epochs": 3, "lia_batch": 16, **pf},
    })


def _hats(ctx: Context, theta0: torch.Tensor) -> torch.Tensor:
    """A distinct model per client, drawn from the client's own stream."""
    return torch.stack([theta0 + 0.3 * torch.randn(theta0.shape, generator=torch_gen(0, 0, int(i), "hat"))
                        .to(theta0.device) for i in ctx.comm.local_ids])


def test_ring_influence_equals_serial_all_pairs(mpi):
    cfg = _cfg()
    ctx = _context(cfg, mpi)
    theta0 = ctx.clients.init.clone()
    got = ctx.comm.gather_rows(pfedlia.influence(ctx, theta0, _hats(ctx, theta0)))

    # reference: one process hosting every client, a plain double loop over (i, j)
    solo = mpi.Split(mpi.Get_rank())
    ref_ctx = _context(cfg, solo)
    c = ref_ctx.clients
    hats = _hats(ref_ctx, theta0)

    def val_loss_sum(flat, i):
        lo, hi = c.split_range(i, "val")
        out = functional_call(c.model, c.layout.unflatten(flat), (c.x[lo:hi],))
        return F.cross_entropy(out, c.y[lo:hi], reduction="sum").item()

    ref = np.array([[val_loss_sum(theta0, i) - val_loss_sum(hats[j], i) for j in range(N)] for i in range(N)])
    solo.Free()
    if mpi.Get_rank() == 0:
        assert got.shape == (N, N)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)
        # the models differ, so a wrong pairing of rows and ids cannot pass
        assert np.abs(ref - ref[:, :1]).max() > 1e-2


@pytest.mark.parametrize("as_models", [True, False])
def test_ring_visits_every_block_once_and_counts_n_minus_1(mpi, as_models):
    comm = Comm(N, mpi)
    P = 5
    rows = torch.arange(comm.first, comm.first + comm.n_local, dtype=torch.float32)[:, None].repeat(1, P)
    seen = []

    def visit(ids, block):
        assert block.shape == (len(ids), P)
        np.testing.assert_array_equal(block[:, 0].cpu().numpy(), ids)  # row k of a block is client ids[k]
        seen.extend(int(i) for i in ids)

    comm.ring(rows, visit, count_as_models=as_models)
    assert sorted(seen) == list(range(N))
    assert seen[:comm.n_local] == list(comm.local_ids)  # own block first
    np.testing.assert_array_equal(comm.bytes_recv, (N - 1) * P * F32)
    np.testing.assert_array_equal(comm.bytes_sent, (N - 1) * P * F32)
    np.testing.assert_array_equal(comm.models_recv, (N - 1) if as_models else 0)


@pytest.mark.parametrize("mode", ["central", "p2p"])
def test_clusters_do_not_depend_on_the_number_of_ranks(mpi, shared_tmp, mode):
    cfg = _cfg(mode=mode)
    cfg.run.out_dir = str(shared_tmp)
    cfg.run.name = f"{mode}-world"
    run(cfg, mpi)
    # the same run on one rank alone
    solo = mpi.Split(0 if mpi.Get_rank() == 0 else 1)
    if mpi.Get_rank() == 0:
        cfg.run.name = f"{mode}-one"
        run(cfg, solo)
    solo.Free()
    mpi.Barrier()
    if mpi.Get_rank() != 0:
        return
    key = "lia/cluster" if mode == "central" else "lia/collaborators"
    with h5py.File(shared_tmp / f"{mode}-world" / "run.h5") as a, h5py.File(shared_tmp / f"{mode}-one" / "run.h5") as b:
        assert a.attrs["n_ranks"] == mpi.Get_size() and b.attrs["n_ranks"] == 1
        np.testing.assert_array_equal(a[key][:], b[key][:])
        assert a[key].attrs["round"] == cfg.pfedlia.warmup_rounds
        np.testing.assert_allclose(a["lia/influence"][:], b["lia/influence"][:], rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(a["metrics/test_acc"][:], b["metrics/test_acc"][:], atol=1e-5)
        mix = a["graph/mixing"][:]
        assert mix.shape == (cfg.run.rounds, N, N)
        np.testing.assert_allclose(mix.sum(-1), 1.0, atol=1e-5)
        after = mix[cfg.pfedlia.warmup_rounds:]
        if mode == "central":  # nobody mixes across found clusters
            lab = a[key][:]
            assert np.all(after[:, lab[:, None] != lab[None, :]] == 0)
        else:  # nobody mixes with a non-collaborator
            assert np.all(after[:, ~a[key][:].astype(bool)] == 0)
        assert a.attrs["lia_seconds"] > 0
        np.testing.assert_array_equal(a["lia/bytes_recv"][:] >= (N - 1) * a.attrs["n_params"] * F32, True)
