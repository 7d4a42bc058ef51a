"""FedProx, FedProx+FT, Ditto and FedRep against plain single-process torch
references of their equations (3 clients, or one per rank, 2 rounds, the same
batches through ``clients.plan``), and the identities FedProx(mu=0) = FedAvg and
Ditto(lam=0) = Local, under any number of ranks.

Bits: FedProx(mu = 0) = FedAvg and Ditto(lam = 0) = Local compare two runs in one
process or one job, on one CPU, at the thread count each test names (``threads``),
on the batched MLP path both take: the same torch calls on the same rows, so they
hold on AVX2 and AVX-512 alike. The other exact comparisons are of the state before
and after an evaluation (copies). The comparisons with the references use
tolerances."""

import numpy as np
import pytest
import serial_ref
import torch
import torch.nn.functional as F
from serial_ref import make_ctx
from torch.func import functional_call

from mpifl import algorithms, config
from mpifl.algorithms.base import Context
from mpifl.comm import solo
from mpifl.train.head import body_slices, find_head

ROUNDS = 2


def n_clients(mpi) -> int:
    return max(3, mpi.Get_size())


def make_cfg(mpi, **over):
    args = {"data.name": "synthetic", "data.n_samples": 300, "data.n_clients": n_clients(mpi),
            "data.partition": "dirichlet", "data.dirichlet_alpha": 0.5, "model.hidden": "[16]",
            "train.local_epochs": 2, "train.batch_size": 16, "train.lr": 0.1, "algorithm.fraction": 0.67, **over}
    return config.load(None, [f"{k}={v}" for k, v in args.items()], n_ranks=mpi.Get_size())


def run(cfg, mpi, rounds=ROUNDS):
    ctx = make_ctx(cfg, mpi)
    algo = algorithms.get(cfg.algorithm.name)
    state = algo.init(ctx)
    outs = [algo.round(ctx, state, t) for t in range(rounds)]
    return ctx, algo, state, outs


# --------------------------------------------------------------------------- plain torch


def sgd(ref: Context, w: torch.Tensor, k: int, t: int, epochs: int, **kw) -> torch.Tensor:
    return serial_ref.sgd(ref.clients, w, k, t, epochs, ref.cfg.train.lr, **kw)


def average(ref: Context, rows: dict[int, torch.Tensor]) -> torch.Tensor:
    ids = sorted(rows)
    p = ref.p[ids] / ref.p[ids].sum()
    return sum(float(pk) * rows[k].double() for pk, k in zip(p, ids)).float()


def accuracy(ref: Context, w: torch.Tensor, k: int, split: str) -> tuple[float, float]:
    c = ref.clients
    lo, hi = c.split_range(k, split)
    with torch.no_grad():
        out = functional_call(c.model, c.layout.unflatten(w), (c.x[lo:hi],))
    return float(F.cross_entropy(out, c.y[lo:hi])), float((out.argmax(1) == c.y[lo:hi]).float().mean())


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- references


@pytest.mark.parametrize("mu", [0.5, 0.1])
def test_fedprox_matches_plain_torch(mpi, mu):
    cfg = make_cfg(mpi, **{"algorithm.name": "fedprox", "fedprox.mu": mu})
    ctx, _, state, outs = run(cfg, mpi)
    ref = make_ctx(cfg, solo())
    w = ref.clients.init.clone()
    for t in range(ROUNDS):
        w0 = w
        rows = {int(k): sgd(ref, w0, int(k), t, cfg.train.local_epochs, pull=lambda v, c=w0: mu * (v - c))
                for k in ref.sample(t, cfg.algorithm.fraction)}
        drift = {k: float(torch.linalg.vector_norm(r - w0)) for k, r in rows.items()}
        w = average(ref, rows)
    close(state.model, w)
    logged = outs[-1].extras["drift"]
    for r, i in enumerate(ctx.comm.local_ids):
        assert (np.isnan(logged[r]) if int(i) not in drift else np.isclose(logged[r], drift[int(i)], rtol=1e-4))


