"""FedAvg under MPI equals a serial weighted mean of the same clients' updates."""

import numpy as np
import pytest
import torch
from serial_ref import make_ctx

from mpifl import algorithms, config
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


def server_reference(name: str, p, x: torch.Tensor, avg: torch.Tensor, st: dict) -> torch.Tensor:
    """The server steps as the papers print them (float64): FedAvgM's momentum on
    Delta = x - avg; FedAdam's and FedYogi's moments of Delta = avg - x (Reddi et
    al., Algorithm 2; m_{-1} = 0, v_{-1} = tau^2, no bias correction)."""
    if name == "fedavgm":
        st["v"] = p.momentum * st.get("v", 0.0) + (x - avg)
        return x - p.lr * st["v"]
    d = avg - x
    st["m"] = p.beta1 * st.get("m", 0.0) + (1 - p.beta1) * d
    v = st.get("v", torch.full_like(x, p.tau ** 2))
    st["v"] = (p.beta2 * v + (1 - p.beta2) * d ** 2 if name == "fedadam"
               else v - (1 - p.beta2) * d ** 2 * torch.sign(v - d ** 2))
    return x + p.lr * st["m"] / (st["v"].sqrt() + p.tau)


@pytest.mark.parametrize(("name", "over"), [
    ("fedavgm", {"fedavgm.lr": 0.7, "fedavgm.momentum": 0.5}),
    ("fedadam", {"fedadam.lr": 0.03, "fedadam.tau": 0.01, "fedadam.beta1": 0.8}),
    ("fedyogi", {"fedyogi.lr": 0.03, "fedyogi.tau": 0.01, "fedyogi.beta2": 0.9}),
])
def test_server_optimizers_equal_the_printed_update_on_the_serial_average(mpi, name, over):
    cfg = small_cfg(**{"algorithm.name": name, **over})
    ctx = make_ctx(cfg, mpi)
    algo = algorithms.get(name)
    state = algo.init(ctx)
    rounds = 3
    for t in range(rounds):
        algo.round(ctx, state, t)

    ref = make_ctx(cfg, solo())
    x, st, p = ref.clients.init.double(), {}, getattr(cfg, name)
    for t in range(rounds):
        sampled = ref.sample(t, cfg.algorithm.fraction)
        ref.clients.params[sampled] = x.float()
        ref.clients.opt.reset(torch.as_tensor(sampled))
        ref.clients.train(sampled, cfg.train.local_epochs, t)
        w = ref.p[sampled] / ref.p[sampled].sum()
        avg = sum(float(wi) * ref.clients.params[i].double() for wi, i in zip(w, sampled))
        x = server_reference(name, p, x, avg, st)
    moved = (x - ref.clients.init.double()).abs().max()
    assert moved > 1e-2  # the server did step
    torch.testing.assert_close(state.model.double(), x, rtol=1e-4, atol=1e-5)
