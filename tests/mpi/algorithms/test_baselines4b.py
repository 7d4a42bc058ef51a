"""pFedMe and FedAMP against plain single-process torch references of their
update equations (5 clients, or one per rank, 3 rounds), their reductions (pFedMe
at lam = 0: the global model stays w^0 and theta_i is Local restarted from it;
FedAMP at lam = 0: ``local`` with ``sampled_only``, bit for bit), and the same
bits on any number of ranks as in one process.

Bits: as tests/mpi/algorithms/test_baselines4.py's: one CPU and thread count, ranks against one
process client by client (any x86 kind), batched within a tolerance."""

import math

import numpy as np
import pytest
import serial_ref
import torch
from plain_ref import fedavg as average
from serial_ref import gathered, loss_of, make_ctx

from mpifl import algorithms
from mpifl.comm import solo

ROUNDS = 3


def make_cfg(mpi, **over):
    return serial_ref.baseline_cfg(mpi, **over)


def run(cfg, mpi, rounds=ROUNDS):
    return serial_ref.run_rounds(cfg, mpi, rounds)


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def plain_pfedme(ref, start, k, t, lam, K, eta_p):
    """Client k's (w_k, theta_k) after round t: on each batch K plain-GD steps of
    theta on f + (lam/2)||theta - w||^2, then w <- w - eta lam (w - theta)."""
    c, lr = ref.clients, ref.cfg.train.lr
    plan = c.plan(np.array([k]), ref.cfg.train.local_epochs, t)
    w, th = start.clone(), start.clone()
    for s in range(plan.steps):
        idx = plan.idx[0, s]
        idx = idx[idx >= 0]
        if len(idx) == 0:
            continue
        for _ in range(K):
            leaf = th.clone().requires_grad_(True)
            (g,) = torch.autograd.grad(loss_of(c, leaf, idx), leaf)
            th = (th - eta_p * (g + lam * (th - w))).detach()
        w = w - lr * lam * (w - th)
    return w, th


@pytest.mark.parametrize(("batched", "all_train", "beta"), [("on", True, 1.0), ("off", True, 0.7),
                                                           ("on", False, 1.5)])
def test_pfedme_matches_plain_torch(mpi, batched, all_train, beta):
    lam, K, eta_p = 2.0, 3, 0.05
    cfg = make_cfg(mpi, **{"algorithm.name": "pfedme", "pfedme.lam": lam, "pfedme.K": K, "pfedme.personal_lr": eta_p,
                           "pfedme.beta": beta, "pfedme.all_train": all_train, "train.batched": batched})
    ctx, _, state, outs = run(cfg, mpi)
    ref = make_ctx(cfg, solo())
    model = ref.clients.init.clone()
    theta = {k: model.clone() for k in range(ref.N)}
    for t in range(ROUNDS):
        sampled = [int(k) for k in ref.sample(t, cfg.algorithm.fraction)]
        rows = {}
        for k in range(ref.N) if all_train else sampled:
            rows[k], theta[k] = plain_pfedme(ref, model, k, t, lam, K, eta_p)
        mean = average(ref, {k: rows[k] for k in sampled})
        model = model + beta * (mean - model)
    close(state.model, model)
    for r, i in enumerate(ctx.comm.local_ids):
        close(state.theta[r], theta[int(i)])
        assert np.isclose(outs[-1].extras["dist_to_global"][r], float(torch.linalg.vector_norm(theta[int(i)] - model)),
                          rtol=1e-3)
        if all_train or int(i) in sampled:
            close(ctx.clients.params[r], rows[int(i)])
            assert np.isclose(outs[-1].extras["dist_to_local"][r],
                              float(torch.linalg.vector_norm(theta[int(i)] - rows[int(i)])), rtol=1e-3, atol=1e-6)
    trained = np.isfinite(outs[-1].train_loss)
    assert trained.all() if all_train else trained.sum() == len(ctx.local_of(np.array(sampled)))
    # clients are evaluated on theta_i
    got = algorithms.get("pfedme").evaluate(ctx, state, ROUNDS - 1)["test_acc"]
    np.testing.assert_allclose(got, ctx.clients.evaluate("test", state.theta)[1])


def test_pfedme_with_lam_0_is_local_restarted_from_the_initial_model(mpi):
    """lam = 0: w_i never moves from w^t (bit for bit), so w^t stays w^0 (to the
    rounding of averaging identical rows); with K = 1 and eta_p = train.lr theta_i
    after round t is w^0 trained as a ``local`` client trains in round t
    (Clients.train from w^0 on the same batches)."""
    cfg = make_cfg(mpi, **{"algorithm.name": "pfedme", "pfedme.lam": 0, "pfedme.K": 1, "pfedme.personal_lr": 0.1})
    ctx, algo, state, _ = run(cfg, mpi, rounds=ROUNDS - 1)
    before = state.model.clone()
    algo.round(ctx, state, ROUNDS - 1)
    assert torch.equal(ctx.clients.params, before.expand_as(ctx.clients.params))
    torch.testing.assert_close(state.model, ctx.clients.init, rtol=0, atol=1e-6)
    loc = make_ctx(make_cfg(mpi, **{"algorithm.name": "local"}), mpi)
    loc.clients.params[:] = loc.clients.init
    loc.clients.train(np.arange(loc.comm.n_local), cfg.train.local_epochs, ROUNDS - 1)
    torch.testing.assert_close(state.theta, loc.clients.params, rtol=1e-5, atol=1e-6)
    assert not torch.equal(state.theta, state.model.expand_as(state.theta))  # it did train


