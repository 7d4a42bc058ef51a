"""SCAFFOLD, FedDyn and MOON against plain single-process torch references of
their update equations (5 clients, or one per rank, 3 rounds: the control
variates, gradient states and previous models act from the second), their
reductions to FedAvg (zero control variates; alpha = 0; mu = 0) bit for bit, and
the same bits on any number of ranks as in one process for every new baseline.

Bits: one job, one CPU, one thread count; across ranks client by client
(``train.batched=off``: the same torch calls on the same rows), so on AVX2 and
AVX-512 alike; batched runs agree within a tolerance (docs/reliability.md)."""

import contextlib

import numpy as np
import pytest
import serial_ref
import torch
import torch.nn.functional as F
from plain_ref import batch_indices, logits, valid
from plain_ref import fedavg as average
from serial_ref import make_ctx
from torch.func import functional_call

from mpifl.algorithms import scaffold
from mpifl.comm import solo

ROUNDS = 3


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's intra-op threads set to ``n`` for the block (one: plain training's fused SGD path)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def make_cfg(mpi, **over):
    return serial_ref.baseline_cfg(mpi, **over)


def run(cfg, mpi, rounds=ROUNDS):
    return serial_ref.run_rounds(cfg, mpi, rounds)


def sgd(ref, w, k, t, epochs, **kw):
    return serial_ref.sgd(ref.clients, w, k, t, epochs, ref.cfg.train.lr, **kw)


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def plain_steps(ref, k: int, t: int) -> int:
    """Client k's number of local steps in round t (its batches with samples)."""
    return int((ref.clients.plan(np.array([k]), ref.cfg.train.local_epochs, t).idx >= 0).any(2).sum())


@pytest.mark.parametrize(("batched", "weights"), [("on", "p"), ("off", "p"), ("on", "uniform")])
def test_scaffold_matches_plain_torch(mpi, batched, weights):
    cfg = make_cfg(mpi, **{"algorithm.name": "scaffold", "scaffold.lr": 0.8, "train.batched": batched,
                           "scaffold.weights": weights})
    ctx, _, state, outs = run(cfg, mpi, rounds=ROUNDS)
    ref = make_ctx(cfg, solo())
    lr = cfg.train.lr
    p = ref.p if weights == "p" else np.full(ref.N, 1 / ref.N)  # the paper's 1/N for Delta c
    x, c = ref.clients.init.clone(), torch.zeros_like(ref.clients.init)
    ci = {k: torch.zeros_like(x) for k in range(ref.N)}
    for t in range(ROUNDS):
        sampled = [int(k) for k in ref.sample(t, cfg.algorithm.fraction)]
        rows, dc = {}, torch.zeros_like(x)
        for k in sampled:
            rows[k] = sgd(ref, x, k, t, cfg.train.local_epochs, pull=lambda _, k=k, c=c: c - ci[k])
            new = ci[k] - c + (x - rows[k]) / (plain_steps(ref, k, t) * lr)
            dc, ci[k] = dc + p[k] * (new - ci[k]), new
        mean = average(ref, rows) if weights == "p" else sum(rows.values()) / len(rows)
        x = x + 0.8 * (mean - x)
        c = c + dc
    close(state.model, x)
    close(state.c, c)
    for r, i in enumerate(ctx.comm.local_ids):
        close(state.ci[r], ci[int(i)])
        assert np.isclose(outs[-1].extras["ci_norm"][r], float(torch.linalg.vector_norm(ci[int(i)])), rtol=1e-4)
        assert np.isclose(outs[-1].extras["correction_norm"][r], float(torch.linalg.vector_norm(c - ci[int(i)])),
                          rtol=1e-4)
    assert np.allclose(outs[-1].extras["c_norm"], float(torch.linalg.vector_norm(c)), rtol=1e-4)
    # the server's variate is the clients' sum weighted as Delta c (p, or 1/N) at every round
    every = torch.as_tensor(ctx.comm.allgather_rows(state.ci.cpu().numpy()), dtype=torch.float64)
    close(state.c.double().cpu(), (torch.as_tensor(p)[:, None] * every).sum(0))


@pytest.mark.parametrize("threads", [1, 2])  # one thread: the fused SGD path of plain training
def test_scaffold_with_zero_control_variates_is_fedavg_bit_for_bit(mpi, threads):
    with torch_threads(threads):
        ctx = make_ctx(make_cfg(mpi, **{"algorithm.name": "scaffold", "scaffold.weights": "p"}), mpi)
        state = scaffold.init(ctx)
        for t in range(ROUNDS):
            state.c.zero_()
            state.ci.zero_()
            scaffold.round(ctx, state, t)
        _, _, avg, _ = run(make_cfg(mpi, **{"algorithm.name": "fedavg"}), mpi, rounds=ROUNDS)
    assert torch.equal(state.model, avg.model)


