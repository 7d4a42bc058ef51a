"""FedBN against a plain single-process torch reference on a small MLP with
BatchNorm (3 clients, or one per rank, 3 rounds, the same batches): the shared
part is the p-weighted average, each client keeps its BatchNorm parameters and
running statistics; without BatchNorm FedBN is FedAvg bit for bit.

Bits: as tests/mpi/algorithms/test_baselines4.py's (client by client exact on one CPU and
thread count, any x86 kind; batched within a tolerance); the running statistics too."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from plain_ref import batch_indices, fedavg, valid
from serial_ref import bn_ctx, make_ctx
from torch import nn
from torch.func import functional_call

from mpifl import algorithms, config, models
from mpifl.algorithms import fedbn
from mpifl.comm import solo
from mpifl.train import Clients

ROUNDS = 3


def make_cfg(mpi, **over) -> config.Config:
    args = {"data.name": "synthetic", "data.n_samples": 300, "data.n_clients": max(3, mpi.Get_size()),
            "data.partition": "dirichlet", "data.dirichlet_alpha": 0.5, "train.local_epochs": 2,
            "train.batch_size": 16, "train.lr": 0.1, "algorithm.fraction": 0.67, "algorithm.name": "fedbn", **over}
    return config.load(None, [f"{k}={v}" for k, v in args.items()])


def forward(c: Clients, row: torch.Tensor, bufs: torch.Tensor, idx: np.ndarray, train: bool) -> torch.Tensor:
    """The template on ``row`` with running statistics ``bufs`` (updated in place when training)."""
    c.model.train(train)
    try:
        return functional_call(c.model, {**c.layout.unflatten(row), **c.layout.unflatten_buffers(bufs)},
                               (c.x[idx],))
    finally:
        c.model.train()


def plain_fedbn(cfg):
    ref = bn_ctx(cfg, solo())
    c = ref.clients
    personal = torch.zeros(c.P, dtype=torch.bool, device=c.device)
    for s in c.layout.slices(["2.weight", "2.bias"]):  # the BatchNorm1d's gamma and beta
        personal[s] = True
    x = c.init.clone()
    rows = {k: c.init.clone() for k in range(ref.N)}
    bufs = {k: c.buffers[k].clone() for k in range(ref.N)}
    for t in range(ROUNDS):
        sampled = [int(k) for k in ref.sample(t, cfg.algorithm.fraction)]
        for k in sampled:
            theta = torch.where(personal, rows[k], x)
            for idx in batch_indices(c, k, t, cfg.train.local_epochs):
                leaf = theta.clone().requires_grad_(True)
                loss = F.cross_entropy(forward(c, leaf, bufs[k], valid(idx), True), c.y[valid(idx)])
                (g,) = torch.autograd.grad(loss, leaf)
                theta = (theta - cfg.train.lr * g).detach()
            rows[k] = theta
        x = torch.where(personal, x, fedavg(ref, {k: rows[k] for k in sampled}))
    return ref, personal, x, rows, bufs


@pytest.mark.parametrize("batched", ["on", "off"])  # vmap with each client's statistics; row by row
def test_fedbn_matches_plain_torch(mpi, batched):
    cfg = make_cfg(mpi, **{"train.batched": batched})
    ctx = bn_ctx(cfg, mpi)
    state = fedbn.init(ctx)
    outs = [fedbn.round(ctx, state, t) for t in range(ROUNDS)]
    ref, personal, x, rows, bufs = plain_fedbn(cfg)
    c = ctx.clients
    assert torch.equal(state.personal, torch.nonzero(personal).flatten())
    torch.testing.assert_close(state.model[~personal], x[~personal], rtol=1e-5, atol=1e-6)
    own = c.params.clone(), c.buffers.clone()
    got = fedbn.evaluate(ctx, state, ROUNDS - 1)
    assert torch.equal(c.params, own[0]) and torch.equal(c.buffers, own[1])  # evaluation changes nothing
    for r, i in enumerate(ctx.comm.local_ids):
        k = int(i)
        torch.testing.assert_close(c.params[r][personal], rows[k][personal], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(c.buffers[r], bufs[k], rtol=1e-5, atol=1e-6)
        drift = float(torch.linalg.vector_norm(rows[k][personal] - ref.clients.init[personal]))
        assert np.isclose(outs[-1].extras["personal_drift"][r], drift, rtol=1e-4, atol=1e-7)
        lo, hi = ref.clients.split_range(k, "test")
        with torch.no_grad():
            out = forward(ref.clients, torch.where(personal, rows[k], x), bufs[k], np.arange(lo, hi), False)
        assert np.isclose(got["test_loss"][r], float(F.cross_entropy(out, ref.clients.y[lo:hi])), rtol=1e-4)
    assert outs[0].attrs == {"fedbn_personal_params": 16} and outs[1].attrs == {}
    sampled = ref.sample(ROUNDS - 1, cfg.algorithm.fraction)
    assert np.count_nonzero(outs[-1].mixing.row) == len(sampled)


@pytest.mark.parametrize("threads", [1, 2])  # one thread: the fused SGD path of plain training
def test_fedbn_without_batchnorm_is_fedavg_bit_for_bit(mpi, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        done = {}
        for name in ("fedbn", "fedavg"):
            ctx = make_ctx(make_cfg(mpi, **{"algorithm.name": name, "model.hidden": "[16]"}), mpi)
            algo = algorithms.get(name)
            state = algo.init(ctx)
            for t in range(ROUNDS):
                algo.round(ctx, state, t)
            done[name] = state.model, ctx.clients.params.clone(), algo.evaluate(ctx, state, ROUNDS - 1)
    finally:
        torch.set_num_threads(before)
    (bn_model, bn_rows, bn_eval), (avg_model, avg_rows, avg_eval) = done["fedbn"], done["fedavg"]
    assert torch.equal(bn_model, avg_model) and torch.equal(bn_rows, avg_rows)
    for k, v in bn_eval.items():
        np.testing.assert_array_equal(v, avg_eval[k], err_msg=k)


def test_every_batchnorm_of_resnet18_stays_local_downsample_branches_too():
    cfg = config.load(None, ["model.name=resnet18"])
    with torch.device("meta"):
        model = models.architecture(cfg.model, (3, 32, 32), 10)
    names = fedbn.batchnorm_names(models.layers(model))
    layers = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(names) == 2 * len(layers) == 40
    assert "layer2.0.downsample.1.weight" in names and "conv1.weight" not in names
    # an image model without BatchNorm has no personal part: FedAvg
    with torch.device("meta"):
        plain = models.architecture(config.load(None, ["model.name=cnn_dpfl"]).model, (3, 32, 32), 10)
    assert fedbn.batchnorm_names(models.layers(plain)) == set()


@pytest.mark.parametrize("batched", ["off", "on"])
def test_with_batchnorm_the_same_bits_on_any_number_of_ranks_as_in_one_process(mpi, batched):
    """Client by client every row and running statistic agrees bit for bit with
    all clients in one process; batched (vmap), to float tolerance."""
    cfg = make_cfg(mpi, **{"train.batched": batched})
    ctxs = bn_ctx(cfg, mpi), bn_ctx(cfg, solo())
    states = [fedbn.init(ctx) for ctx in ctxs]
    for t in range(ROUNDS):
        for ctx, state in zip(ctxs, states):
            fedbn.round(ctx, state, t)
    ids = torch.as_tensor(ctxs[0].comm.local_ids)
    pairs = [(states[0].model, states[1].model), (ctxs[0].clients.params, ctxs[1].clients.params[ids]),
             (ctxs[0].clients.buffers, ctxs[1].clients.buffers[ids])]
    for a, b in pairs:
        assert torch.equal(a, b) if batched == "off" else torch.allclose(a, b, rtol=1e-5, atol=1e-6)
