"""Partition properties, for every partition: disjoint clients, promised label
structure, configured sizes and ratios, seeded (same seed -> same, other seed ->
other). Rank-count independence is in tests/mpi/data/test_data.py.

Bits: the exact comparisons are of sample indices, labels and cluster ids
(integers), and of domain 0's features, which the stand-in transform returns
unchanged: any CPU."""

from __future__ import annotations

import numpy as np
import pytest

from mpifl import config
from mpifl.data import build, datasets, federate, share_test_set
from mpifl.data.partition import PARTITIONS, PoolInfo, label_permutations, partition
from mpifl.errors import ConfigError

ALL = sorted(PARTITIONS)


def data_cfg(*over: str) -> config.DataConfig:
    base = ["data.name=synthetic", "data.n_samples=1200", "data.n_clients=12", "data.n_clusters=3",
            "data.min_client_size=5"]
    return config.load(None, [*base, *over]).data


def parts_of(cfg: config.DataConfig, seed: int = 0):
    pool = datasets.load(cfg, seed)
    part, splits = federate(pool, cfg, seed)
    return pool, part, splits


def true_labels_per_client(pool, part) -> list[set]:
    return [set(np.unique(pool.y[p]).tolist()) for p in part.parts]


def test_registry_names():
    assert set(ALL) == {"iid", "clusters", "noisy_clusters", "permuted_clusters", "patho", "dirichlet",
                        "domains", "feature_shift", "label_flip"}


@pytest.mark.parametrize("name", ALL)
def test_disjoint_and_seeded(name):
    cfg = data_cfg(f"data.partition={name}")
    pool, part, splits = parts_of(cfg)
    every = np.concatenate([s for client in splits for s in client])
    assert len(every) == len(np.unique(every)), "a sample is in two clients (or two splits)"
    assert len(part.cluster) == cfg.n_clients and part.cluster.dtype.kind == "i"
    _, again, splits2 = parts_of(cfg)
    for a, b in zip(splits, splits2):
        for s, t in zip(a, b):
            np.testing.assert_array_equal(s, t)
    np.testing.assert_array_equal(part.cluster, again.cluster)
    _, other, splits3 = parts_of(cfg, seed=1)
    assert any(not np.array_equal(np.sort(a[0]), np.sort(b[0])) for a, b in zip(splits, splits3))


@pytest.mark.parametrize("name", ["iid", "clusters", "noisy_clusters", "permuted_clusters", "dirichlet",
                                  "domains", "feature_shift", "label_flip"])
def test_every_sample_is_used(name):
    cfg = data_cfg(f"data.partition={name}")
    pool, part, _ = parts_of(cfg)
    assert sum(len(p) for p in part.parts) == len(pool.y)


@pytest.mark.parametrize("val,test", [(0.2, 0.2), (0.25, 0.1), (0.0, 0.3)])
@pytest.mark.parametrize("name", ALL)
def test_split_ratios(name, val, test):
    cfg = data_cfg(f"data.partition={name}", f"data.val_frac={val}", f"data.test_frac={test}")
    _, part, splits = parts_of(cfg)
    for p, (tr, va, te) in zip(part.parts, splits):
        n = len(p)
        assert len(tr) + len(va) + len(te) == n
        assert abs(len(va) - val * n) <= 0.5 and abs(len(te) - test * n) <= 0.5


def test_clusters_have_disjoint_label_sets():
    cfg = data_cfg("data.partition=clusters", "data.n_clusters=4")
    pool, part, _ = parts_of(cfg)
    labels = true_labels_per_client(pool, part)
    by_cluster = {}
    for c, s in enumerate(labels):
        by_cluster.setdefault(int(part.cluster[c]), set()).update(s)
    ks = sorted(by_cluster)
    assert ks == [0, 1, 2, 3]
    for i in ks:
        for j in ks:
            if i < j:
                assert not by_cluster[i] & by_cluster[j]
    # clients of one cluster hold all of its labels, in near-equal shares
    for c, s in enumerate(labels):
        assert s == by_cluster[int(part.cluster[c])]
    sizes = np.array([len(p) for p in part.parts])
    for k in ks:
        m = sizes[part.cluster == k]
        assert m.max() - m.min() <= len(by_cluster[k])