def adam_steps(ref, start: torch.Tensor, k: int, t: int, pull: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Client k's row after torch.optim.Adam from ``start`` on its planned batches, each
    gradient plus ``pull``, and the mean of its raw minibatch gradients."""
    plan = ref.clients.plan(np.array([k]), ref.cfg.train.local_epochs, t)
    w = start.clone().requires_grad_(True)
    opt = torch.optim.Adam([w], lr=ref.cfg.train.lr)  # betas (0.9, 0.999), eps 1e-8: mpifl's
    total, K = torch.zeros_like(start), 0
    for s in range(plan.steps):
        idx = plan.idx[0, s]
        idx = idx[idx >= 0]
        if len(idx) == 0:
            continue
        (g,) = torch.autograd.grad(serial_ref.loss_of(ref.clients, w, idx), w)
        total, K = total + g, K + 1
        w.grad = g + pull
        opt.step()
    return w.detach(), total / K


@pytest.mark.parametrize("batched", ["on", "off"])
def test_scaffold_under_adam_takes_the_mean_gradient_as_its_variate(mpi, batched):
    """``scaffold.variate=auto`` under Adam: c_i^+ is the mean of the client's raw
    minibatch gradients along its steps (not option II's (x - y) / (K eta_l), which
    under Adam measures Adam's steps)."""
    cfg = make_cfg(mpi, **{"algorithm.name": "scaffold", "train.optimizer": "adam", "train.lr": 0.01,
                           "train.batched": batched})
    assert scaffold.variate(cfg) == "grads"
    ctx, _, state, _ = run(cfg, mpi, rounds=ROUNDS)
    ref = make_ctx(cfg, solo())
    x, c = ref.clients.init.clone(), torch.zeros_like(ref.clients.init)
    ci = {k: torch.zeros_like(x) for k in range(ref.N)}
    for t in range(ROUNDS):
        sampled = [int(k) for k in ref.sample(t, cfg.algorithm.fraction)]
        rows, dc = {}, torch.zeros_like(x)
        for k in sampled:
            rows[k], new = adam_steps(ref, x, k, t, c - ci[k])
            dc, ci[k] = dc + (new - ci[k]) / ref.N, new
        x = sum(rows.values()) / len(rows)  # scaffold.weights=uniform, scaffold.lr=1
        c = c + dc
    torch.testing.assert_close(state.model, x, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(state.c, c, rtol=1e-4, atol=1e-5)
    for r, i in enumerate(ctx.comm.local_ids):
        torch.testing.assert_close(state.ci[r], ci[int(i)], rtol=1e-4, atol=1e-5)
    assert any(bool(v.any()) for v in ci.values())


def test_scaffold_mean_gradient_is_option_ii_under_plain_sgd(mpi):
    """Under plain SGD, (x - y_i) / (K eta_l) = c_i - c + the mean gradient, so both
    variates give the same c_i, c and model, to rounding."""
    runs = {}
    for v in ("steps", "grads"):
        cfg = make_cfg(mpi, **{"algorithm.name": "scaffold", "scaffold.variate": v})
        runs[v] = run(cfg, mpi, rounds=ROUNDS)[2]
    assert scaffold.variate(make_cfg(mpi, **{"algorithm.name": "scaffold"})) == "steps"  # auto under sgd
    a, b = runs["steps"], runs["grads"]
    assert bool(a.ci.any())
    torch.testing.assert_close(a.ci, b.ci, rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(a.c, b.c, rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(a.model, b.model, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("alpha", [0.1, 0.5])
def test_feddyn_matches_plain_torch(mpi, alpha):
    cfg = make_cfg(mpi, **{"algorithm.name": "feddyn", "feddyn.alpha": alpha})
    ctx, _, state, outs = run(cfg, mpi, rounds=ROUNDS)
    ref = make_ctx(cfg, solo())
    theta, h = ref.clients.init.clone(), torch.zeros_like(ref.clients.init)
    grad = {k: torch.zeros_like(theta) for k in range(ref.N)}
    for t in range(ROUNDS):
        sampled = [int(k) for k in ref.sample(t, cfg.algorithm.fraction)]
        # grad R_k = grad L_k - grad L_k(theta_k^{t-1}) + alpha (theta - theta^{t-1})
        rows = {k: sgd(ref, theta, k, t, cfg.train.local_epochs,
                       pull=lambda v, k=k, c=theta: alpha * (v - c) - grad[k]) for k in sampled}
        for k in sampled:
            grad[k] = grad[k] - alpha * (rows[k] - theta)
        h = h - alpha * sum(float(ref.p[k]) * (rows[k] - theta) for k in sampled)
        theta = average(ref, rows) - h / alpha
    torch.testing.assert_close(state.model, theta, rtol=1e-4, atol=1e-5)
    close(state.h, h)
    for r, i in enumerate(ctx.comm.local_ids):
        torch.testing.assert_close(state.grad[r], grad[int(i)], rtol=1e-4, atol=1e-6)
        assert np.isclose(outs[-1].extras["grad_norm"][r], float(torch.linalg.vector_norm(grad[int(i)])), rtol=1e-3)
    assert np.allclose(outs[-1].extras["h_norm"], float(torch.linalg.vector_norm(h)), rtol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("over", [{"algorithm.name": "feddyn", "feddyn.alpha": 0},
                                  {"algorithm.name": "moon", "moon.mu": 0}])
def test_feddyn_alpha_0_and_moon_mu_0_are_fedavg_bit_for_bit(mpi, over, threads):
    with torch_threads(threads):
        _, _, got, _ = run(make_cfg(mpi, **over), mpi)
        _, _, avg, _ = run(make_cfg(mpi, **{"algorithm.name": "fedavg"}), mpi)
    assert torch.equal(got.model, avg.model) and not getattr(got, "h", torch.zeros(1)).any()


@pytest.mark.parametrize("batched", ["off", "on"])
@pytest.mark.parametrize("name", ["scaffold", "feddyn", "fedbn", "fedper", "lg_fedavg", "fedbabu", "moon"])
def test_the_same_bits_on_any_number_of_ranks_as_in_one_process(mpi, name, batched):
    """Every rank also runs all clients in one process: client by client
    (``train.batched=off``) the global state, each client's rows and per-client
    state and logs agree bit for bit; batched, to float tolerance, as FedAvg's
    own (the stacked MLP's products of 3 clients and of 5 round apart: 6e-8 on
    these models)."""
    cfg = make_cfg(mpi, **{"algorithm.name": name, "train.batched": batched, "feddyn.alpha": 0.1})
    ctx, algo, state, outs = run(cfg, mpi)
    one, alone, last = serial_ref.in_one_process(cfg, algo, ROUNDS)
    ids = torch.as_tensor(ctx.comm.local_ids)
    same = torch.equal if batched == "off" else (lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-6))
    pairs = [("model", state.model, alone.model), ("rows", ctx.clients.params, one.clients.params[ids])]
    pairs += [(f, getattr(state, f), getattr(alone, f)) for f in ("c", "h") if hasattr(state, f)]
    pairs += [(f, getattr(state, f), getattr(alone, f)[ids]) for f in ("ci", "grad") if hasattr(state, f)]
    bad = [k for k, a, b in pairs if not same(a, b)]
    extras = [(k, v, last.extras[k][ctx.comm.local_ids]) for k, v in outs[-1].extras.items()]
    near = (lambda a, b: np.array_equal(a, b, equal_nan=True)) if batched == "off" else (
        lambda a, b: np.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True))
    bad += [k for k, a, b in extras if not near(a, b)]
    assert not bad, bad
    # evaluation batches the clients a rank holds: its losses round apart, as FedAvg's
    got, want = algo.evaluate(ctx, state, ROUNDS - 1), algo.evaluate(one, alone, ROUNDS - 1)
    for k, v in got.items():
        np.testing.assert_allclose(v, want[k][ctx.comm.local_ids], rtol=1e-5, err_msg=k)


def plain_moon(cfg, mu: float, tau: float):
    ref = make_ctx(cfg, solo())
    c = ref.clients
    body, last = c.model[:-1], str(len(c.model) - 1)  # the MLP without its last Linear

    def features(flat, idx):
        state = {k: v for k, v in c.layout.unflatten(flat).items() if not k.startswith(last + ".")}
        return functional_call(body, state, (c.x[idx],))

    x = c.init.clone()
    prev = {k: c.init.clone() for k in range(ref.N)}
    con_mean = {}
    for t in range(ROUNDS):
        rows = {}
        for k in (int(i) for i in ref.sample(t, cfg.algorithm.fraction)):
            w, cons = x.clone(), []
            for idx in batch_indices(c, k, t, cfg.train.local_epochs):
                idx = valid(idx)
                with torch.no_grad():
                    rg, rp = features(x, idx), features(prev[k], idx)
                leaf = w.clone().requires_grad_(True)
                h = features(leaf, idx)
                pos = F.cosine_similarity(h, rg, dim=-1) / tau
                neg = F.cosine_similarity(h, rp, dim=-1) / tau
                con = -torch.log(torch.exp(pos) / (torch.exp(pos) + torch.exp(neg))).mean()
                (g,) = torch.autograd.grad(F.cross_entropy(logits(c, leaf, idx), c.y[idx]) + mu * con, leaf)
                w, cons = (w - cfg.train.lr * g).detach(), [*cons, float(con.detach())]
            rows[k], prev[k], con_mean[k] = w, w, float(np.mean(cons))
        x = average(ref, rows)
    return x, prev, con_mean


@pytest.mark.parametrize("batched", ["on", "off"])  # vmap over the clients; one client at a time
def test_moon_matches_plain_torch(mpi, batched):
    cfg = make_cfg(mpi, **{"algorithm.name": "moon", "moon.mu": 2.0, "moon.tau": 0.5, "train.batched": batched})
    ctx, _, state, outs = run(cfg, mpi)
    x, prev, con = plain_moon(cfg, 2.0, 0.5)
    torch.testing.assert_close(state.model, x, rtol=1e-5, atol=1e-6)
    last = ctx.comm.local_ids[np.isfinite(outs[-1].train_loss)]
    for r, i in enumerate(ctx.comm.local_ids):
        torch.testing.assert_close(state.prev[r], prev[int(i)], rtol=1e-5, atol=1e-6)
        got = outs[-1].extras["contrastive"][r]
        assert np.isclose(got, con[int(i)], rtol=1e-4) if i in last else np.isnan(got)
