"""FedProto against a plain single-process torch reference (3 clients, 2 rounds,
the same batches): local loss CE + lam * mean-square distance to the global
prototype, count-weighted prototype averaging, nearest-prototype prediction."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from serial_ref import make_ctx
from torch.func import functional_call

from mpifl import config
from mpifl.algorithms import fedproto
from mpifl.comm import solo


def small_cfg(**over):
    args = {"data.name": "synthetic", "data.n_samples": 300, "data.n_clients": 3, "data.n_clusters": 2,
            "data.partition": "clusters", "algorithm.name": "fedproto", "algorithm.fraction": 0.67,
            "model.hidden": "[16, 8]", "train.local_epochs": 2, "train.batch_size": 16, "train.lr": 0.1,
            "fedproto.lam": 2.0, **over}
    return config.load(None, [f"{k}={v}" for k, v in args.items()])


def reference(cfg, rounds=2):
    ref = make_ctx(cfg, solo())
    c = ref.clients
    body = torch.nn.Sequential(*list(c.model)[:-1])
    last = f"{len(c.model) - 1}"
    C = c.n_classes
    d = body(c.x[:1]).shape[1]
    G, cnt = torch.zeros(C, d, device=c.device), torch.zeros(C, device=c.device)
    W = c.params.clone()
    lam = cfg.fedproto.lam

    def forward(row, x):
        state = c.layout.unflatten(row)
        h = functional_call(body, {k: v for k, v in state.items() if not k.startswith(last + ".")}, (x,))
        return h, h @ state[f"{last}.weight"].T + state[f"{last}.bias"]

    for t in range(rounds):
        sampled = ref.sample(t, cfg.algorithm.fraction)
        plan = c.plan(sampled, cfg.train.local_epochs, t)
        sums, counts = torch.zeros(C, d, device=c.device), torch.zeros(C, device=c.device)
        for r, k in enumerate(sampled):
            w = W[k].clone()
            for s in range(plan.steps):
                idx = plan.idx[r, s]
                idx = idx[idx >= 0]
                if len(idx) == 0:
                    continue
                leaf = w.clone().requires_grad_(True)
                h, z = forward(leaf, c.x[idx])
                y = c.y[idx]
                reg = torch.stack([((h[b] - G[y[b]]) ** 2).mean() if cnt[y[b]] > 0 else h[b].sum() * 0
                                   for b in range(len(idx))])
                loss = (F.cross_entropy(z, y, reduction="none") + lam * reg).mean()
                (g,) = torch.autograd.grad(loss, leaf)
                w = w - cfg.train.lr * g
            W[k] = w
            lo, hi = c.split_range(int(k), "train")
            with torch.no_grad():
                h, _ = forward(w, c.x[lo:hi])
            for cl in range(C):  # the client's prototype, weighted by its count
                mask = c.y[lo:hi] == cl
                if mask.any():
                    sums[cl] += mask.sum() * h[mask].mean(0)
                    counts[cl] += mask.sum()
        G = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], G)
        cnt = torch.where(counts > 0, counts, cnt)
    return ref, W, G, cnt, forward


@pytest.mark.parametrize("batched", ["auto", "off"])
def test_fedproto_equals_plain_torch_reference(mpi, batched):
    cfg = small_cfg(**{"train.batched": batched})
    ctx = make_ctx(cfg, mpi)
    state = fedproto.init(ctx)
    outs = []
    for t in range(2):
        ctx.comm.reset_counters()  # as the runtime does each round
        outs.append(fedproto.round(ctx, state, t))
    ref, W, G, cnt, forward = reference(cfg)
    torch.testing.assert_close(ctx.clients.params, W[ctx.comm.local_ids], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state.protos, G, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state.counts, cnt)
    # the round's log: what each sampled client sent
    sampled = ref.sample(1, cfg.algorithm.fraction)
    sent = outs[1].extras["class_count"]
    for r, k in enumerate(ctx.comm.local_ids):
        assert (sent[r].sum() > 0) == (k in sampled)
        if k in sampled:
            assert sent[r].sum() == ctx.clients.sizes[r, 0]
    # exchanged bytes: C (d + 1) floats up per sampled client, C d down per client
    C, d = G.shape
    bytes_sent = ctx.comm.bytes_sent
    assert set(bytes_sent.tolist()) <= {0, 4 * C * (d + 1)} and (ctx.comm.bytes_recv == 4 * C * d).all()
    assert 4 * C * (d + 1) < ctx.clients.P * 4  # less than a model, even this tiny one

    metrics = fedproto.evaluate(ctx, state, 1)
    c = ref.clients
    for r, k in enumerate(ctx.comm.local_ids):
        lo, hi = c.split_range(int(k), "test")
        with torch.no_grad():
            h, _ = forward(W[k], c.x[lo:hi])
        dist = ((h[:, None, :] - G[None]) ** 2).mean(-1).masked_fill(cnt == 0, float("inf"))
        acc = (dist.argmin(1) == c.y[lo:hi]).float().mean().item()
        assert abs(metrics["test_acc"][r] - acc) < 1e-6


def test_prototype_term_changes_training_and_lam_zero_is_plain_training(mpi):
    runs = {}
    for lam in (0.0, 2.0):
        cfg = small_cfg(**{"fedproto.lam": lam, "algorithm.fraction": 1.0})
        ctx = make_ctx(cfg, mpi)
        state = fedproto.init(ctx)
        for t in range(2):
            fedproto.round(ctx, state, t)
        runs[lam] = ctx.comm.allgather_rows(ctx.clients.params)  # every client, also on a rank with none
    plain = make_ctx(small_cfg(**{"algorithm.fraction": 1.0}), mpi)
    for t in range(2):
        plain.clients.train(np.arange(plain.comm.n_local), 2, t)
    np.testing.assert_allclose(runs[0.0], plain.comm.allgather_rows(plain.clients.params), rtol=1e-5, atol=1e-6)
    assert not np.allclose(runs[0.0], runs[2.0], atol=1e-4)
