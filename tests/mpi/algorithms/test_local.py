"""Local, both protocols, against a plain single-process torch reference on the
same batches: every client every round (default), or with ``local.sampled_only``
only the clients each round's draw samples (FL-bench's Local-only), under any
number of ranks.

Bits: ``local.sampled_only`` with every client sampled is compared bit for bit with
plain Local: two runs in one job on one CPU at one thread count, on the same
training path and rows, so it holds on AVX2 and AVX-512 alike. The comparisons with
the reference use tolerances."""

import numpy as np
import pytest
import serial_ref
import torch
from serial_ref import make_ctx

from mpifl import algorithms, config
from mpifl.comm import solo

ROUNDS = 3


def make_cfg(mpi, **over):
    n = max(6, mpi.Get_size())
    args = {"data.name": "synthetic", "data.n_samples": 360, "data.n_clients": n, "data.partition": "dirichlet",
            "data.dirichlet_alpha": 0.5, "model.hidden": "[8]", "train.local_epochs": 2, "train.batch_size": 16,
            "train.lr": 0.1, "algorithm.name": "local", "algorithm.fraction": 0.34, **over}
    return config.load(None, [f"{k}={v}" for k, v in args.items()], n_ranks=mpi.Get_size())


def run(cfg, mpi):
    ctx = make_ctx(cfg, mpi)
    algo = algorithms.get("local")
    state = algo.init(ctx)
    losses = [algo.round(ctx, state, t).train_loss for t in range(ROUNDS)]
    return ctx, np.array(losses)


@pytest.mark.parametrize("sampled_only", [False, True])
def test_local_matches_plain_sgd_of_the_clients_that_train(mpi, sampled_only):
    cfg = make_cfg(mpi, **{"local.sampled_only": sampled_only})
    ctx, losses = run(cfg, mpi)
    ref = make_ctx(cfg, solo())
    w = {k: ref.clients.init.clone() for k in range(ref.N)}
    trained = np.zeros((ROUNDS, ref.N), bool)
    for t in range(ROUNDS):
        who = ref.sample(t, cfg.algorithm.fraction) if sampled_only else np.arange(ref.N)
        trained[t, who] = True
        for k in who:
            w[int(k)] = serial_ref.sgd(ref.clients, w[int(k)], int(k), t, cfg.train.local_epochs, cfg.train.lr)
    if sampled_only:  # the draw leaves some clients out of some rounds, and some untrained at all
        assert 0 < trained.sum() < trained.size and not trained.any(axis=0).all()
    for r, k in enumerate(ctx.comm.local_ids):
        torch.testing.assert_close(ctx.clients.params[r], w[int(k)], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(np.isfinite(losses[:, r]), trained[:, k])


def test_sampled_only_with_every_client_sampled_is_plain_local(mpi):
    a, la = run(make_cfg(mpi, **{"algorithm.fraction": 1.0, "local.sampled_only": True}), mpi)
    b, lb = run(make_cfg(mpi, **{"algorithm.fraction": 1.0}), mpi)
    torch.testing.assert_close(a.clients.params, b.clients.params, rtol=0, atol=0)
    np.testing.assert_array_equal(la, lb)
