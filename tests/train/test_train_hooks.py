"""The shared training pieces the personalisation methods build on: the extra
terms of ``clients.Objective`` (proximal pull, frozen parameters, a per-client
logit bias), a custom step, and training other rows with ``Clients.using`` —
each against plain torch on every training path (stacked MLP, vmap, loop).

Bits: prox with mu = 0 is compared bit for bit with plain training: two calls in one
process at the thread count the test names (``threads``), on the same path (stacked
MLP; one thread: the fused SGD step), so it holds on AVX2 and AVX-512 alike. Frozen
parameters and restored rows are copies (``rtol=0, atol=0``); the other comparisons
use tolerances."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import DEVICE
from serial_ref import sgd
from torch.func import functional_call

from mpifl import config, models
from mpifl.data import build
from mpifl.train import Clients, Objective, Step

PATHS = {"stacked": "on", "vmap": "on", "loop": "off"}


def make(path: str, **over) -> Clients:
    batched = PATHS[path]
    args = {"data.name": "synthetic", "data.n_samples": 400, "data.n_clients": 4, "data.partition": "iid",
            "model.hidden": "[16, 8]", "train.batched": batched, "train.batch_size": 16, **over}
    cfg = config.load(None, [f"{k}={v}" for k, v in args.items()])
    data = build(cfg.data, 0, np.arange(cfg.data.n_clients))
    model = models.build(cfg.model, data.in_shape, data.n_classes, 0)
    if path == "vmap":  # an MLP that is not a plain Sequential of Linear/ReLU takes the vmap path
        model = torch.nn.Sequential(*model, torch.nn.Identity())
    c = Clients(model, data, cfg.train, DEVICE, 0)
    assert (c.batched and c.stacked is not None) == (path == "stacked") and c.batched == (batched == "on")
    return c


@pytest.mark.parametrize("path", list(PATHS))
def test_prox_term_matches_plain_torch(path):
    c = make(path)
    mu, lr = 0.3, c.cfg.lr
    center = (torch.randn(c.n, c.P) * 0.1).to(c.device)
    start = c.params.clone()
    c.train(np.arange(c.n), 2, 0, objective=Objective(prox_center=center, prox_mu=mu))
    for k in range(c.n):
        ref = sgd(c, start[k], k, 0, 2, lr, pull=lambda w, i=k: mu * (w - center[i]))
        torch.testing.assert_close(c.params[k], ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])  # one thread: the fused SGD path
def test_prox_with_zero_mu_is_plain_training(threads):
    a, b = make("stacked"), make("stacked")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a.train(np.arange(a.n), 1, 3)
        b.train(np.arange(b.n), 1, 3, objective=Objective(prox_center=b.init, prox_mu=0.0))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(a.params, b.params)  # bit for bit: the same (fused) path


@pytest.mark.parametrize("path", list(PATHS))
def test_frozen_parameters_do_not_move_and_the_rest_trains_as_alone(path):
    c = make(path)
    names = c.layout.names
    frozen = names[:-2]  # the body: only the last layer trains
    start = c.params.clone()
    c.train(np.arange(c.n), 1, 1, objective=Objective(frozen=frozen))
    for sl in c.layout.slices(frozen):
        torch.testing.assert_close(c.params[:, sl], start[:, sl], rtol=0, atol=0)
    mask = torch.ones(c.P, device=c.device)
    for sl in c.layout.slices(frozen):
        mask[sl] = 0
    for k in range(c.n):
        ref = sgd(c, start[k], k, 1, 1, c.cfg.lr, mask=mask)
        torch.testing.assert_close(c.params[k], ref, rtol=1e-5, atol=1e-6)
    assert not torch.equal(c.params[:, c.layout.slices(names[-1:])[0]], start[:, c.layout.slices(names[-1:])[0]])


@pytest.mark.parametrize("path", list(PATHS))
def test_logit_bias_is_added_inside_the_loss(path):
    c = make(path)
    bias = torch.randn(c.n, c.n_classes).to(c.device)
    start = c.params.clone()
    c.train(np.arange(c.n), 1, 2, objective=Objective(logit_bias=bias))
    for k in range(c.n):
        ref = sgd(c, start[k], k, 2, 1, c.cfg.lr, bias=bias[k])
        torch.testing.assert_close(c.params[k], ref, rtol=1e-5, atol=1e-6)


def test_using_trains_other_rows_and_restores_the_clients_own():
    c = make("stacked", **{"train.momentum": 0.9})
    own, own_opt = c.params.clone(), {k: v.clone() for k, v in c.opt.state.items()}
    other = (torch.randn(c.n, c.P) * 0.1).to(c.device)
    expected = [sgd(c, other[k], k, 0, 1, c.cfg.lr) for k in range(c.n)]
    with c.using(other):
        assert c.params is other and all(v.abs().sum() == 0 for v in c.opt.state.values())
        c.train(np.arange(c.n), 1, 0)
    assert c.params is not other
    torch.testing.assert_close(c.params, own, rtol=0, atol=0)
    for k, v in own_opt.items():
        torch.testing.assert_close(c.opt.state[k], v, rtol=0, atol=0)
    # momentum 0.9 from the fresh (zero) buffer: the rows moved, and not as plain SGD would
    assert not torch.allclose(other, own) and not torch.allclose(other[0], expected[0], atol=1e-6)


def test_using_restores_after_an_error():
    c = make("loop")
    own = c.params
    with pytest.raises(RuntimeError), c.using(torch.zeros_like(own)):
        raise RuntimeError("boom")
    assert c.params is own


def test_custom_step_sees_every_batch_and_its_losses_are_averaged():
    c = make("stacked")
    seen = []

    def step(view, x, y, w):
        seen.append((view.rows.copy(), int(w.sum())))
        return torch.full((len(view.rows),), 2.0, device=view.clients.device)

    loss = c.train(np.array([1, 3]), 2, 0, step=Step(step))
    np.testing.assert_allclose(loss, 2.0)
    counts = {r: 0 for r in (1, 3)}
    for rows, _ in seen:
        for r in rows:
            counts[int(r)] += 1
    plan = c.plan(np.array([1, 3]), 2, 0)
    assert counts == {1: int((plan.idx[0] >= 0).any(1).sum()), 3: int((plan.idx[1] >= 0).any(1).sum())}
    assert sum(n for _, n in seen) == 2 * int(c.sizes[[1, 3], 0].sum())


@pytest.mark.parametrize("path", list(PATHS))
def test_sample_weights_scale_each_sample_and_the_batch_mean_stays_over_samples(path):
    """FedEM's M-step: a batch B's loss is sum_b v_b l_b / |B| (not a weighted mean)."""
    c = make(path)
    gen = torch.Generator().manual_seed(1)
    v = (torch.rand(len(c.x), generator=gen) * 0.3).to(c.device)  # small: sum_b v_b < 1 in many batches
    start = c.params.clone()
    loss = c.train(np.arange(c.n), 2, 4, objective=Objective(sample_weight=v))
    plan = c.plan(np.arange(c.n), 2, 4)
    for k in range(c.n):
        w, seen = start[k].clone(), []
        for s in range(plan.steps):
            idx = plan.idx[k, s]
            idx = idx[idx >= 0]
            if len(idx) == 0:
                continue
            leaf = w.clone().requires_grad_(True)
            out = functional_call(c.model, c.layout.unflatten(leaf), (c.x[idx],))
            lk = (v[idx] * F.cross_entropy(out, c.y[idx], reduction="none")).sum() / len(idx)
            (g,) = torch.autograd.grad(lk, leaf)
            w = w - c.cfg.lr * g
            seen.append((float(lk.detach()), len(idx)))
        torch.testing.assert_close(c.params[k], w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(loss[k], sum(a * n for a, n in seen) / sum(n for _, n in seen), rtol=1e-5)


def test_unit_sample_weights_are_plain_training():
    a, b = make("stacked"), make("stacked")
    a.train(np.arange(a.n), 1, 3)
    b.train(np.arange(b.n), 1, 3, objective=Objective(sample_weight=torch.ones(len(b.x), device=b.device)))
    torch.testing.assert_close(a.params, b.params, rtol=1e-5, atol=1e-6)


def test_zero_sample_weights_keep_the_sample_in_a_batchnorm_batch():
    """The loop path forwards a batch's zero-weight samples too: BatchNorm normalises
    over the whole batch (as FedEM's authors' code does), and a batch whose other
    samples all have weight 0 still trains instead of failing on one sample."""
    c0 = make("loop")
    d = c0.data
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(int(np.prod(d.in_shape)), 8),
                                torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, d.n_classes))
    c = Clients(model, d, c0.cfg, DEVICE, 0)
    v = torch.rand(len(c.x), generator=torch.Generator().manual_seed(2)).to(c.device)
    v[::2] = 0.0
    start, bufs0 = c.params.clone(), c.buffers.clone()
    c.train(np.arange(c.n), 1, 5, objective=Objective(sample_weight=v))
    plan = c.plan(np.arange(c.n), 1, 5)
    for k in range(c.n):
        w, bufs = start[k].clone(), c.layout.unflatten_buffers(bufs0[k].clone())
        for s in range(plan.steps):
            idx = plan.idx[k, s]
            idx = idx[idx >= 0]
            if len(idx) == 0:
                continue
            leaf = w.clone().requires_grad_(True)
            model.train()
            out = functional_call(model, {**c.layout.unflatten(leaf), **bufs}, (c.x[idx],))
            lk = (v[idx] * F.cross_entropy(out, c.y[idx], reduction="none")).sum() / len(idx)
            (g,) = torch.autograd.grad(lk, leaf)
            w = w - c.cfg.lr * g
        torch.testing.assert_close(c.params[k], w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("local", [[1, 2], [0, 3]])  # contiguous rows (views), scattered (copies)
def test_a_step_view_writes_back_and_a_dropped_update_puts_every_state_back(local):
    c = make("stacked", **{"train.on_nonfinite": "skip", "train.momentum": 0.9})
    local = np.array(local)
    extra = {"v": torch.zeros(c.n, c.P, device=c.device), "n": torch.zeros(c.n, device=c.device),
             "opt": {"m": torch.zeros(c.n, 3, device=c.device)}}
    before = c.params.clone(), {k: v.clone() for k, v in c.opt.state.items()}

    def step(view, x, y, w):
        g, loss = view.grads(view.params, x, y, w)
        view.step_(view.params, g)
        view["v"].add_(1.0)
        view["n"].add_(1.0)
        view["opt/m"].add_(2.0)
        # the second client diverges: its whole update is dropped
        return torch.where(torch.as_tensor(view.rows == local[1], device=loss.device), torch.nan, loss)

    loss = c.train(local, 1, 0, step=Step(step, extra))
    kept, dropped = local
    steps = int((c.plan(local, 1, 0).idx[0] >= 0).any(1).sum())
    assert np.isfinite(loss[0]) and np.isnan(loss[1]) and c.skipped[dropped] == 1 and c.skipped[kept] == 0
    assert not torch.equal(c.params[kept], before[0][kept]) and torch.equal(c.params[dropped], before[0][dropped])
    assert not torch.equal(c.opt.state["buf"][kept], before[1]["buf"][kept])
    assert torch.equal(c.opt.state["buf"][dropped], before[1]["buf"][dropped])
    assert float(extra["n"][kept]) == steps and torch.all(extra["v"][kept] == steps)
    assert torch.all(extra["opt"]["m"][kept] == 2 * steps)
    assert float(extra["n"][dropped]) == 0 and not extra["v"][dropped].any() and not extra["opt"]["m"][dropped].any()
    others = np.setdiff1d(np.arange(c.n), local)
    assert not extra["n"][others].any()
