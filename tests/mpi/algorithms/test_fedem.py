"""FedEM against a plain single-process torch reference of the paper's E-step,
M-step and averaging (3 clients, 2 rounds, the same batches), and M = 1 = FedAvg.

Bits: the one exact comparison is of the mixture weight of a single component,
exactly 1 on any CPU; models and losses are compared within tolerances."""

import numpy as np
import torch
import torch.nn.functional as F
from serial_ref import make_ctx
from torch.func import functional_call

from mpifl import config
from mpifl.algorithms import fedavg, fedem
from mpifl.comm import solo


def small_cfg(**over):
    args = {"data.name": "synthetic", "data.n_samples": 300, "data.n_clients": 3, "data.n_clusters": 2,
            "data.partition": "clusters", "algorithm.name": "fedem", "algorithm.fraction": 0.67,
            "model.hidden": "[16]", "train.local_epochs": 2, "train.batch_size": 16, "train.lr": 0.1,
            "fedem.components": 3, **over}
    return config.load(None, [f"{k}={v}" for k, v in args.items()])


def gather_pi(ctx, state):
    return ctx.comm.allgather_rows(state.pi)


def reference(cfg, rounds=2):
    """Plain torch: every client in one process, loops over clients and components."""
    ref = make_ctx(cfg, solo())
    c = ref.clients
    comps = fedem.init(ref).components.clone()
    M, N = len(comps), ref.N
    pi = np.full((N, M), 1.0 / M)
    nll = lambda row, x, y: F.cross_entropy(functional_call(c.model, c.layout.unflatten(row), (x,)), y,  # noqa: E731
                                            reduction="none")
    for t in range(rounds):
        sampled = ref.sample(t, cfg.algorithm.fraction)
        trained = {}
        for k in sampled:
            lo, hi = c.split_range(int(k), "train")
            X, Y = c.x[lo:hi], c.y[lo:hi]
            with torch.no_grad():
                L = torch.stack([nll(comps[m], X, Y) for m in range(M)], 1)  # [n, M]
            q = torch.softmax(torch.log(torch.tensor(pi[k], dtype=torch.float32, device=L.device)) - L, 1)
            pi[k] = q.double().mean(0).cpu().numpy()
            plan = c.plan(np.array([k]), cfg.train.local_epochs, t)
            for m in range(M):
                w = comps[m].clone()
                for s in range(plan.steps):
                    idx = plan.idx[0, s]
                    idx = idx[idx >= 0]
                    leaf = w.clone().requires_grad_(True)
                    loss = (q[idx - lo, m] * nll(leaf, c.x[idx], c.y[idx])).sum() / len(idx)
                    (g,) = torch.autograd.grad(loss, leaf)
                    w = w - cfg.train.lr * g
                trained[int(k), m] = w
        p = ref.p[sampled] / ref.p[sampled].sum()
        comps = torch.stack([sum(float(pk) * trained[int(k), m].double() for pk, k in zip(p, sampled)).float()
                             for m in range(M)])
    return ref, comps, pi


def test_fedem_equals_plain_torch_reference(mpi):
    cfg = small_cfg()
    ctx = make_ctx(cfg, mpi)
    state = fedem.init(ctx)
    assert not torch.allclose(state.components[0], state.components[1])  # components start apart
    for t in range(2):
        out = fedem.round(ctx, state, t)
    ref, comps, pi = reference(cfg)
    torch.testing.assert_close(state.components, comps, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gather_pi(ctx, state), pi, rtol=1e-5, atol=1e-7)
    assert not np.allclose(pi, 1 / 3)  # the E-step moved the weights
    np.testing.assert_allclose(out.extras["pi"], pi[ctx.comm.local_ids], rtol=1e-5, atol=1e-7)

    # prediction: the pi-weighted mixture of the components' probabilities
    metrics = fedem.evaluate(ctx, state, 1)
    c = ref.clients
    for r, k in enumerate(ctx.comm.local_ids):
        lo, hi = c.split_range(int(k), "test")
        with torch.no_grad():
            probs = sum(float(pi[k, m]) * torch.softmax(
                functional_call(c.model, c.layout.unflatten(comps[m]), (c.x[lo:hi],)), -1) for m in range(3))
        acc = (probs.argmax(1) == c.y[lo:hi]).float().mean().item()
        loss = -torch.log(probs.gather(1, c.y[lo:hi, None])).mean().item()
        assert abs(metrics["test_acc"][r] - acc) < 1e-6
        np.testing.assert_allclose(metrics["test_loss"][r], loss, rtol=1e-5)


def test_fedem_with_one_component_is_fedavg(mpi):
    cfg = small_cfg(**{"fedem.components": 1, "algorithm.fraction": 1.0})
    a, b = make_ctx(cfg, mpi), make_ctx(cfg, mpi)
    sa, sb = fedem.init(a), fedavg.init(b)
    for t in range(2):
        ra = fedem.round(a, sa, t)
        fedavg.round(b, sb, t)
    torch.testing.assert_close(sa.components[0], sb.model, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ra.extras["pi"], 1.0)
    ma, mb = fedem.evaluate(a, sa, 1), fedavg.evaluate(b, sb, 1)
    for k in mb:
        np.testing.assert_allclose(ma[k], mb[k], rtol=1e-5, atol=1e-6)
