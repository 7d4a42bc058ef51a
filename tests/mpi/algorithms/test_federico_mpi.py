"""FedeRiCo over real point-to-point MPI against a serial reference written out
by hand (plain torch autograd, explicit Adam), on every rank.

    mpiexec -n 2 python -m mpi4py -m pytest -x -q tests/mpi/algorithms/test_federico_mpi.py
    mpiexec -n 4 python -m mpi4py -m pytest -x -q tests/mpi/algorithms/test_federico_mpi.py

Bits: the exact comparisons are of neighbour draws (integers), against the reference
and between a run on one rank and on all, of traffic counters, of each client's
initial row against ``models.build`` with its seed (the same torch calls on one CPU:
any kind), and of a whole run's logs on one rank and on all (one process a rank, one
thread, the batched path, one CPU: on any x86 kind, not between kinds). Against the
reference, losses, weights and accuracies are compared within tolerances.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import DEVICE
from torch.func import functional_call

from mpifl import config
from mpifl.algorithms import federico
from mpifl.comm import F32
from mpifl.data import build as build_data
from mpifl.logging.h5 import open_run
from mpifl.rng import rng
from mpifl.run import runtime
from mpifl.train import Clients

N, K = 8, 3


def make_cfg(**fed) -> config.Config:
    return config.from_dict({
        "run": {"seed": 3, "threads": 1, "rounds": 2},
        "data": {"name": "synthetic", "partition": "clusters", "n_clients": N, "n_clusters": 4, "n_samples": 640,
                 "synthetic_dim": 6},
        "model": {"hidden": [5]},
        "train": {"optimizer": "adam", "lr": 0.01, "batch_size": 16},
        "algorithm": {"name": "federico"},
        "federico": {"k": K, **fed},
    })


def perturbed(cfg, ids: np.ndarray, init: torch.Tensor) -> torch.Tensor:
    """Distinct starting models per client, the same whatever rank hosts them."""
    rows = [init + torch.from_numpy(rng(cfg.run.seed, -1, int(i), "test-perturb").normal(0, 0.3, init.shape)).float()
            .to(init.device) for i in ids]
    return torch.stack(rows)


def cross_rank_losses(owner: np.ndarray) -> np.ndarray:
    """Tracked losses whose top-k (eps = 0) are K clients of the other half of the
    ids: with contiguous placement on 2 or 4 ranks, always on another rank."""
    half = N // 2
    L = np.full((N, N), 3.0)
    for i in range(N):
        other = 0 if i >= half else half
        for d in range(K):
            L[i, other + (i + d) % half] = 0.5 + 0.1 * d
        L[i, i] = 1.0
    return L


# --------------------------------------------------------------------------- serial reference


class Reference:
    """Every client on one process; FedeRiCo's steps spelled out one by one."""

    def __init__(self, cfg, Lhat: np.ndarray):
        self.cfg = cfg
        f = cfg.federico
        data = build_data(cfg.data, cfg.run.seed, np.arange(N))
        from mpifl import models
        model = models.build(cfg.model, data.in_shape, data.n_classes, cfg.run.seed)
        self.c = Clients(model, data, cfg.train, DEVICE, cfg.run.seed)
        self.params = perturbed(cfg, np.arange(N), self.c.init)
        self.m = torch.zeros_like(self.params)
        self.v = torch.zeros_like(self.params)
        self.steps = 0
        self.Lhat = Lhat.astype(np.float64).copy()
        self.w = np.exp(-self.Lhat / f.temperature)
        self.w /= self.w.sum(1, keepdims=True)

    def loss_grad(self, theta: torch.Tensor, i: int, t: int) -> tuple[float, torch.Tensor]:
        idx = self.c.plan(np.array([i]), 1, t, federico.BATCH_PURPOSE, max_batches=1).idx[0, 0]
        idx = idx[idx >= 0]
        p = theta.clone().requires_grad_(True)
        out = functional_call(self.c.model, self.c.layout.unflatten(p), (self.c.x[idx],))
        loss = F.cross_entropy(out, self.c.y[idx])
        (g,) = torch.autograd.grad(loss, p)
        return float(loss.detach()), g

    def sample(self, i: int, t: int) -> list[int]:
        f = self.cfg.federico
        g = rng(self.cfg.run.seed, t, i, federico.PURPOSE)
        explore = g.random() < f.eps
        perm = list(g.permutation([j for j in range(N) if j != i]))
        if explore:
            return perm[:K]
        return sorted(perm, key=lambda j: -self.w[i, j])[:K]  # stable: ties keep perm order

    def round(self, t: int) -> None:
        f, tr = self.cfg.federico, self.cfg.train
        self.before = self.params.clone()
        self.S = np.array([self.sample(i, t) for i in range(N)])
        G = torch.zeros_like(self.params)
        for i in range(N):
            held = [*self.S[i], i]
            lg = [self.loss_grad(self.params[j], i, t) for j in held]
            if t == 0 and f.loss_init == "first":
                self.Lhat[i, :] = lg[-1][0]
            for j, (loss, _) in zip(held, lg):
                self.Lhat[i, j] = (1 - f.beta) * self.Lhat[i, j] + f.beta * loss
            e = np.exp(-(self.Lhat[i] - self.Lhat[i].min()) / f.temperature)
            self.w[i] = e / e.sum()
            for j, (_, g) in zip(held, lg):
                G[j] += float(self.w[i, j]) * g
        b1, b2 = 0.9, 0.999
        self.steps += 1
        self.m = b1 * self.m + (1 - b1) * G
        self.v = b2 * self.v + (1 - b2) * G * G
        mhat, vhat = self.m / (1 - b1 ** self.steps), self.v / (1 - b2 ** self.steps)
        self.params = self.params - tr.lr * mhat / (vhat.sqrt() + 1e-8)

    def predict(self, i: int, split: str) -> tuple[float, float]:
        held = [*self.S[i], i]
        mix = self.w[i, held] / self.w[i, held].sum()
        lo, hi = self.c.split_range(i, split)
        x, y = self.c.x[lo:hi], self.c.y[lo:hi]
        probs = 0
        for j, a in zip(held, mix):
            theta = self.params[j] if j == i else self.before[j]  # neighbours as pulled
            probs = probs + float(a) * torch.softmax(self.c.functional.logits(theta, x), -1)
        nll = -torch.log(probs.gather(1, y[:, None])).mean()
        return float(nll), float((probs.argmax(1) == y).float().mean())