def plain_attention(models, alpha, sigma):
    m = len(models)
    xi = np.zeros((m, m))
    for i in range(m):
        for j in range(m):
            if i != j:
                d = float(((models[i].double() - models[j].double()) ** 2).sum())
                xi[i, j] = alpha * math.exp(-d / sigma) / sigma
        xi[i, i] = 1 - xi[i].sum()
    return xi


@pytest.mark.parametrize("batched", ["on", "off"])
def test_fedamp_matches_plain_torch(mpi, batched):
    alpha, lam, sigma = 0.3, 0.5, 2.0  # sigma near the models' squared distances: distinct weights
    cfg = make_cfg(mpi, **{"algorithm.name": "fedamp", "fedamp.alpha": alpha, "fedamp.lam": lam,
                           "fedamp.sigma": sigma, "train.batched": batched})
    ctx, _, _, outs = run(cfg, mpi)
    ref = make_ctx(cfg, solo())
    models = {k: ref.clients.init.clone() for k in range(ref.N)}
    for t in range(ROUNDS):
        sampled = [int(k) for k in ref.sample(t, cfg.algorithm.fraction)]
        xi = plain_attention([models[k] for k in sampled], alpha, sigma)
        u = {k: sum(float(xi[a, b]) * models[j] for b, j in enumerate(sampled)) for a, k in enumerate(sampled)}
        for k in sampled:
            models[k] = serial_ref.sgd(ref.clients, models[k], k, t, cfg.train.local_epochs, cfg.train.lr,
                                       pull=lambda v, u=u[k]: lam / alpha * (v - u))
    for r, i in enumerate(ctx.comm.local_ids):
        close(ctx.clients.params[r], models[int(i)])
    mixing = gathered(ctx, outs[-1].mixing.rows)
    np.testing.assert_allclose(mixing[np.ix_(sampled, sampled)], xi, rtol=1e-5, atol=1e-7)
    off = np.ones(ref.N, bool)
    off[sampled] = False
    np.testing.assert_array_equal(mixing[off], np.eye(ref.N)[off])
    assert np.ptp(xi[~np.eye(len(sampled), dtype=bool)]) > 1e-3  # the attention told the clients apart
    dist = gathered(ctx, outs[-1].extras["dist_to_message"])
    want = [float(torch.linalg.vector_norm(models[k] - u[k])) for k in sampled]
    np.testing.assert_allclose(dist[sampled], want, rtol=1e-3)
    assert np.isnan(dist[off]).all()


@pytest.mark.parametrize("batched", ["on", "off"])
def test_fedamp_with_lam_0_is_local_sampled_only_bit_for_bit(mpi, batched):
    amp, _, _, _ = run(make_cfg(mpi, **{"algorithm.name": "fedamp", "fedamp.lam": 0, "train.batched": batched}), mpi)
    loc, _, _, _ = run(make_cfg(mpi, **{"algorithm.name": "local", "local.sampled_only": True,
                                        "train.batched": batched}), mpi)
    assert torch.equal(amp.clients.params, loc.clients.params)
    assert not torch.equal(amp.clients.params, amp.clients.init.expand_as(amp.clients.params))


@pytest.mark.parametrize("batched", ["off", "on"])
@pytest.mark.parametrize("name", ["pfedme", "fedamp"])
def test_the_same_bits_on_any_number_of_ranks_as_in_one_process(mpi, name, batched):
    """As tests/mpi/algorithms/test_baselines4.py's: client by client the global state, every
    client's rows, personalized models, mixing rows and logs agree bit for bit;
    batched, to float tolerance."""
    cfg = make_cfg(mpi, **{"algorithm.name": name, "train.batched": batched, "fedamp.sigma": 2.0, "pfedme.K": 2})
    ctx, algo, state, outs = run(cfg, mpi)
    one, alone, last = serial_ref.in_one_process(cfg, algo, ROUNDS)
    ids = torch.as_tensor(ctx.comm.local_ids)
    same = torch.equal if batched == "off" else (lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-6))
    pairs = [("rows", ctx.clients.params, one.clients.params[ids])]
    if name == "pfedme":
        pairs += [("model", state.model, alone.model), ("theta", state.theta, alone.theta[ids])]
    else:
        pairs += [("mixing", torch.as_tensor(outs[-1].mixing.rows),
                   torch.as_tensor(last.mixing.rows[ctx.comm.local_ids]))]
    extras = [(k, v, last.extras[k][ctx.comm.local_ids]) for k, v in outs[-1].extras.items()]
    pairs += [(k, torch.as_tensor(a), torch.as_tensor(b)) for k, a, b in extras]
    # NaN (FedAMP's distance outside S) where the other has NaN, the rest the same
    bad = [k for k, a, b in pairs if not (torch.equal(a.isnan(), b.isnan()) and same(a.nan_to_num(), b.nan_to_num()))]
    assert not bad, bad
    got, want = algo.evaluate(ctx, state, ROUNDS - 1), algo.evaluate(one, alone, ROUNDS - 1)
    for k, v in got.items():
        np.testing.assert_allclose(v, want[k][ctx.comm.local_ids], rtol=1e-5, err_msg=k)
