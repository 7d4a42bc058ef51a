"""CFL under MPI against a plain single-process reference (FedAvg per cluster,
norms, the optimal bipartition found by enumerating every bipartition), and the
split rule: a split must happen where two groups' updates are opposite, and not
where they agree or before the warm-up.

    mpiexec -n 2 python -m mpi4py -m pytest -x -q tests/mpi/algorithms/test_cfl.py

Bits: the exact comparisons are of cluster labels (integers) against the
reference's; no floating-point result is compared exactly (models and norms within
tolerances).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from serial_ref import cfg_of, gathered, make_ctx, serial, sgd

from mpifl.algorithms import cfl


def optimal_bipartition(U: torch.Tensor) -> list[set[int]]:
    """The paper's split: the bipartition minimising the largest cross-group
    cosine similarity, by enumeration; the group holding 0 first."""
    u = U.double() / U.double().norm(dim=1, keepdim=True)
    S = (u @ u.T).cpu().numpy()
    m = len(S)
    best, arg = np.inf, None
    for r in range(1, m):
        for g in itertools.combinations(range(1, m), r):
            b = set(g)
            a = set(range(m)) - b
            cross = max(S[i, j] for i in a for j in b)
            if cross < best - 1e-12:
                best, arg = cross, (a, b)
    return list(arg)


class Reference:
    def __init__(self, cfg):
        self.cfg = cfg
        self.ctx = serial(cfg)
        self.cl = np.zeros(cfg.data.n_clients, np.int64)
        self.models = [self.ctx.clients.init.clone()]
        self.splits = []

    def round(self, t: int) -> None:
        ctx, c, f = self.ctx, self.ctx.clients, self.cfg.cfl
        S = ctx.sample(t, self.cfg.algorithm.fraction)
        upd = {int(i): sgd(c, self.models[self.cl[i]], int(i), t, self.cfg.train.local_epochs, self.cfg.train.lr)
               - self.models[self.cl[i]] for i in S}
        new = self.cl.copy()
        K = len(self.models)
        for k in range(K):
            Sk = [int(i) for i in S if self.cl[i] == k]
            if not Sk:
                continue
            a = ctx.p[Sk] / ctx.p[Sk].sum()
            mean = float(sum(float(w) * upd[i].double() for w, i in zip(a, Sk)).norm())
            mx = max(float(upd[i].double().norm()) for i in Sk)
            members = np.flatnonzero(self.cl == k)
            if t >= f.warmup_rounds and len(members) > f.min_size and mean < f.eps1 and mx > f.eps2:
                E, lr = self.cfg.train.local_epochs, self.cfg.train.lr
                U = torch.stack([upd[int(i)] if int(i) in upd else sgd(c, self.models[k], int(i), t, E, lr)
                                 - self.models[k] for i in members])
                _, b = optimal_bipartition(U)
                new[members[sorted(b)]] = len(self.models)
                self.models.append(self.models[k].clone())
                self.splits.append((t, k, mean, mx))
        self.cl = new
        for k in range(len(self.models)):
            Sk = [int(i) for i in S if self.cl[i] == k]
            if Sk:
                a = ctx.p[Sk] / ctx.p[Sk].sum()
                self.models[k] = self.models[k] + sum(float(w) * upd[i] for w, i in zip(a, Sk))


@pytest.mark.parametrize("over", [
    {"algorithm.fraction": 1.0, "cfl.warmup_rounds": 1, "cfl.eps1": 10.0, "cfl.eps2": 0.01},  # splits at t=1
    {"algorithm.fraction": 0.75, "cfl.warmup_rounds": 0, "cfl.eps1": 10.0, "cfl.eps2": 0.01},  # sampled, splits
    {"algorithm.fraction": 0.75},  # the defaults: no split
])
def test_rounds_match_serial_reference(mpi, over):
    cfg = cfg_of(**{"algorithm.name": "cfl", "data.n_clients": 6, "data.n_samples": 480,
                    "cfl.min_size": 1, **over})
    ctx = make_ctx(cfg, mpi)
    state = cfl.init(ctx)
    ref = Reference(cfg)
    for t in range(3):
        out = cfl.round(ctx, state, t)
        ref.round(t)
        np.testing.assert_array_equal(state.cluster, ref.cl)
        np.testing.assert_array_equal(gathered(ctx, out.extras["cluster"]), ref.cl)
        assert len(state.models) == len(ref.models)
        for k in range(len(ref.models)):
            torch.testing.assert_close(state.models[k], ref.models[k], rtol=1e-5, atol=1e-6)
    assert [tuple(s[:2]) for s in state.splits] == [s[:2] for s in ref.splits]
    np.testing.assert_allclose([s[3:5] for s in state.splits], [s[2:] for s in ref.splits], rtol=1e-5)
    if over.get("cfl.eps2") == 0.01:
        assert len(ref.splits) >= 1  # the case is meant to split
    else:
        assert not ref.splits
    metrics = cfl.evaluate(ctx, state, 2)
    rows = torch.stack([ref.models[k] for k in ref.cl])
    want = ref.ctx.clients.evaluate("test", rows)[1]
    np.testing.assert_allclose(gathered(ctx, metrics["test_acc"]), want, atol=1e-6)


def opposite_clients(ctx, flip: bool) -> None:
    """Every client's training data: the same inputs and labels, with labels
    swapped on odd clients when ``flip`` (2 classes). From an all-zero model (only the output bias moves),
    one full-batch step of an odd client is exactly minus an even client's."""
    c = ctx.clients
    g = np.random.default_rng(7)
    X = torch.from_numpy(g.normal(size=(200, c.x.shape[1]))).float()
    y = torch.from_numpy(g.integers(0, 2, 200))
    for r, i in enumerate(ctx.comm.local_ids):
        lo, hi = c.split_range(r, "train")
        c.x[lo:hi] = X[: hi - lo]
        c.y[lo:hi] = (1 - y[: hi - lo]) if (flip and i % 2) else y[: hi - lo]