@pytest.mark.parametrize("partition", ["clusters", "noisy_clusters"])
def test_cluster_labels_ordered_are_consecutive_and_random_are_seeded(partition):
    def groups(seed, *over):
        pool, part, _ = parts_of(data_cfg(f"data.partition={partition}", "data.n_clusters=5",
                                          "data.noisy_prob=0", "data.n_clients=10", *over), seed)
        labels = true_labels_per_client(pool, part)
        return sorted({tuple(sorted(labels[c])) for c in range(10)})

    in_order = [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
    assert groups(0, "data.cluster_labels=ordered") == groups(1, "data.cluster_labels=ordered") == in_order
    shuffled = [groups(s, "data.cluster_labels=random") for s in range(4)]
    assert any(g != in_order for g in shuffled) and len(set(map(tuple, shuffled))) > 1
    assert groups(2) == shuffled[2]  # random is the default


def test_clusters_by_super_class():
    """CIFAR-100 style: clusters are unions of whole super-classes."""
    g = np.random.default_rng(0)
    y = g.integers(0, 100, 5000)
    groups = np.arange(100) % 20
    cfg = data_cfg("data.partition=clusters", "data.n_clusters=5", "data.n_clients=10")
    part = partition(y, 100, cfg, 0, PoolInfo(class_groups=groups))
    for k in range(5):
        held = set(np.unique(np.concatenate([y[p] for c, p in enumerate(part.parts) if part.cluster[c] == k])))
        supers = set(groups[list(held)])
        assert len(supers) == 4
        assert held == set(np.flatnonzero(np.isin(groups, list(supers))))
    with pytest.raises(ConfigError, match="at most 20 clusters"):
        partition(y, 100, data_cfg("data.partition=clusters", "data.n_clusters=21", "data.n_clients=30"), 0,
                  PoolInfo(class_groups=groups))


@pytest.mark.parametrize("extra,groups", [(0, None), (3, None), (0, "cifar100")])
def test_noisy_clusters_extra_labels(extra, groups):
    n_classes = 100 if groups else 10
    g = np.random.default_rng(1)
    y = g.integers(0, n_classes, 20000)
    info = PoolInfo(class_groups=np.arange(100) % 20) if groups else None
    cfg = data_cfg("data.partition=noisy_clusters", "data.n_clusters=5", "data.n_clients=200",
                   f"data.noisy_labels={extra}")
    want = extra or (5 if groups else 1)
    part = partition(y, n_classes, cfg, 0, info)
    clean = partition(y, n_classes, data_cfg("data.partition=clusters", "data.n_clusters=5",
                                             "data.n_clients=200"), 0, info)
    core = {}
    for c, p in enumerate(clean.parts):
        core.setdefault(int(clean.cluster[c]), set()).update(np.unique(y[p]).tolist())
    n_noisy = 0
    for c, p in enumerate(part.parts):
        held = set(np.unique(y[p]).tolist())
        outside = held - core[int(part.cluster[c])]
        assert core[int(part.cluster[c])] <= held
        assert len(outside) in (0, want)
        n_noisy += bool(outside)
    # probability 0.5 over 200 clients: 100 +- 4 sigma
    assert 100 - 4 * np.sqrt(50) < n_noisy < 100 + 4 * np.sqrt(50)


def test_permuted_clusters_concept_shift():
    cfg = data_cfg("data.partition=permuted_clusters", "data.n_clusters=3")
    pool, part, _ = parts_of(cfg)
    perms = label_permutations(pool.n_classes, 3, 0)
    for k in range(3):
        assert sorted(perms[k]) == list(range(pool.n_classes))
        if k:
            assert (perms[k] != np.arange(pool.n_classes)).all()
    for c, p in enumerate(part.parts):
        np.testing.assert_array_equal(part.y_fn(c, pool.y[p]), perms[part.cluster[c]][pool.y[p]])
    assert len({tuple(p) for p in perms}) == 3


@pytest.mark.parametrize("s", [1, 3, 5])
def test_patho_classes_per_client(s):
    cfg = data_cfg("data.partition=patho", f"data.classes_per_client={s}", "data.n_clients=20")
    pool, part, _ = parts_of(cfg)
    counts = np.zeros(pool.n_classes, int)
    for p in part.parts:
        held = np.unique(pool.y[p])
        assert len(held) == s
        counts[held] += 1
    assert counts.max() - counts.min() <= 1  # every class held by as many clients (+-1)
    assert (part.cluster == -1).all()


@pytest.mark.parametrize("alpha", [0.1, 1.0, 100.0])
def test_dirichlet_min_size_and_skew(alpha):
    cfg = data_cfg("data.partition=dirichlet", f"data.dirichlet_alpha={alpha}", "data.min_client_size=20")
    pool, part, _ = parts_of(cfg)
    sizes = np.array([len(p) for p in part.parts])
    assert sizes.min() >= 20
    hist = np.stack([np.bincount(pool.y[p], minlength=pool.n_classes) for p in part.parts])
    frac = hist / hist.sum(1, keepdims=True)
    spread = frac.max(1).mean()  # share of each client's largest class
    if alpha <= 0.1:
        assert spread > 0.5
    if alpha >= 100:
        assert spread < 0.3


def test_dirichlet_impossible_minimum_is_config_error():
    cfg = data_cfg("data.partition=dirichlet", "data.min_client_size=200")
    with pytest.raises(ConfigError, match="data.min_client_size=200"):
        parts_of(cfg)


def test_domains_real_and_stand_in():
    g = np.random.default_rng(2)
    y = g.integers(0, 4, 600)
    dom = np.repeat([0, 1, 2], 200)
    cfg = data_cfg("data.partition=domains", "data.n_clients=6")
    part = partition(y, 4, cfg, 0, PoolInfo(domain=dom))
    np.testing.assert_array_equal(part.cluster, [0, 1, 2, 0, 1, 2])
    for c, p in enumerate(part.parts):
        assert (dom[p] == part.cluster[c]).all()
        assert set(y[p]) == {0, 1, 2, 3}  # label-complete
    with pytest.raises(ConfigError, match="3 domains"):
        partition(y, 4, data_cfg("data.partition=domains", "data.n_clients=2"), 0, PoolInfo(domain=dom))
    stand_in = partition(y, 4, data_cfg("data.partition=domains", "data.n_clusters=3"), 0)
    assert stand_in.x_fn is not None and set(stand_in.cluster) == {0, 1, 2}
    x = g.normal(size=(5, 7)).astype(np.float32)
    np.testing.assert_array_equal(stand_in.x_fn(0, x), x)  # domain 0 is the data itself
    assert not np.allclose(stand_in.x_fn(1, x), x)


@pytest.mark.parametrize("frac", [0.0, 0.25, 1.0])
def test_label_flip_fraction(frac):
    cfg = data_cfg("data.partition=label_flip", f"data.flip_frac={frac}", "data.n_clients=12")
    pool, part, _ = parts_of(cfg)
    flipped = [c for c, p in enumerate(part.parts) if not np.array_equal(part.y_fn(c, pool.y[p]), pool.y[p])]
    assert len(flipped) == int(np.floor(frac * 12 + 0.5))
    np.testing.assert_array_equal(part.cluster, np.isin(np.arange(12), flipped).astype(int))


def test_label_flip_on_patho_base():
    cfg = data_cfg("data.partition=label_flip", "data.flip_base=patho", "data.flip_frac=0.5")
    pool, part, _ = parts_of(cfg)
    for p in part.parts:
        assert len(np.unique(pool.y[p])) == cfg.classes_per_client


def test_too_many_clusters_or_classes_is_config_error():
    with pytest.raises(ConfigError, match="at most 10 clusters"):
        parts_of(data_cfg("data.partition=clusters", "data.n_clusters=11", "data.n_clients=20"))
    with pytest.raises(ConfigError, match="data.classes_per_client=11"):
        parts_of(data_cfg("data.partition=patho", "data.classes_per_client=11"))
    with pytest.raises(ConfigError, match="must be <= data.n_clients"):
        parts_of(data_cfg("data.partition=permuted_clusters", "data.n_clusters=13"))


@pytest.mark.slow
def test_test_set_follows_each_clients_label_mix():
    """DPFL: the dataset's own test set, shared out by each client's label mix."""
    cfg = config.load(None, ["data.name=mnist1d", "data.n_samples=3000", "data.partition=dirichlet",
                             "data.n_clients=10", "data.dirichlet_alpha=0.3", "data.test_source=test_set",
                             "data.val_frac=0.25"]).data
    pool, part, splits = parts_of(cfg)
    test_idx = np.flatnonzero(pool.test)
    used = np.concatenate([s[2] for s in splits])
    assert np.isin(used, test_idx).all() and len(np.unique(used)) == len(used)
    assert not np.isin(np.concatenate([np.r_[s[0], s[1]] for s in splits]), test_idx).any()
    assert len(used) == len(test_idx)  # every class is held by someone here
    for p, (_, va, te) in zip(part.parts, splits):
        assert abs(len(va) - 0.25 * len(p)) <= 0.5
        mix = np.bincount(pool.y[p], minlength=10) / len(p)
        got = np.bincount(pool.y[te], minlength=10)
        expect = np.array([mix[c] * len(te) for c in range(10)])
        # proportional to the client's share of each class: within the rounding of the shares
        share = np.bincount(pool.y[p], minlength=10) / np.maximum(
            sum(np.bincount(pool.y[q], minlength=10) for q in part.parts), 1)
        want = share * np.bincount(pool.y[test_idx], minlength=10)
        assert np.all(np.abs(got - want) <= 1)
        assert np.corrcoef(got, expect)[0, 1] > 0.9


def test_share_test_set_by_domain_and_label():
    y = np.array([0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 1])
    dom = np.array([0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1])
    parts = [np.array([0, 2]), np.array([1, 3]), np.array([4, 5])]  # clients 0, 1 in domain 0; 2 in domain 1
    test_idx = np.arange(6, 12)
    out = share_test_set(parts, test_idx, y, dom, seed=0)
    assert sorted(np.concatenate(out).tolist()) == list(range(6, 12))
    np.testing.assert_array_equal(np.sort(out[2]), [10, 11])  # domain 1 test samples go to domain 1
    for c in (0, 1):
        assert sorted(y[out[c]].tolist()) == [0, 1]


def test_test_set_needs_a_test_set():
    cfg = config.load(None, ["data.name=digits", "data.test_source=test_set"]).data
    with pytest.raises(ConfigError, match="has no test set"):
        build(cfg, 0, np.arange(0))