@pytest.mark.parametrize("threads", [1, 2])  # one thread: the fused SGD path of plain training
def test_fedprox_with_mu_0_is_fedavg_bit_for_bit(mpi, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _, _, prox, _ = run(make_cfg(mpi, **{"algorithm.name": "fedprox", "fedprox.mu": 0}), mpi)
        _, _, avg, _ = run(make_cfg(mpi, **{"algorithm.name": "fedavg"}), mpi)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(prox.model, avg.model)


@pytest.mark.parametrize("name", ["fedprox_ft", "fedavg_ft"])
def test_finetuning_from_the_best_validation_model_matches_plain_torch(mpi, name):
    mu = 0.3 if name == "fedprox_ft" else 0.0
    cfg = make_cfg(mpi, **{"algorithm.name": name, "fedprox.mu": mu, "fedavg_ft.start": "best_val",
                           "fedavg_ft.ft_epochs": 4, "run.rounds": 3, "train.lr": 1.0})  # best: not the last
    ctx, algo, state, _ = run(cfg, mpi, rounds=3)
    c = ctx.clients
    own, own_opt = c.params.clone(), {k: v.clone() for k, v in c.opt.state.items()}
    got = algo.evaluate(ctx, state, 2)
    assert torch.equal(c.params, own) and all(torch.equal(c.opt.state[k], v) for k, v in own_opt.items())

    ref = make_ctx(cfg, solo())
    w, best, best_acc, best_t = ref.clients.init.clone(), None, -1.0, -1
    for t in range(3):
        w0 = w
        rows = {int(k): sgd(ref, w0, int(k), t, cfg.train.local_epochs, pull=lambda v, c=w0: mu * (v - c))
                for k in ref.sample(t, cfg.algorithm.fraction)}
        w = average(ref, rows)
        acc = np.mean([accuracy(ref, w, k, "val")[1] for k in range(ref.N)])
        if acc > best_acc:
            best, best_acc, best_t = w, acc, t
    close(state.model, w)
    close(state.best, best)
    assert state.best_round == best_t and np.isclose(state.best_acc, best_acc)
    epochs = 2 * cfg.train.local_epochs if name == "fedprox_ft" else 4  # fedprox_ft: 2 tau (DPFL)
    for r, i in enumerate(ctx.comm.local_ids):
        tuned = sgd(ref, best, int(i), 2, epochs, purpose="finetune")  # F_i alone: no pull
        loss, acc = accuracy(ref, tuned, int(i), "test")
        assert np.isclose(got["test_loss"][r], loss, rtol=1e-4) and got["test_acc"][r] == acc


@pytest.mark.parametrize("lam", [0.75, 2.0])
def test_ditto_matches_plain_torch(mpi, lam):
    cfg = make_cfg(mpi, **{"algorithm.name": "ditto", "ditto.lam": lam, "ditto.personal_epochs": 1})
    ctx, algo, state, outs = run(cfg, mpi)
    ref = make_ctx(cfg, solo())
    w = ref.clients.init.clone()
    v = {k: ref.clients.init.clone() for k in range(ref.N)}
    for t in range(ROUNDS):
        w0 = w
        sampled = [int(k) for k in ref.sample(t, cfg.algorithm.fraction)]
        for k in sampled:
            v[k] = sgd(ref, v[k], k, t, 1, pull=lambda x, c=w0: lam * (x - c))
        w = average(ref, {k: sgd(ref, w0, k, t, cfg.train.local_epochs) for k in sampled})
    close(state.model, w)
    for r, i in enumerate(ctx.comm.local_ids):
        close(state.personal[r], v[int(i)])
        assert np.isclose(outs[-1].extras["dist_to_global"][r], float(torch.linalg.vector_norm(v[int(i)] - w)),
                          rtol=1e-4)
    got = algo.evaluate(ctx, state, 1)  # clients are evaluated on their personal models
    for r, i in enumerate(ctx.comm.local_ids):
        assert np.isclose(got["test_loss"][r], accuracy(ref, v[int(i)], int(i), "test")[0], rtol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
def test_ditto_with_lam_0_gives_local_models(mpi, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        over = {"algorithm.fraction": 1.0, "ditto.lam": 0}
        _, _, ditto, _ = run(make_cfg(mpi, **{"algorithm.name": "ditto", **over}), mpi)
        ctx, _, _, _ = run(make_cfg(mpi, **{"algorithm.name": "local", **over}), mpi)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(ditto.personal, ctx.clients.params)


def test_fedrep_matches_plain_torch(mpi):
    cfg = make_cfg(mpi, **{"algorithm.name": "fedrep", "fedrep.head_epochs": 3})
    ctx, algo, state, outs = run(cfg, mpi)
    ref = make_ctx(cfg, solo())
    head = find_head(ref.clients, "mlp", "fedrep")
    body = torch.zeros(ref.clients.P, dtype=torch.bool, device=ref.clients.device)
    for s in body_slices(ref.clients, head):
        body[s] = True
    rows = {k: ref.clients.init.clone() for k in range(ref.N)}
    w = ref.clients.init.clone()
    for t in range(ROUNDS):
        sampled = [int(k) for k in ref.sample(t, cfg.algorithm.fraction)]
        for k in sampled:
            theta = torch.where(body, w, rows[k])  # global body, own head
            theta = sgd(ref, theta, k, t, 3, purpose="head", mask=(~body).float())
            rows[k] = sgd(ref, theta, k, t, cfg.train.local_epochs, mask=body.float())
        w = torch.where(body, average(ref, {k: rows[k] for k in sampled}), w)
    close(state.model[body], w[body])
    for r, i in enumerate(ctx.comm.local_ids):
        close(ctx.clients.params[r][~body], rows[int(i)][~body])  # the personal heads
    own = ctx.clients.params.clone()
    got = algo.evaluate(ctx, state, 1)  # global body + own head, for every client
    assert torch.equal(ctx.clients.params, own)
    for r, i in enumerate(ctx.comm.local_ids):
        model = torch.where(body, w, rows[int(i)])
        assert np.isclose(got["test_loss"][r], accuracy(ref, model, int(i), "test")[0], rtol=1e-4)
    assert np.isclose(outs[-1].mixing.row.sum(), 1.0)
