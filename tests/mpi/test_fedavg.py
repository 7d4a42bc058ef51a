"""FedAvg under MPI equals a serial weighted mean of the same clients' updates."""

import numpy as np
import torch
from serial_ref import make_ctx

from mpifl import config
from mpifl.algorithms import fedavg, oracle
from mpifl.comm import solo

N = 8


def small_cfg(**over):
    args = [f"{k}={v}" for k, v in {
        "data.name": "synthetic", "data.n_samples": 400, "data.n_clients": N, "data.n_clusters": 2,
        "algorithm.fraction": 0.75, "model.hidden": "[16]", "train.local_epochs": 2, **over}.items()]
    return config.load(None, args)


def test_fedavg_round_equals_serial_weighted_mean(mpi):
    cfg = small_cfg()
    ctx = make_ctx(cfg, mpi)
    state = fedavg.init(ctx)
    for t in range(2):
        out = fedavg.round(ctx, state, t)

    # serial reference: one process hosts every client and averages by hand
    ref = make_ctx(cfg, solo())
    model = ref.clients.init.clone()
    for t in range(2):
        sampled = ref.sample(t, cfg.algorithm.fraction)
        ref.clients.params[sampled] = model
        ref.clients.opt.reset(torch.as_tensor(sampled))
        ref.clients.train(sampled, cfg.train.local_epochs, t)
        p = ref.p[sampled] / ref.p[sampled].sum()
        model = sum(float(w) * ref.clients.params[i].double() for w, i in zip(p, sampled)).float()
    torch.testing.assert_close(state.model, model, rtol=1e-5, atol=1e-6)
    assert np.isclose(out.mixing.row.sum(), 1.0)
    assert np.count_nonzero(out.mixing.row) == len(ref.sample(1, cfg.algorithm.fraction))


def test_oracle_keeps_one_model_per_true_cluster(mpi):
    cfg = small_cfg(**{"algorithm.name": "oracle", "algorithm.fraction": 1.0, "data.partition": "clusters"})
    ctx = make_ctx(cfg, mpi)
    state = oracle.init(ctx)
    out = oracle.round(ctx, state, 0)
    oracle.evaluate(ctx, state, 0)
    cl = ctx.data.cluster
    mixing = out.mixing.densify()  # as the log stores it
    for r, i in enumerate(ctx.comm.local_ids):
        # a client's model is its cluster's model, built only from its cluster
        torch.testing.assert_close(ctx.clients.params[r], state.models[cl[i]])
        assert np.all(mixing[i][cl != cl[i]] == 0)
        assert np.isclose(mixing[i].sum(), 1.0)