def split_run(mpi, flip: bool, warmup: int):
    cfg = cfg_of(**{"algorithm.name": "cfl", "data.partition": "iid", "data.n_clients": 8, "data.n_samples": 800,
                    "data.synthetic_classes": 2, "model.hidden": "[4]", "train.batch_size": 1000,
                    "cfl.eps1": 1e-3, "cfl.eps2": 1e-3, "cfl.warmup_rounds": warmup})
    ctx = make_ctx(cfg, mpi)
    opposite_clients(ctx, flip)
    assert len(set(ctx.comm.allgather_rows(ctx.clients.sizes[:, 0]))) == 1  # equal sizes: the mean cancels
    state = cfl.init(ctx)
    state.models.zero_()
    out = cfl.round(ctx, state, 0)
    return ctx, state, out


def test_opposite_updates_split_into_the_two_groups(mpi):
    ctx, state, out = split_run(mpi, flip=True, warmup=0)
    ids = np.arange(ctx.N)
    np.testing.assert_array_equal(state.cluster, (ids % 2).astype(np.int64))
    assert len(state.splits) == 1 and state.splits[0][:3].tolist() == [0, 0, 1]
    mean, mx = state.splits[0][3:5]
    assert mean < 1e-5 < 1e-3 < mx
    # both halves got their own FedAvg: the two models are opposite
    torch.testing.assert_close(state.models[0], -state.models[1], rtol=1e-4, atol=1e-6)
    assert out.attrs["cfl_splits"][0][:3] == [0, 0, 1]


def test_agreeing_updates_do_not_split(mpi):
    _, state, _ = split_run(mpi, flip=False, warmup=0)
    assert (state.cluster == 0).all() and len(state.models) == 1 and len(state.splits) == 0


def test_no_split_before_the_warm_up(mpi):
    _, state, _ = split_run(mpi, flip=True, warmup=1)
    assert (state.cluster == 0).all() and len(state.models) == 1


def test_bipartition_is_the_optimal_one():
    """Single linkage reaches the paper's optimum (smallest largest cross-group
    similarity) on random updates; complete linkage, the reference code's, does
    not always."""
    g = np.random.default_rng(1)
    misses = 0
    for _ in range(60):
        U = torch.from_numpy(g.normal(size=(int(g.integers(3, 8)), 3)))
        want = optimal_bipartition(U)[1]
        got = cfl.bipartition(U, "single")
        assert set(np.flatnonzero(got)) == want
        misses += set(np.flatnonzero(cfl.bipartition(U, "complete"))) != want
    assert misses > 0
