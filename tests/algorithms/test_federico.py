"""FedeRiCo's steps against values worked out by hand, its config checks, and one
end-to-end run of ``python -m mpifl.main`` (the MPI tests compare whole rounds
with a serial reference: tests/mpi/algorithms/test_federico_mpi.py).

Bits: the exact comparisons are of neighbour draws and counters (integers), of an
input left untouched, and of initial rows that must differ: no computed float is
asserted equal."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mpifl import config
from mpifl.algorithms import federico
from mpifl.errors import ConfigError
from mpifl.logging.h5 import open_run
from mpifl.main import main
from mpifl.rng import rng


def test_sampling_eps_one_is_the_seeded_uniform_draw():
    n, i, k = 10, 4, 3
    w = np.linspace(1, 0, n)  # greedy would take 0, 1, 2: must not matter
    seen = np.zeros(n)
    for t in range(400):
        got = federico.sample_neighbours(w, i, k, 1.0, rng(0, t, i, "x"))
        g = rng(0, t, i, "x")
        g.random()  # the explore coin
        assert list(got) == list(g.permutation([j for j in range(n) if j != i])[:k])
        assert i not in got and len(set(got)) == k
        seen[got] += 1
    # uniform over the 9 others: 400 * 3 / 9 = 133 each
    assert seen[i] == 0
    assert np.all(np.abs(seen[np.arange(n) != i] - 400 * k / (n - 1)) < 45)


def test_sampling_eps_zero_takes_the_top_k_never_self():
    w = np.array([0.05, 0.30, 0.02, 0.25, 0.20, 0.18])  # client 1 (self) has the largest weight
    for t in range(20):
        got = federico.sample_neighbours(w, 1, 3, 0.0, rng(0, t, 1, "x"))
        assert list(got) == [3, 4, 5]


def test_sampling_ties_are_broken_by_the_clients_stream():
    w = np.full(8, 1 / 8)
    draws = {tuple(federico.sample_neighbours(w, 0, 3, 0.0, rng(0, t, 0, "x"))) for t in range(30)}
    assert len(draws) > 1  # not always the lowest ids
    a = federico.sample_neighbours(w, 0, 3, 0.0, rng(7, 2, 0, "x"))
    b = federico.sample_neighbours(w, 0, 3, 0.0, rng(7, 2, 0, "x"))
    np.testing.assert_array_equal(a, b)


def test_ema_updates_only_the_measured_entries():
    tracked = np.array([1.0, 2.0, 3.0, 4.0])
    out = federico.ema(tracked, np.array([0, 2]), np.array([0.5, 1.0]), beta=0.6)
    # 0.4 * 1.0 + 0.6 * 0.5 = 0.7;  0.4 * 3.0 + 0.6 * 1.0 = 1.8
    np.testing.assert_allclose(out, [0.7, 2.0, 1.8, 4.0])
    np.testing.assert_array_equal(tracked, [1.0, 2.0, 3.0, 4.0])  # input untouched


def test_client_weights_are_the_softmax_of_minus_loss_over_temperature():
    L = np.array([[0.0, math.log(2), math.log(4)]])
    np.testing.assert_allclose(federico.client_weights(L, 1.0), [[4 / 7, 2 / 7, 1 / 7]])
    # temperature 2 halves the exponents: weights 1, 1/sqrt2, 1/2
    r = 1 / math.sqrt(2)
    np.testing.assert_allclose(federico.client_weights(L, 2.0), [[1 / (1.5 + r), r / (1.5 + r), 0.5 / (1.5 + r)]])
    # loss_scale=sum multiplies by n_i: scale 2 at temperature 2 is temperature 1
    np.testing.assert_allclose(federico.client_weights(L, 2.0, 2.0), federico.client_weights(L, 1.0))
    # huge losses do not overflow
    assert np.isfinite(federico.client_weights(np.array([[1e4, 2e4]]), 1.0)).all()


def test_held_weights_renormalise_over_the_models_held():
    w = np.array([0.1, 0.2, 0.3, 0.4])
    np.testing.assert_allclose(federico.held_weights(w, np.array([3, 1])), [0, 1 / 3, 0, 2 / 3])


@pytest.mark.parametrize("override, key", [
    ("federico.k=8", "federico.k"),  # 8 clients: at most 7 neighbours
    ("federico.k=0", "federico.k"),
    ("federico.eps=1.5", "federico.eps"),
    ("federico.beta=0", "federico.beta"),
    ("federico.temperature=0", "federico.temperature"),
    ("federico.estep_batches=0", "federico.estep_batches"),
    ("federico.estep_batches=some", "federico.estep_batches"),
    ("federico.loss_scale=max", "federico.loss_scale"),
    ("federico.init=random", "federico.init"),
    ("federico.init=per_client model.weights=w.pt", "federico.init"),  # same weights for all: not per client
])
def test_config_rejects_bad_values(override, key):
    with pytest.raises(ConfigError, match=key):
        config.load(None, ["algorithm.name=federico", "data.n_clients=8", *override.split()])


def test_config_accepts_the_knobs():
    cfg = config.load(None, ["algorithm.name=federico", "data.n_clients=8", "federico.k=7", "federico.eps=1",
                             "federico.estep_batches=all", "federico.loss_scale=sum", "federico.loss_init=zero"])
    assert (cfg.federico.k, cfg.federico.eps, cfg.federico.estep_batches) == (7, 1.0, "all")
    assert cfg.federico.init == "per_client"  # the default
    assert config.load(None, ["algorithm.name=federico", "federico.init=shared"]).federico.init == "shared"
    # k is only bounded by N when FedeRiCo runs
    config.load(None, ["algorithm.name=fedavg", "data.n_clients=2"])


@pytest.mark.parametrize("extra", [[], ["federico.estep_batches=all", "federico.loss_scale=sum"]])
def test_end_to_end_log(tmp_path, extra):
    k, n = 2, 6
    rc = main(["algorithm.name=federico", "data.name=synthetic", f"data.n_clients={n}", "data.n_clusters=2",
               "data.n_samples=300", "model.hidden=[8]", "train.optimizer=adam", "train.lr=0.01",
               "run.rounds=3", "run.threads=1", f"federico.k={k}", f"run.out_dir={tmp_path}", "run.name=f", *extra])
    assert rc == 0
    r = open_run(tmp_path / "f")
    R = 3
    assert r.get("federico/client_weights").shape == (R, n, n)
    assert r.get("federico/tracked_loss").shape == (R, n, n)
    S = r.get("federico/neighbours")
    assert S.shape == (R, n, k)
    np.testing.assert_array_equal(r.get("comm/models_recv"), k)
    W = r.get("federico/client_weights")
    np.testing.assert_allclose(W.sum(2), 1.0, rtol=1e-5)
    for t in range(R):
        M = r.mixing(t)
        for i in range(n):
            held = [*S[t, i], i]
            np.testing.assert_allclose(M[i, held], W[t, i, held] / W[t, i, held].sum(), rtol=1e-5)
            assert M[i].sum() == pytest.approx(1.0, rel=1e-5)
    assert np.isfinite(r.metric("test_acc")).all()


@pytest.mark.parametrize("how", ["per_client", "shared"])
def test_init_rows(how):
    """per_client: client i starts from ``models.build`` with its own seed, a function
    of (run seed, i) only, so every client's model differs; shared: the run's init."""
    import torch

    from mpifl import models
    from mpifl.comm import world
    from mpifl.run import runtime

    cfg = config.load(None, ["algorithm.name=federico", "data.name=synthetic", "data.n_clients=5",
                             "data.n_samples=300", "model.hidden=[8]", "run.threads=1", "run.seed=4",
                             f"federico.init={how}"])
    ctx = runtime.setup(cfg, world()).ctx
    c = ctx.clients
    federico.init(ctx)
    if how == "shared":
        torch.testing.assert_close(c.params, c.init.expand_as(c.params))
        return
    seeds = [federico.init_seed(ctx, i) for i in range(5)]
    assert len(set(seeds)) == 5
    assert seeds[2] == int(rng(4, -1, 2, federico.INIT_PURPOSE).integers(2**63 - 1))
    for i in range(5):
        want = c.layout.flatten(models.build(cfg.model, ctx.data.in_shape, ctx.data.n_classes, seeds[i])).to(c.device)
        torch.testing.assert_close(c.params[i], want)
        assert not torch.equal(c.params[i], c.init)
        assert all(not torch.equal(c.params[i], c.params[j]) for j in range(i))


def test_group_mask_keeps_each_row_inside_its_group_and_renormalises():
    cluster = np.array([0, 1, 0, 1, 2])
    w = np.full((2, 5), 0.2)
    w[1] = [0.1, 0.4, 0.1, 0.2, 0.2]
    got = federico.group_mask(w, np.array([2, 3]), cluster)
    np.testing.assert_allclose(got, [[0.5, 0, 0.5, 0, 0], [0, 4 / 6, 0, 2 / 6, 0]])


def test_mask_groups_needs_a_partition_with_groups():
    with pytest.raises(ConfigError, match="federico.mask='groups'.*records none"):
        config.load(None, ["algorithm.name=federico", "data.partition=iid", "federico.mask=groups"])
    assert config.load(None, ["algorithm.name=federico", "federico.mask=groups"]).federico.mask == "groups"


def test_masked_run_weights_and_mixes_only_group_mates(tmp_path):
    k, n = 2, 6
    rc = main(["algorithm.name=federico", "data.name=synthetic", f"data.n_clients={n}", "data.n_clusters=2",
               "data.n_samples=300", "model.hidden=[8]", "train.optimizer=adam", "train.lr=0.01",
               "run.rounds=3", "run.threads=1", f"federico.k={k}", "federico.mask=groups", "federico.eps=0",
               f"run.out_dir={tmp_path}", "run.name=f"])
    assert rc == 0
    r = open_run(tmp_path / "f")
    cluster = np.arange(n) % 2  # data.partition=clusters deals clients to groups round-robin
    outside = cluster[:, None] != cluster[None, :]
    W = r.get("federico/client_weights")
    assert (W[:, outside] == 0).all() and (W[:, ~outside] > 0).all()
    np.testing.assert_allclose(W.sum(2), 1.0, rtol=1e-5)
    for t in range(3):
        assert (r.mixing(t)[outside] == 0).all()
    # eps 0: every round's top-k; with k = 2 and two group-mates it pulls exactly them
    S = r.get("federico/neighbours")
    assert (cluster[S] == cluster[None, :, None]).all()
