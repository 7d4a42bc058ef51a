"""APFL under MPI equals a plain single-process reference of the paper's
equations (3 clients, 2 rounds, the same batches).

Bits: the one exact comparison is of the training state before and after an
evaluation (copies, nothing recomputed): it holds on any CPU. The comparisons with
the reference use tolerances."""

import numpy as np
import pytest
import torch
from plain_ref import ROUNDS, batch_indices, fedavg, grad, logits, make_ctx, reference, small_cfg, split_metrics

from mpifl.algorithms import apfl


def plain_apfl(cfg):
    """w, v_i, alpha_i by the equations of apfl.py's docstring, in plain torch."""
    ref = reference(cfg)
    c, lr, E = ref.clients, cfg.train.lr, cfg.train.local_epochs
    w_glob = c.init.clone()
    v = {k: c.init.clone() for k in range(ref.N)}
    alpha = {k: cfg.apfl.alpha for k in range(ref.N)}
    for t in range(ROUNDS):
        trained = {}
        for k in ref.sample(t, cfg.algorithm.fraction):
            w, a = w_glob.clone(), alpha[k]
            for idx in batch_indices(c, k, t, E):
                vbar = a * v[k] + (1 - a) * w
                g_w, g_bar = grad(c, w, idx), grad(c, vbar, idx)
                a_new = float(np.clip(a - lr * float(torch.dot(v[k] - w, g_bar)), 0.0, 1.0))
                w, v[k] = w - lr * g_w, v[k] - lr * a * g_bar
                if cfg.apfl.adaptive:
                    a = a_new
            trained[k], alpha[k] = w, a
        w_glob = fedavg(ref, trained)
    return ref, w_glob, v, alpha


@pytest.mark.parametrize(("batched", "adaptive"), [("auto", True), ("off", True), ("auto", False)])
def test_apfl_matches_plain_reference(mpi, batched, adaptive):
    cfg = small_cfg("apfl", **{"train.batched": batched, "apfl.adaptive": adaptive, "apfl.alpha": 0.3})
    ctx = make_ctx(cfg, mpi)
    state = apfl.init(ctx)
    for t in range(ROUNDS):
        out = apfl.round(ctx, state, t)
    metrics = apfl.evaluate(ctx, state, ROUNDS - 1)

    ref, w, v, alpha = plain_apfl(cfg)
    torch.testing.assert_close(state.model, w, rtol=1e-5, atol=1e-6)
    for r, k in enumerate(ctx.comm.local_ids):
        torch.testing.assert_close(state.v[r], v[k], rtol=1e-5, atol=1e-6)
        assert state.alpha[r].item() == pytest.approx(alpha[k], rel=1e-5, abs=1e-7)
        np.testing.assert_allclose(out.extras["alpha"][r], alpha[k], rtol=1e-5, atol=1e-7)
        # evaluated on the mixture with the new global model
        mix = alpha[k] * v[k] + (1 - alpha[k]) * w
        loss, acc = split_metrics(ref.clients, k, "test", lambda idx, mix=mix: logits(ref.clients, mix, idx))
        assert metrics["test_loss"][r] == pytest.approx(loss, rel=1e-5)
        assert metrics["test_acc"][r] == pytest.approx(acc)
    moved = [abs(alpha[k] - 0.3) > 1e-6 for k in range(ref.N)]
    assert any(moved) == adaptive  # alpha learns only when adaptive
    sampled = ref.sample(ROUNDS - 1, cfg.algorithm.fraction)
    assert np.count_nonzero(out.mixing.row) == len(sampled) and np.isclose(out.mixing.row.sum(), 1.0)


def test_apfl_evaluation_changes_no_training_state(mpi):
    ctx = make_ctx(small_cfg("apfl"), mpi)
    state = apfl.init(ctx)
    apfl.round(ctx, state, 0)
    before = (state.model.clone(), state.v.clone(), state.alpha.clone(), ctx.clients.params.clone())
    apfl.evaluate(ctx, state, 0)
    after = (state.model, state.v, state.alpha, ctx.clients.params)
    assert all(torch.equal(a, b) for a, b in zip(before, after))