# --------------------------------------------------------------------------- tests


def setup_run(cfg, mpi, Lhat: np.ndarray):
    s = runtime.setup(cfg, mpi)
    ctx = s.ctx
    state = federico.init(ctx)
    ctx.clients.params[:] = perturbed(cfg, ctx.comm.local_ids, ctx.clients.init)
    state.tracked_loss[:] = Lhat[ctx.comm.local_ids]
    state.weights = federico.client_weights(state.tracked_loss, cfg.federico.temperature)
    return ctx, state


@pytest.mark.parametrize("fed", [
    {"eps": 0.0, "loss_init": "zero"},  # greedy: neighbours chosen to live on other ranks
    {"eps": 1.0, "loss_init": "zero"},  # uniform draws only
    {"eps": 0.3, "loss_init": "first"},  # the defaults
])
def test_rounds_match_serial_reference(mpi, fed):
    cfg = make_cfg(**fed)
    Lhat0 = cross_rank_losses(np.arange(N))
    ctx, state = setup_run(cfg, mpi, Lhat0)
    comm, P = ctx.comm, ctx.clients.P
    ref = Reference(cfg, Lhat0)
    for t in range(2):
        comm.reset_counters()
        out = federico.round(ctx, state, t)
        ref.round(t)
        S = comm.allgather_rows(state.neighbours)
        np.testing.assert_array_equal(S, ref.S)
        assert all(i not in S[i] and len(set(S[i])) == K for i in range(N))
        if t == 0 and fed["eps"] == 0.0:
            owner = comm.placement.owner(np.arange(N))
            # the hand-made losses put every neighbour on another rank for 2 and 4 ranks
            assert comm.size not in (2, 4) or all((owner[S[i]] != owner[i]).all() for i in range(N))
        np.testing.assert_allclose(comm.allgather_rows(state.tracked_loss), ref.Lhat, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(comm.allgather_rows(state.weights), ref.w, rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(comm.allgather_rows(ctx.clients.params), ref.params.cpu().numpy(), rtol=1e-4,
                                   atol=1e-6)
        mixing = comm.allgather_rows(out.mixing.rows)
        np.testing.assert_allclose(mixing.sum(1), 1.0, rtol=1e-6)
        for i in range(N):
            assert set(np.flatnonzero(mixing[i])) == {*S[i], i}

        # traffic: k models in per client; gradients back to owners; the wire carries the plan
        indeg = np.bincount(S.ravel(), minlength=N)
        mine = comm.local_ids
        np.testing.assert_array_equal(comm.models_recv, K)
        np.testing.assert_array_equal(comm.bytes_recv, (K + indeg[mine]) * P * F32)
        np.testing.assert_array_equal(comm.bytes_sent, (K + indeg[mine]) * P * F32)
        owner = comm.placement.owner(np.arange(N))
        pulled = {int(j) for i in mine for j in S[i] if owner[j] != comm.rank}
        # pushed: every (sender, receiver) row on its own, so that sums run in client order
        pushed_in = sum(1 for i in range(N) if owner[i] != comm.rank for j in S[i] if owner[j] == comm.rank)
        assert comm.wire_recv == (len(pulled) + pushed_in) * P * F32
        total_recv = comm.allreduce_sum(float(comm.bytes_recv.sum()))
        assert total_recv == 2 * N * K * P * F32

    metrics = federico.evaluate(ctx, state, 1)
    for split in ("val", "test"):
        want = np.array([ref.predict(i, split) for i in range(N)])
        np.testing.assert_allclose(comm.allgather_rows(metrics[f"{split}_loss"]), want[:, 0], rtol=1e-4)
        np.testing.assert_allclose(comm.allgather_rows(metrics[f"{split}_acc"]), want[:, 1], atol=1e-6)


def test_per_client_init_is_the_same_on_any_number_of_ranks(mpi):
    """federico.init=per_client (the default): client i's initial row is built from
    its own seed wherever it lives, so the gathered rows equal a serial build."""
    from mpifl import models

    cfg = make_cfg()
    assert cfg.federico.init == "per_client"
    ctx = runtime.setup(cfg, mpi).ctx
    federico.init(ctx)
    rows = ctx.comm.allgather_rows(ctx.clients.params)
    want = torch.stack([ctx.clients.layout.flatten(models.build(cfg.model, ctx.data.in_shape, ctx.data.n_classes,
                                                                federico.init_seed(ctx, i))) for i in range(N)])
    np.testing.assert_array_equal(rows, want.cpu().numpy())
    assert len({r.tobytes() for r in rows}) == N


def test_same_draws_and_accuracy_on_one_rank_and_all(mpi, shared_tmp):
    """The same seed on 1 rank and on all ranks gives identical neighbour draws,
    and the same bits: losses, weights and accuracies (the pushed gradients are
    summed in client order wherever their senders live)."""
    overrides = ["algorithm.name=federico", "data.name=synthetic", "data.n_clients=8", "data.n_clusters=4",
                 "data.n_samples=800", "model.hidden=[16]", "train.optimizer=adam", "train.lr=0.01",
                 "train.batch_size=20", "run.rounds=25", "run.eval_every=25", "run.threads=1", "run.seed=5",
                 f"run.out_dir={shared_tmp}"]
    single = mpi.Split(0 if mpi.Get_rank() == 0 else 1, mpi.Get_rank())
    if mpi.Get_rank() == 0:
        runtime.run(config.load(None, [*overrides, "run.name=one"], 1), single)
    single.Free()
    mpi.Barrier()
    runtime.run(config.load(None, [*overrides, "run.name=all"], mpi.Get_size()), mpi)
    mpi.Barrier()
    one, every = open_run(shared_tmp / "one"), open_run(shared_tmp / "all")
    assert every.attrs["n_ranks"] == mpi.Get_size()
    np.testing.assert_array_equal(one.get("federico/neighbours"), every.get("federico/neighbours"))
    for key in ("metrics/train_loss", "metrics/test_loss", "metrics/test_acc", "federico/client_weights",
                "federico/tracked_loss", "graph/mixing"):
        np.testing.assert_array_equal(one.get(key), every.get(key), err_msg=key)


def test_pulled_rows_are_copies_wherever_they_live(mpi):
    """A pulled row must not follow later in-place updates of its owner's block,
    whether it crossed MPI or came from this rank (else results depend on placement)."""
    from mpifl.comm import Comm

    comm = Comm(N, mpi)
    rows = torch.arange(comm.n_local * 4, dtype=torch.float32).view(comm.n_local, 4) + 100 * comm.first
    want = {r: [int(j) for j in range(N) if j != i] for r, i in enumerate(comm.local_ids)}
    got = comm.pull(rows, want)
    before = {j: v.clone() for j, v in got.items()}
    rows.add_(1000.0)
    for j, v in got.items():
        torch.testing.assert_close(v, before[j])
    np.testing.assert_array_equal(comm.models_recv, N - 1)
