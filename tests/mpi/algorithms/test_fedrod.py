"""FedRoD under MPI equals a plain single-process reference of the paper's
equations (3 clients, 2 rounds, the same batches): balanced softmax on the
shared model, a personal linear head on detached features and generic logits,
prediction = generic + personal logits.

Bits: the exact comparisons are of the log-prior of absent classes (the constant
-1e4) and of the state before and after an evaluation (copies): they hold on any
CPU. The comparisons with the reference use tolerances."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from plain_ref import ROUNDS, batch_indices, fedavg, grad, logits, make_ctx, reference, small_cfg, split_metrics
from torch.func import functional_call

from mpifl.algorithms import fedrod


def plain_fedrod(cfg):
    ref = reference(cfg)
    c, lr, E = ref.clients, cfg.train.lr, cfg.train.local_epochs
    body = c.model[:-1]  # the MLP without its last Linear
    last = str(len(c.model) - 1)

    def features(flat, idx):
        state = {k: v for k, v in c.layout.unflatten(flat).items() if not k.startswith(last + ".")}
        return functional_call(body, state, (c.x[idx],))

    def head_of(flat):
        p = c.layout.unflatten(flat)
        return p[f"{last}.weight"].clone(), p[f"{last}.bias"].clone()

    log_prior = {}
    for k in range(ref.N):
        lo, hi = c.split_range(k, "train")
        counts = torch.bincount(c.y[lo:hi], minlength=c.n_classes).float()
        log_prior[k] = (counts / counts.sum()).log()  # -inf for an absent class: the paper's prior
    model = c.init.clone()
    heads = {k: head_of(c.init) for k in range(ref.N)}
    for t in range(ROUNDS):
        trained = {}
        for k in ref.sample(t, cfg.algorithm.fraction):
            w = model.clone()
            Wp, bp = heads[k]
            for idx in batch_indices(c, k, t, E):
                idx = idx[idx >= 0]
                with torch.no_grad():
                    h, z_g = features(w, idx), logits(c, w, idx)
                g = grad(c, w, idx, bias=log_prior[k])  # balanced softmax
                Wl, bl = Wp.clone().requires_grad_(True), bp.clone().requires_grad_(True)
                loss = F.cross_entropy(z_g + h @ Wl.T + bl, c.y[idx])
                gW, gb = torch.autograd.grad(loss, (Wl, bl))
                w, Wp, bp = w - lr * g, Wp - lr * gW, bp - lr * gb
            trained[k], heads[k] = w, (Wp, bp)
        model = fedavg(ref, trained)
    return ref, model, heads, features


@pytest.mark.parametrize("batched", ["auto", "on-vmap", "off"])
def test_fedrod_matches_plain_reference(mpi, batched):
    cfg = small_cfg("fedrod", **{"train.batched": batched.split("-")[0]})
    ctx = make_ctx(cfg, mpi)
    if batched == "on-vmap":  # not a plain Linear/ReLU Sequential: the vmap path
        ctx.clients.stacked = None
    state = fedrod.init(ctx)
    for t in range(ROUNDS):
        out = fedrod.round(ctx, state, t)
    metrics = fedrod.evaluate(ctx, state, ROUNDS - 1)

    ref, model, heads, features = plain_fedrod(cfg)
    c = ref.clients
    torch.testing.assert_close(state.model, model, rtol=1e-5, atol=1e-6)
    C = c.n_classes
    for r, k in enumerate(ctx.comm.local_ids):
        Wp, bp = heads[k]
        mine = state.head[r].view(C, -1)
        torch.testing.assert_close(mine[:, :-1], Wp, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(mine[:, -1], bp, rtol=1e-5, atol=1e-6)
        # prediction = generic logits + personal logits
        loss, acc = split_metrics(c, k, "test",
                                  lambda idx, Wp=Wp, bp=bp: logits(c, model, idx) + features(model, idx) @ Wp.T + bp)
        assert metrics["test_loss"][r] == pytest.approx(loss, rel=1e-5)
        assert metrics["test_acc"][r] == pytest.approx(acc)
        _, acc_g = split_metrics(c, k, "test", lambda idx: logits(c, model, idx))
        assert out.extras["generic_test_acc"][r] == pytest.approx(acc_g)
    sampled = ref.sample(ROUNDS - 1, cfg.algorithm.fraction)
    assert np.count_nonzero(out.mixing.row) == len(sampled)
    trained = np.isin(ctx.comm.local_ids, sampled)
    assert np.all(np.isfinite(out.extras["bsm_loss"][trained])) and np.all(np.isnan(out.extras["bsm_loss"][~trained]))


def test_fedrod_absent_classes_and_evaluation_keep_state(mpi):
    ctx = make_ctx(small_cfg("fedrod"), mpi)
    hist = ctx.data.label_hist[ctx.comm.local_ids]
    prior = fedrod.log_prior(ctx)
    assert torch.equal(prior[torch.as_tensor(hist == 0)].cpu(), torch.full((int((hist == 0).sum()),), -1e4))
    state = fedrod.init(ctx)
    fedrod.round(ctx, state, 0)
    before = state.model.clone(), state.head.clone(), ctx.clients.params.clone()
    fedrod.evaluate(ctx, state, 0)
    assert all(torch.equal(a, b) for a, b in zip(before, (state.model, state.head, ctx.clients.params)))
    assert torch.isfinite(state.head).all()
