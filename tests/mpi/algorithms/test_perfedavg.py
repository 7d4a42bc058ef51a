"""Per-FedAvg (FO and HF) under MPI equals a plain single-process reference of
the paper's equations (3 clients, 2 rounds, the same batches), and its
evaluation is the one-step adaptation on a copy.

Bits: the one exact comparison is of the state before and after an evaluation
(copies): any CPU. The comparisons with the reference use tolerances."""

import numpy as np
import pytest
import torch
from plain_ref import ROUNDS, batch_indices, fedavg, grad, logits, make_ctx, reference, small_cfg, split_metrics

from mpifl.algorithms import perfedavg


def plain_perfedavg(cfg):
    ref = reference(cfg)
    c, E, B = ref.clients, cfg.train.local_epochs, cfg.train.batch_size
    a, d, hf = cfg.perfedavg.alpha, cfg.perfedavg.delta, cfg.perfedavg.variant == "hf"
    beta = cfg.perfedavg.beta or cfg.train.lr
    k_parts = 3 if hf else 2
    model = c.init.clone()
    for t in range(ROUNDS):
        trained = {}
        for k in ref.sample(t, cfg.algorithm.fraction):
            w = model.clone()
            # one batch of k_parts * B samples per step, split into D, D' (, D'')
            for idx in batch_indices(c, k, t, E, batch_size=k_parts * B):
                D1, D2, D3 = idx[:B], idx[B:2 * B], idx[2 * B:3 * B]
                u = grad(c, w - a * grad(c, w, D1), D2)
                if hf:
                    u = u - a * (grad(c, w + d * u, D3) - grad(c, w - d * u, D3)) / (2 * d)
                w = w - beta * u
            trained[k] = w
        model = fedavg(ref, trained)
    adapted = {}
    for k in range(ref.N):  # evaluation: one step of size alpha on one training batch
        (idx,) = batch_indices(c, k, ROUNDS - 1, 1, purpose="adapt", max_batches=1)
        adapted[k] = model - a * grad(c, model, idx)
    return ref, model, adapted


@pytest.mark.parametrize(("variant", "batched", "beta"),
                         [("fo", "auto", 0.0), ("hf", "auto", 0.03), ("fo", "off", 0.03), ("hf", "off", 0.0)])
def test_perfedavg_matches_plain_reference(mpi, variant, batched, beta):
    cfg = small_cfg("perfedavg", **{"perfedavg.variant": variant, "train.batched": batched, "perfedavg.beta": beta,
                                    "perfedavg.alpha": 0.05})
    ctx = make_ctx(cfg, mpi)
    state = perfedavg.init(ctx)
    for t in range(ROUNDS):
        out = perfedavg.round(ctx, state, t)
    metrics = perfedavg.evaluate(ctx, state, ROUNDS - 1)
    rows = perfedavg.adapted(ctx, state.model, ROUNDS - 1)

    ref, model, adapted = plain_perfedavg(cfg)
    torch.testing.assert_close(state.model, model, rtol=1e-5, atol=1e-6)
    for r, k in enumerate(ctx.comm.local_ids):
        torch.testing.assert_close(rows[r], adapted[k], rtol=1e-5, atol=1e-6)
        loss, acc = split_metrics(ref.clients, k, "test", lambda idx, m=adapted[k]: logits(ref.clients, m, idx))
        assert metrics["test_loss"][r] == pytest.approx(loss, rel=1e-5)
        assert metrics["test_acc"][r] == pytest.approx(acc)
        # the global model before adaptation, logged beside it
        _, acc0 = split_metrics(ref.clients, k, "test", lambda idx: logits(ref.clients, model, idx))
        assert out.extras["global_test_acc"][r] == pytest.approx(acc0)
    assert np.isclose(out.mixing.row.sum(), 1.0)


def test_hf_differs_from_fo_and_evaluation_changes_no_training_state(mpi):
    models = {}
    for variant in ("fo", "hf"):
        ctx = make_ctx(small_cfg("perfedavg", **{"perfedavg.variant": variant, "perfedavg.alpha": 0.05}), mpi)
        state = perfedavg.init(ctx)
        perfedavg.round(ctx, state, 0)
        before = state.model.clone(), ctx.clients.params.clone()
        perfedavg.evaluate(ctx, state, 0)
        assert torch.equal(before[0], state.model) and torch.equal(before[1], ctx.clients.params)
        models[variant] = state.model
    assert not torch.allclose(models["fo"], models["hf"], rtol=1e-5, atol=1e-6)
