"""pFedGraph under MPI against a plain single-process reference: local SGD on
cross-entropy minus lam * <c_i, theta>/||theta|| (autograd), the graph QP solved
by enumerating supports, aggregation by the graph's rows; and the closed-form
simplex projection against that enumeration.

    mpiexec -n 2 python -m mpi4py -m pytest -x -q tests/mpi/algorithms/test_pfedgraph.py

Bits: the one exact comparison is of byte counters (integers); weights and models
are compared within tolerances.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from serial_ref import cfg_of, gathered, make_ctx, perturbed, serial, sgd

from mpifl.algorithms import pfedgraph


def qp_by_supports(d: np.ndarray, p: np.ndarray, alpha: float) -> np.ndarray:
    """argmin_{a >= 0, sum a = 1} d.a + alpha ||a - p||^2: on a support T the
    stationarity conditions give a_T = p_T - (d_T + nu) / (2 alpha) with nu set by
    sum a = 1; the best feasible candidate over every support is the optimum."""
    n = len(d)
    best, arg = np.inf, None
    for r in range(1, n + 1):
        for T in itertools.combinations(range(n), r):
            T = list(T)
            nu = (2 * alpha * (p[T].sum() - 1) - d[T].sum()) / len(T)
            a = np.zeros(n)
            a[T] = p[T] - (d[T] + nu) / (2 * alpha)
            if (a < -1e-12).any():
                continue
            f = d @ a + alpha * ((a - p) ** 2).sum()
            if f < best:
                best, arg = f, a
    return arg


def test_projection_equals_the_enumerated_qp():
    g = np.random.default_rng(0)
    for _ in range(200):
        n = int(g.integers(1, 7))
        d = g.uniform(-1, 1, n) * g.choice([0.1, 1, 10])
        p = g.dirichlet(np.ones(n))
        alpha = float(g.choice([0.01, 0.8, 5.0]))
        np.testing.assert_allclose(pfedgraph.project_simplex(p - d / (2 * alpha)), qp_by_supports(d, p, alpha),
                                   atol=1e-9)


def test_dissimilarity_is_minus_cosine_clipped_at_minus_one():
    D = torch.tensor([[1.0, 0.0], [0.95, np.sqrt(1 - 0.95**2)], [0.0, 2.0], [-1.0, 0.0]])
    d = pfedgraph.dissimilarity(D)
    want = np.array([[-1, -1, 0, 1], [-1, -1, -np.sqrt(1 - 0.95**2), 0.95],
                     [0, -np.sqrt(1 - 0.95**2), -1, 0], [1, 0.95, 0, -1]])
    np.testing.assert_allclose(d, want, atol=1e-12)  # cos 0.95 > 0.9: -1, not -0.95


class Reference:
    def __init__(self, cfg):
        self.cfg = cfg
        self.ctx = serial(cfg)
        N = cfg.data.n_clients
        self.theta = perturbed(cfg, np.arange(N), self.ctx.clients.init)
        self.target = [None] * N
        self.graph = np.full((N, N), 1 / (N - 1))
        np.fill_diagonal(self.graph, 0)

    def round(self, t: int) -> None:
        ctx, c, f = self.ctx, self.ctx.clients, self.cfg.pfedgraph
        S = ctx.sample(t, self.cfg.algorithm.fraction)
        for i in S:
            ci = self.target[i]
            extra = None if ci is None else (lambda th, ci=ci: -f.lam * (ci @ th) / th.norm())
            self.theta[i] = sgd(c, self.theta[i], int(i), t, self.cfg.train.local_epochs, self.cfg.train.lr,
                                extra=extra)
        D = (self.theta[S] - c.init).double()
        cos = torch.nn.functional.cosine_similarity(D[:, None], D[None], dim=2).cpu().numpy()
        d = np.where(-cos < -0.9, -1.0, -cos)
        p = ctx.p[S] / ctx.p[S].sum()
        A = np.stack([qp_by_supports(d[i], p, f.alpha) for i in range(len(S))])
        self.A = A
        self.graph[np.ix_(S, S)] = A
        old = self.theta[S].double()
        for r, i in enumerate(S):
            a = torch.as_tensor(A[r], device=old.device)
            self.theta[i] = (a @ old).float()
            self.target[i] = (a @ (old / old.norm(dim=1, keepdim=True))).float()


@pytest.mark.parametrize("over", [
    {"algorithm.fraction": 0.75, "pfedgraph.lam": 0.5},
    {"algorithm.fraction": 1.0, "pfedgraph.alpha": 0.05},  # sparse rows
])
def test_rounds_match_serial_reference(mpi, over):
    cfg = cfg_of(**{"algorithm.name": "pfedgraph", "data.n_clients": 5, "data.n_samples": 400, **over})
    ctx = make_ctx(cfg, mpi)
    state = pfedgraph.init(ctx)
    ctx.clients.params[:] = perturbed(cfg, ctx.comm.local_ids, ctx.clients.init)
    ref = Reference(cfg)
    sparse_seen = False
    for t in range(3):
        ctx.comm.reset_counters()
        out = pfedgraph.round(ctx, state, t)
        ref.round(t)
        np.testing.assert_allclose(state.graph, ref.graph, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(gathered(ctx, out.extras["graph"]), ref.graph, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(gathered(ctx, ctx.clients.params), ref.theta.cpu().numpy(), rtol=1e-5, atol=1e-6)
        mixing = gathered(ctx, out.mixing.rows)
        np.testing.assert_allclose(mixing.sum(1), 1.0, rtol=1e-6)
        S = ctx.sample(t, cfg.algorithm.fraction)
        np.testing.assert_allclose(mixing[np.ix_(S, S)], ref.A, rtol=1e-5, atol=1e-7)
        sparse_seen |= bool((ref.A == 0).any())
        # each sampled client: one model up, its aggregate and c_i down
        P = ctx.clients.P
        sent = gathered(ctx, ctx.comm.bytes_sent)
        np.testing.assert_array_equal(sent, np.isin(np.arange(ctx.N), S) * P * 4)
    if over.get("pfedgraph.alpha") == 0.05:
        assert sparse_seen  # the small alpha really exercises the simplex's boundary
