"""kNN-Per against a plain single-process torch reference (3 clients, 2 FedAvg
rounds, the same batches, then each client's kNN over its own training
embeddings interpolated with the model), and lam = 0 = FedAvg's evaluation.

Bits: the one exact comparison is of the label sums of classes no neighbour has
(zeros, on any CPU); probabilities and losses are compared within tolerances."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from serial_ref import make_ctx
from torch.func import functional_call

from mpifl import config
from mpifl.algorithms import fedavg, knn_per
from mpifl.comm import solo


def small_cfg(**over):
    args = {"data.name": "synthetic", "data.n_samples": 300, "data.n_clients": 3, "data.n_clusters": 2,
            "data.partition": "clusters", "algorithm.name": "knn_per", "algorithm.fraction": 0.67,
            "model.hidden": "[16, 8]", "train.local_epochs": 2, "train.batch_size": 16, "train.lr": 0.1,
            "knn_per.k": 5, "knn_per.lam": 0.7, "knn_per.temperature": 0.5, **over}
    return config.load(None, [f"{k}={v}" for k, v in args.items()])


def reference(cfg, rounds=2):
    ref = make_ctx(cfg, solo())
    c = ref.clients
    model = c.init.clone()
    for t in range(rounds):  # FedAvg, plain
        sampled = ref.sample(t, cfg.algorithm.fraction)
        plan = c.plan(sampled, cfg.train.local_epochs, t)
        trained = []
        for r in range(len(sampled)):
            w = model.clone()
            for s in range(plan.steps):
                idx = plan.idx[r, s]
                idx = idx[idx >= 0]
                if len(idx) == 0:
                    continue
                leaf = w.clone().requires_grad_(True)
                out = functional_call(c.model, c.layout.unflatten(leaf), (c.x[idx],))
                (g,) = torch.autograd.grad(F.cross_entropy(out, c.y[idx]), leaf)
                w = w - cfg.train.lr * g
            trained.append(w)
        p = ref.p[sampled] / ref.p[sampled].sum()
        model = sum(float(pk) * w.double() for pk, w in zip(p, trained)).float()
    return ref, model


def knn_reference(c, model, k, split, kp):
    """Plain loops: client k's interpolated probabilities on its ``split``."""
    body = torch.nn.Sequential(*list(c.model)[:-1])
    state = c.layout.unflatten(model)
    last = f"{len(c.model) - 1}."
    phi = lambda x: functional_call(body, {n: v for n, v in state.items() if not n.startswith(last)}, (x,))  # noqa: E731
    lo, hi = c.split_range(int(k), "train")
    with torch.no_grad():
        store, labels = phi(c.x[lo:hi]), c.y[lo:hi]
        a, b = c.split_range(int(k), split)
        xq = c.x[a:b]
        probs = []
        for q, pm in zip(phi(xq), torch.softmax(functional_call(c.model, state, (xq,)), -1)):
            d2 = ((store - q) ** 2).sum(1)
            order = torch.argsort(d2)[:kp.k]
            kern = torch.exp(-(d2[order] - d2[order].min()) / kp.temperature)
            pk = torch.zeros(c.n_classes, device=kern.device).index_add_(0, labels[order], kern / kern.sum())
            probs.append(kp.lam * pk + (1 - kp.lam) * pm)
    return torch.stack(probs), c.y[a:b]


@pytest.mark.parametrize("batched", ["auto", "off"])
def test_knn_per_equals_plain_torch_reference(mpi, batched):
    cfg = small_cfg(**{"train.batched": batched})
    ctx = make_ctx(cfg, mpi)
    state = knn_per.init(ctx)
    for t in range(2):
        knn_per.round(ctx, state, t)
    ref, model = reference(cfg)
    torch.testing.assert_close(state.model, model, rtol=1e-5, atol=1e-6)
    metrics = knn_per.evaluate(ctx, state, 1)
    plain = fedavg.evaluate(ctx, state, 1)
    for split in ("val", "test"):
        for r, k in enumerate(ctx.comm.local_ids):
            probs, y = knn_reference(ref.clients, model, k, split, cfg.knn_per)
            acc = (probs.argmax(1) == y).float().mean().item()
            loss = -torch.log(probs.gather(1, y[:, None])).mean().item()
            assert abs(metrics[f"{split}_acc"][r] - acc) < 1e-6
            np.testing.assert_allclose(metrics[f"{split}_loss"][r], loss, rtol=1e-5)
    # the memory changes predictions here (lam = 0.7): not FedAvg's evaluation
    ours, theirs = (ctx.comm.allgather_rows(m["test_loss"]) for m in (metrics, plain))  # a rank may hold none
    assert not np.allclose(ours, theirs, rtol=1e-3)


def test_knn_per_with_lam_zero_is_fedavg_evaluation(mpi):
    cfg = small_cfg(**{"knn_per.lam": 0.0})
    ctx = make_ctx(cfg, mpi)
    state = knn_per.init(ctx)
    for t in range(2):
        knn_per.round(ctx, state, t)
    ours, plain = knn_per.evaluate(ctx, state, 1), fedavg.evaluate(ctx, state, 1)
    for key in plain:
        np.testing.assert_allclose(ours[key], plain[key], rtol=1e-5, atol=1e-6)


def test_knn_probs_with_fewer_samples_than_k_uses_them_all():
    store = torch.tensor([[[0.0], [1.0], [5.0]]])
    labels = torch.tensor([[0, 1, 2]])
    valid = torch.tensor([[True, True, False]])  # the third entry is padding
    p = knn_per.knn_probs(store, labels, valid, torch.tensor([[[0.0]]]), k=10, n_classes=3, temperature=1.0)
    e = np.exp(-1.0)
    np.testing.assert_allclose(p[0, 0].numpy(), [1 / (1 + e), e / (1 + e), 0.0], rtol=1e-6)


def test_the_gpu_label_sums_equal_the_cpu_ones():
    """On a GPU the kNN label sums take a one-hot reduction instead of scatter_add_'s
    atomics (same bits every run); the two agree, many neighbours sharing a label."""
    g = torch.Generator().manual_seed(0)
    lab = torch.randint(0, 4, (3, 5, 7), generator=g)
    kern = torch.softmax(torch.randn(3, 5, 7, generator=g), -1)
    cpu = knn_per.label_sums(lab, kern, 6)
    torch.testing.assert_close(knn_per.one_hot_sums(lab, kern, 6), cpu, rtol=1e-6, atol=1e-7)
    assert torch.equal(cpu[..., 4:], torch.zeros(3, 5, 2)) and torch.allclose(cpu.sum(-1), torch.ones(3, 5))
