"""FeSEM under MPI against a plain single-process reference: local SGD from the
assigned centre, E-step (nearest centre by L2), M-step (p-weighted mean).

    mpiexec -n 2 python -m mpi4py -m pytest -x -q tests/mpi/algorithms/test_fesem.py

Bits: the exact comparisons are of cluster assignments (integers); distances and
centres are compared within tolerances.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from serial_ref import cfg_of, gathered, make_ctx, serial, sgd

from mpifl.algorithms import fesem
from mpifl.config import load
from mpifl.errors import ConfigError
from mpifl.rng import GLOBAL


class Reference:
    def __init__(self, cfg, K: int):
        self.cfg, self.K = cfg, K
        self.ctx = serial(cfg)
        self.own = self.ctx.clients.init.repeat(cfg.data.n_clients, 1)
        self.assign = np.full(cfg.data.n_clients, -1)
        self.centres = None

    def round(self, t: int) -> None:
        ctx, c = self.ctx, self.ctx.clients
        S = ctx.sample(t, self.cfg.algorithm.fraction)
        for i in S:
            start = self.own[i] if self.assign[i] < 0 else self.centres[self.assign[i]]
            self.own[i] = sgd(c, start, int(i), t, self.cfg.train.local_epochs, self.cfg.train.lr)
        if self.centres is None:
            picks = np.sort(ctx.rng(t, GLOBAL, fesem.INIT_PURPOSE).choice(S, self.K, replace=False))
            self.centres = self.own[picks].clone()
        self.dist = np.full((len(self.own), self.K), np.nan)
        for i in S:
            self.dist[i] = [float((self.own[i].double() - w.double()).norm()) for w in self.centres]
            self.assign[i] = int(np.argmin(self.dist[i]))
        for k in range(self.K):
            members = [int(i) for i in S if self.assign[i] == k]
            if members:
                a = ctx.p[members] / ctx.p[members].sum()
                self.centres[k] = sum(float(w) * self.own[i].double() for w, i in zip(a, members)).float()


@pytest.mark.parametrize("over", [
    {"algorithm.fraction": 0.75, "fesem.k": 2},  # 6 clients, 4-5 sampled per round
    {"algorithm.fraction": 1.0},  # k = 0: the partition's 3 true clusters
])
def test_rounds_match_serial_reference(mpi, over):
    cfg = cfg_of(**{"algorithm.name": "fesem", "data.n_clients": 6, "data.n_clusters": 3, "data.n_samples": 480,
                    **over})
    ctx = make_ctx(cfg, mpi)
    state = fesem.init(ctx)
    K = cfg.fesem.k or 3
    assert len(state.centres) == K
    ref = Reference(cfg, K)
    for t in range(3):
        out = fesem.round(ctx, state, t)
        ref.round(t)
        np.testing.assert_array_equal(state.assign, ref.assign)
        np.testing.assert_array_equal(gathered(ctx, out.extras["cluster"]), ref.assign)
        np.testing.assert_allclose(gathered(ctx, out.extras["distance"]), ref.dist, rtol=1e-5)
        torch.testing.assert_close(state.centres, ref.centres, rtol=1e-5, atol=1e-6)
        g = out.mixing.group
        np.testing.assert_array_equal(g, ref.assign)
    assert len(set(ref.assign[ref.assign >= 0])) >= 2  # the case is not degenerate
    metrics = fesem.evaluate(ctx, state, 2)
    rows = torch.stack([ref.centres[a] if a >= 0 else ref.own[i] for i, a in enumerate(ref.assign)])
    np.testing.assert_allclose(gathered(ctx, metrics["test_acc"]), ref.ctx.clients.evaluate("test", rows)[1],
                               atol=1e-6)


def test_k_must_fit_the_sampled_clients():
    with pytest.raises(ConfigError, match=r"^fesem.k=5 is not allowed; must be <= the clients sampled per round \(4\)"):
        load(None, ["algorithm.name=fesem", "fesem.k=5", "data.n_clients=8", "algorithm.fraction=0.5"])
