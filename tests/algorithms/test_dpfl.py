"""DPFL: GGC/BGGC equivalence (Theorem 1), the coin, the budget, config and an
end-to-end run. MPI paths: tests/mpi/algorithms/test_dpfl.py.

Bits: the exact comparisons are of partitions' sample indices (integers) only."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from serial_ref import ggc

from mpifl import config
from mpifl.algorithms.dpfl import BGGC, _shuffled, bggc, take
from mpifl.comm import world
from mpifl.errors import ConfigError
from mpifl.logging.h5 import open_run
from mpifl.rng import rng


def random_reward(g: np.random.Generator, d: int):
    """A random smooth non-monotone set reward: -||W2 tanh(W1 w + b) - c||^2."""
    w1 = torch.as_tensor(g.normal(0, 1.5, (8, d)))
    b1 = torch.as_tensor(g.normal(0, 0.5, 8))
    w2 = torch.as_tensor(g.normal(0, 1.0, (3, 8)))
    c = torch.as_tensor(g.normal(0, 1.0, 3))
    return lambda m: (-((torch.tanh(m @ w1.T + b1) @ w2.T - c) ** 2).sum(1)).numpy()


def fetcher(models, budget, log):
    def fetch(ids):
        assert 0 < len(ids) <= budget
        log.append(list(ids))
        return {j: models[j] for j in ids}
    return fetch


def test_ggc_and_bggc_agree_on_random_rewards():
    outcomes, sizes = 0, set()
    for trial in range(300):
        g = np.random.default_rng([trial, 1])
        n, d = int(g.integers(2, 16)), int(g.integers(2, 7))
        k = int(g.integers(n))
        others = np.delete(np.arange(n), k)
        cand = np.sort(g.choice(others, int(g.integers(0, n)), replace=False))
        budget = [1, 2, 3, 5, math.inf][int(g.integers(5))]
        models = {i: torch.as_tensor(g.normal(0, 1, d)) for i in range(n)}
        p = g.dirichlet(np.ones(n))
        reward = random_reward(g, d)
        a = ggc(k, cand, models, p, reward, budget, rng(trial, 0, k, "t"))
        batches: list[list[int]] = []
        b = bggc(k, cand, models[k], p, reward, budget, rng(trial, 0, k, "t"), fetcher(models, budget, batches))
        assert a.members == b.members, f"trial {trial}"
        assert a.reward == pytest.approx(b.reward, rel=1e-9, abs=1e-9)
        torch.testing.assert_close(a.mean, b.mean, rtol=1e-9, atol=1e-9)
        assert len(a.members) <= budget and set(a.members) <= set(cand.tolist())
        # phase 1 streams every candidate once, in batches no larger than the budget
        n1 = math.ceil(len(cand) / (len(cand) if math.isinf(budget) else budget)) if len(cand) else 0
        assert sorted(j for bt in batches[:n1] for j in bt) == cand.tolist()
        # phase 2 follows the shuffled order and stops once the budget is reached
        seen = [j for bt in batches[n1:] for j in bt]
        assert seen == _shuffled(cand, rng(trial, 0, k, "t"))[:len(seen)]
        outcomes += 0 < len(a.members) < len(cand)
        sizes.add(len(a.members))
    # the trials exercised real decisions: sets both partial and of many sizes
    assert outcomes > 50 and len(sizes) >= 4


def test_same_rewards_other_seed_changes_some_sets():
    diff = 0
    for trial in range(100):
        g = np.random.default_rng([trial, 2])
        n, d = 10, 4
        models = {i: torch.as_tensor(g.normal(0, 1, d)) for i in range(n)}
        p, reward = g.dirichlet(np.ones(n)), random_reward(g, d)
        sets = [ggc(0, range(1, n), models, p, reward, math.inf, rng(s, 0, 0, "t")).members for s in (0, 1)]
        diff += sets[0] != sets[1]
    assert diff > 0


def test_take():
    assert take(0.0, 0.0, 0.999)  # both gains zero: add
    assert take(2.0, 0.0, 0.999)  # only adding gains: add
    assert not take(0.0, 2.0, 0.0)  # only removing gains: remove
    assert take(1.0, 3.0, 0.24) and not take(1.0, 3.0, 0.26)  # a/(a+b) = 0.25


def onehot_setup(table):
    """k=0 and candidates 1, 2 with one-hot models and equal p: the mean of a
    set names the set, so a reward can be given per set by hand."""
    models = {i: torch.eye(3, dtype=torch.float64)[i] for i in range(3)}
    p = np.full(3, 1 / 3)

    def reward(m):
        return np.array([table[frozenset(np.flatnonzero(row.numpy() > 1e-9).tolist())] for row in m])

    return models, p, reward


@pytest.mark.parametrize("first, second, expect", [
    (1.0, 5.0, 1.0),  # a = 1, b = 0: always added
    (-1.0, -3.0, 0.0),  # a = 0, b = 2: never added
    (0.0, 0.0, 1.0),  # a = b = 0: added
    (1.0, -2.0, 0.25),  # a = 1, b = 3: added with probability 1/4
])
def test_probability_rule_on_hand_made_rewards(first, second, expect):
    # R({0}) = 0, R({0, j}) = first, R({0, 1, 2}) = second: for the first candidate
    # considered, a = max(first, 0) and b = max(first - second, 0)
    table = {frozenset({0}): 0.0, frozenset({0, 1}): first, frozenset({0, 2}): first, frozenset({0, 1, 2}): second}
    models, p, reward = onehot_setup(table)
    n, added = (200 if expect in (0.0, 1.0) else 800), {"ggc": 0, "bggc": 0}  # 4 std of 0.25 at 800: 0.06
    for s in range(n):
        j = _shuffled([1, 2], rng(s, 0, 0, "coin"))[0]
        a = ggc(0, [1, 2], models, p, reward, math.inf, rng(s, 0, 0, "coin"))
        b = bggc(0, [1, 2], models[0], p, reward, math.inf, rng(s, 0, 0, "coin"),
                 lambda ids: {i: models[i] for i in ids})
        added["ggc"] += j in a.members
        added["bggc"] += j in b.members
    for name, count in added.items():
        if expect in (0.0, 1.0):
            assert count == n * expect, name
        else:
            assert abs(count / n - expect) < 4 * math.sqrt(expect * (1 - expect) / n), (name, count)


def test_budget_stops_requests():
    # a flat reward adds every candidate (a = b = 0): X fills to the budget, then
    # no more batches are asked for
    models = {i: torch.full((2,), float(i)) for i in range(10)}
    reward = lambda m: np.zeros(len(m))
    for budget in (1, 2, 3, 4):
        log: list[list[int]] = []
        run = BGGC(0, range(1, 10), models[0], np.full(10, 0.1), reward, budget, rng(0, 0, 0, "b"))
        while not run.done:
            run.feed(fetcher(models, budget, log)(run.request()))
        assert len(run.result.members) == budget
        assert run.largest <= budget
        phase1 = math.ceil(9 / budget)
        assert len(log) == phase1 + math.ceil(budget / budget)  # added every one it saw: one phase-2 batch


def test_budget_config():
    N = 20
    parse = lambda b: config.load(None, [f"dpfl.budget={b}", f"data.n_clients={N}"]).dpfl.budget_for(N)
    assert parse("inf") == math.inf and parse(".inf") == math.inf
    assert parse("0.2N") == 4 and parse("0.1N") == 2 and parse("0.05N") == 1 and parse("0.01N") == 1
    assert parse(7) == 7
    for bad in ("abc", "0", "0N", "-1", "1.5", "-0.1N"):
        with pytest.raises(ConfigError, match="dpfl.budget"):
            parse(bad)
    with pytest.raises(ConfigError, match="dpfl.period"):
        config.load(None, ["dpfl.period=0"])
    with pytest.raises(ConfigError, match="data.val_frac"):
        config.load(None, ["algorithm.name=dpfl", "data.val_frac=0"])


def test_partitions_dirichlet_and_patho():
    from mpifl.config import DataConfig
    from mpifl.data.partition import dirichlet, patho

    y = np.random.default_rng(0).integers(0, 10, 3000)
    cfg = DataConfig(n_clients=20, classes_per_client=3, dirichlet_alpha=0.1)
    for fn in (dirichlet, patho):
        a, b = fn(y, 10, cfg, 0), fn(y, 10, cfg, 0)
        allidx = np.concatenate(a.parts)
        assert len(allidx) == len(np.unique(allidx))  # no sample twice
        assert all(np.array_equal(u, v) for u, v in zip(a.parts, b.parts))  # seeded
        assert min(len(pt) for pt in a.parts) >= 10
    assert all(len(np.unique(y[pt])) == 3 for pt in patho(y, 10, cfg, 0).parts)
    # alpha = 0.1 skews labels: most clients are dominated by few classes
    top = [np.bincount(y[pt], minlength=10).max() / len(pt) for pt in dirichlet(y, 10, cfg, 0).parts]
    assert np.median(top) > 0.5


def run_dpfl(tmp_path, name, *extra):
    cfg = config.load(None, ["algorithm.name=dpfl", "data.name=synthetic", "data.partition=patho",
                             "data.n_clients=8", "data.n_samples=800", "run.rounds=4", "run.threads=1",
                             f"run.out_dir={tmp_path}", f"run.name={name}", "dpfl.tau_init=2",
                             "dpfl.tau_train=1", "dpfl.budget=3", *extra])
    from mpifl.run import runtime
    return open_run(runtime.run(cfg, world()))


def check_log(r, budget):
    cand, coll = r.get("dpfl/candidates"), r.get("dpfl/collaborators")
    mix, recv = r.get("graph/mixing"), r.get("comm/models_recv")
    n = cand.shape[1]
    assert cand.dtype == bool and cand.shape == coll.shape == (r.n_rounds, n, n)
    assert (cand.sum(2) <= budget).all()
    assert (cand == cand[0]).all()  # Omega fixed after preprocessing
    assert not (coll & ~cand).any()  # C_k within Omega_k
    assert not cand[:, np.arange(n), np.arange(n)].any()
    assert (r.get("dpfl/max_batch_models") <= budget).all()
    assert (recv[1:] <= budget).all()
    np.testing.assert_allclose(mix.sum(2), 1, rtol=1e-5)
    assert ((mix > 0) == (coll | np.eye(n, dtype=bool))).all()
    assert np.isfinite(r.get("dpfl/reward")).all()
    return cand, coll


def test_end_to_end(tmp_path):
    r = run_dpfl(tmp_path, "greedy")
    cand, coll = check_log(r, 3)
    assert r.get("comm/models_recv")[0].max() > 3  # BGGC saw more than B_c models in all, in batches
    assert cand.any()
    rg = run_dpfl(tmp_path, "random", "dpfl.random_graph=true")
    cand, coll = check_log(rg, 3)
    assert (cand.sum(2) == 3).all() and (coll == cand).all()
    assert (rg.get("comm/models_recv") == 3).all()


def test_malicious_not_running_ggc(tmp_path):
    r = run_dpfl(tmp_path, "mal", "dpfl.malicious=0.5", "dpfl.malicious_run_ggc=false")
    bad = r.get("dpfl/malicious")
    assert bad.sum() == 4
    cand, coll = check_log(r, 3)
    assert not cand[:, bad].any() and not coll[:, bad].any()
    mix = r.get("graph/mixing")
    assert (mix[:, bad][:, :, bad] == np.eye(4)).all()


def test_label_flip_permutes_only_malicious_clients():
    from mpifl.algorithms import dpfl
    from mpifl.run import runtime

    cfg = config.load(None, ["algorithm.name=dpfl", "data.name=synthetic", "data.n_clients=10",
                             "data.n_samples=600", "dpfl.malicious=0.4", "run.threads=1"])
    ctx = runtime.setup(cfg, world()).ctx
    before = ctx.clients.y.clone()
    state = dpfl.init(ctx)
    assert state.malicious.sum() == 4
    c = ctx.clients
    perms = []
    for i, k in enumerate(ctx.comm.local_ids):
        lo, hi = c.split_range(i, "train")[0], c.split_range(i, "test")[1]
        old, new = before[lo:hi], c.y[lo:hi]
        if state.malicious[k]:
            assert (old != new).all()  # a derangement moves every label
            perms.append({int(a): int(b) for a, b in zip(old, new)})
        else:
            assert (old == new).all()
    merged = {}
    for m in perms:
        assert all(merged.get(a, b) == b for a, b in m.items())  # one permutation for all
        merged.update(m)


def test_trained_metrics_are_before_aggregation(tmp_path):
    r = run_dpfl(tmp_path, "trained", "dpfl.malicious=0.5", "dpfl.malicious_run_ggc=false", "run.eval_every=2")
    bad = r.get("dpfl/malicious")
    for m in ("val_loss", "val_acc", "test_loss", "test_acc"):
        tr, agg = r.get(f"dpfl/trained_{m}"), r.metric(m)
        assert tr.shape == agg.shape == (4, 8)
        assert np.isnan(tr[[0, 2]]).all() and np.isfinite(tr[[1, 3]]).all()  # evaluated rounds only
        # clients training alone are not aggregated: the same model either way
        np.testing.assert_allclose(tr[[1, 3]][:, bad], agg[[1, 3]][:, bad], rtol=1e-6)
    # the others are evaluated before and after averaging with their collaborators
    tr, agg = r.get("dpfl/trained_val_loss")[[1, 3]], r.metric("val_loss")[[1, 3]]
    assert not np.allclose(tr[:, ~bad], agg[:, ~bad])


@pytest.mark.parametrize("budget", ["5", "inf"])
def test_a_round_chooses_what_algorithm_2_as_printed_chooses(budget):
    """Round t >= 1 runs GGC as BGGC on the pulled models; a plain reference trains
    the same clients and runs Algorithm 2 with recomputed set means."""
    from serial_ref import make_ctx

    from mpifl.algorithms import dpfl
    from mpifl.comm import solo

    cfg = config.load(None, ["algorithm.name=dpfl", "data.name=synthetic", "data.partition=iid",
                             "data.n_clients=10", "data.n_samples=800", "run.threads=1", "dpfl.tau_init=2",
                             "dpfl.tau_train=1", f"dpfl.budget={budget}", "model.hidden=[16]"])
    ctx, ref = make_ctx(cfg, solo()), make_ctx(cfg, solo())
    state, ref_state = dpfl.init(ctx), dpfl.init(ref)
    dpfl.round(ctx, state, 0)
    dpfl.round(ref, ref_state, 0)
    ctx.comm.reset_counters()  # as the runtime does each round
    out = dpfl.round(ctx, state, 1)

    c = ref.clients
    c.train(np.arange(c.n), cfg.dpfl.tau_train, 1)
    trained = c.params.clone()
    sizes, partial = [], 0
    for k in range(c.n):
        omega = ref_state.peers[k].omega
        assert omega == state.peers[k].omega
        models = {j: trained[j] for j in [k, *omega]}

        def reward(m, k=k):
            return -c.evaluate("val", m.to(c.params.dtype), np.full(len(m), k))[0]

        want = ggc(k, omega, models, ref_state.p, reward, ref_state.budget, ref.rng(1, k, "dpfl_ggc"))
        assert state.peers[k].chosen == want.members, f"client {k}"
        assert out.extras["collaborators"][k].nonzero()[0].tolist() == want.members
        torch.testing.assert_close(ctx.clients.params[k], want.mean, rtol=1e-6, atol=1e-7)
        sizes.append(len(omega))
        partial += 0 < len(want.members) < len(omega)
    # the round made real choices: candidates to choose among, and some left out
    assert max(sizes) >= 2 and partial >= 1
