"""FedPer, LG-FedAvg and FedBABU against plain single-process torch references (3
clients, or one per rank, 3 rounds, the same batches): FedPer's and LG-FedAvg's
whole model trains, the shared layers are averaged and the others stay with each
client (with no personal part both are FedAvg bit for bit); FedBABU's body trains
under a frozen initial head and is fine-tuned whole at evaluation.

Bits: FedPer and LG-FedAvg without a personal part against FedAvg compare two runs
in one job, on one CPU, at the thread count the test names (``threads``): the same
training path and sums on the same rows, so it holds on AVX2 and AVX-512 alike.
FedBABU's head against h^0 and the state before and after an evaluation are copies,
equal on any CPU. The comparisons with the references use tolerances."""

import numpy as np
import pytest
import serial_ref
import torch
from plain_ref import fedavg
from serial_ref import make_ctx

from mpifl import algorithms, config
from mpifl.comm import solo
from mpifl.errors import ConfigError

ROUNDS = 3
# model.hidden=[16] on synthetic data: layers "1" (Linear in->16) and "3" (Linear 16->C)
PERSONAL = {"fedper": ["3.weight", "3.bias"], "lg_fedavg": ["1.weight", "1.bias"]}


def make_cfg(mpi, **over) -> config.Config:
    args = {"data.name": "synthetic", "data.n_samples": 300, "data.n_clients": max(3, mpi.Get_size()),
            "data.partition": "dirichlet", "data.dirichlet_alpha": 0.5, "model.hidden": "[16]",
            "train.local_epochs": 2, "train.batch_size": 16, "train.lr": 0.1, "algorithm.fraction": 0.67, **over}
    return config.load(None, [f"{k}={v}" for k, v in args.items()])


def run(cfg, mpi):
    ctx = make_ctx(cfg, mpi)
    algo = algorithms.get(cfg.algorithm.name)
    state = algo.init(ctx)
    return ctx, algo, state, [algo.round(ctx, state, t) for t in range(ROUNDS)]


@pytest.mark.parametrize("batched", ["on", "off"])
@pytest.mark.parametrize("name", ["fedper", "lg_fedavg"])
def test_matches_plain_torch(mpi, name, batched):
    cfg = make_cfg(mpi, **{"algorithm.name": name, "train.batched": batched})
    ctx, algo, state, outs = run(cfg, mpi)
    ref = make_ctx(cfg, solo())
    c = ref.clients
    personal = torch.zeros(c.P, dtype=torch.bool, device=c.device)
    for s in c.layout.slices(PERSONAL[name]):
        personal[s] = True
    x = c.init.clone()
    rows = {k: c.init.clone() for k in range(ref.N)}
    for t in range(ROUNDS):
        sampled = [int(k) for k in ref.sample(t, cfg.algorithm.fraction)]
        for k in sampled:
            rows[k] = serial_ref.sgd(c, torch.where(personal, rows[k], x), k, t, cfg.train.local_epochs, cfg.train.lr)
        x = torch.where(personal, x, fedavg(ref, {k: rows[k] for k in sampled}))
    torch.testing.assert_close(state.model[~personal], x[~personal], rtol=1e-5, atol=1e-6)
    got = algo.evaluate(ctx, state, ROUNDS - 1)
    for r, i in enumerate(ctx.comm.local_ids):
        k = int(i)
        torch.testing.assert_close(ctx.clients.params[r][personal], rows[k][personal], rtol=1e-5, atol=1e-6)
        drift = float(torch.linalg.vector_norm(rows[k][personal] - c.init[personal]))
        assert np.isclose(outs[-1].extras["personal_drift"][r], drift, rtol=1e-4, atol=1e-7)
        lo, hi = c.split_range(k, "test")
        loss = float(serial_ref.loss_of(c, torch.where(personal, rows[k], x), np.arange(lo, hi)))
        assert np.isclose(got["test_loss"][r], loss, rtol=1e-4)
    assert outs[0].attrs == {f"{name}_personal_params": int(personal.sum())}


@pytest.mark.parametrize("threads", [1, 2])  # one thread: the fused SGD path of plain training
@pytest.mark.parametrize("over", [{"algorithm.name": "fedper", "fedper.personal_layers": 0},
                                  {"algorithm.name": "lg_fedavg", "lg_fedavg.global_layers": 2}])
def test_no_personal_part_is_fedavg_bit_for_bit(mpi, over, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ctx, _, part, outs = run(make_cfg(mpi, **over), mpi)
        avg_ctx, _, avg, _ = run(make_cfg(mpi, **{"algorithm.name": "fedavg"}), mpi)
    finally:
        torch.set_num_threads(before)
    assert len(part.personal) == 0 and torch.equal(part.model, avg.model)
    assert torch.equal(ctx.clients.params, avg_ctx.clients.params)


@pytest.mark.parametrize(("over", "message"), [
    ({"algorithm.name": "fedper", "fedper.personal_layers": 3}, "fedper.personal_layers=3 is more than"),
    ({"algorithm.name": "lg_fedavg", "lg_fedavg.global_layers": 5}, "lg_fedavg.global_layers=5 is more than")])
def test_more_layers_than_the_model_has_is_refused(mpi, over, message):
    with pytest.raises(ConfigError, match=f"^{message} model.name='mlp''s 2 layers"):
        run(make_cfg(mpi, **over), mpi)


@pytest.mark.parametrize("batched", ["on", "off"])
def test_fedbabu_matches_plain_torch(mpi, batched):
    """The body trains with the head frozen at h^0 and is averaged; evaluation
    fine-tunes the whole model from (body, h^0) and keeps nothing of it."""
    cfg = make_cfg(mpi, **{"algorithm.name": "fedbabu", "fedbabu.ft_epochs": 3, "train.batched": batched})
    ctx, algo, state, outs = run(cfg, mpi)
    ref = make_ctx(cfg, solo())
    c = ref.clients
    head = torch.zeros(c.P, dtype=torch.bool, device=c.device)
    for s in c.layout.slices(PERSONAL["fedper"]):  # the last Linear
        head[s] = True
    x = c.init.clone()
    for t in range(ROUNDS):
        sampled = [int(k) for k in ref.sample(t, cfg.algorithm.fraction)]
        rows = {k: serial_ref.sgd(c, x, k, t, cfg.train.local_epochs, cfg.train.lr, mask=(~head).float())
                for k in sampled}
        x = torch.where(head, x, fedavg(ref, rows))
    torch.testing.assert_close(state.model, x, rtol=1e-5, atol=1e-6)
    assert torch.equal(state.model[head], c.init[head])  # h^0, exactly
    assert not outs[-1].extras["personal_drift"].any()
    own = ctx.clients.params.clone()
    got = algo.evaluate(ctx, state, ROUNDS - 1)
    assert torch.equal(ctx.clients.params, own)
    for r, i in enumerate(ctx.comm.local_ids):
        tuned = serial_ref.sgd(c, x, int(i), ROUNDS - 1, 3, cfg.train.lr, purpose="finetune")
        lo, hi = c.split_range(int(i), "test")
        assert np.isclose(got["test_loss"][r], float(serial_ref.loss_of(c, tuned, np.arange(lo, hi))), rtol=1e-4)
