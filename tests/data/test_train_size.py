"""data.train_per_client: every client's training set has exactly n samples drawn
from its own training part, its val and test splits are those of n = 0 (so
regimes of different n are evaluated on the same data), and a size the
partition cannot supply is refused in one line. Rank-count independence is in
tests/mpi/data/test_data.py.

Bits: the exact comparisons are of sample indices and sizes (integers) only."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from mpifl import config
from mpifl.data import build, datasets, federate
from mpifl.errors import ConfigError

SPLIT = ["data.name=synthetic", "data.n_samples=1200", "data.n_clients=12", "data.n_clusters=3",
         "data.partition=clusters"]
TEST_SET = ["data.name=mnist1d", "data.n_samples=3000", "data.partition=dirichlet", "data.n_clients=10",
            "data.dirichlet_alpha=0.3", "data.min_client_size=60", "data.test_source=test_set"]


@functools.cache
def pool_of(base: tuple[str, ...], seed: int) -> datasets.Pool:
    return datasets.load(config.load(None, list(base)).data, seed)


def splits_of(base: list[str], n: int, seed: int = 0) -> list[list[np.ndarray]]:
    cfg = config.load(None, [*base, f"data.train_per_client={n}"]).data
    return federate(pool_of(tuple(base), seed), cfg, seed)[1]


@pytest.mark.parametrize("base", [SPLIT, TEST_SET], ids=["split", "test_set"])
def test_exact_size_from_the_own_training_part_with_val_and_test_unchanged(base):
    full = splits_of(base, 0)
    smallest = min(len(s[0]) for s in full)
    for n in (1, 7, smallest):
        got = splits_of(base, n)
        for c, (f, g) in enumerate(zip(full, got)):
            assert len(g[0]) == n and len(np.unique(g[0])) == n, (c, n)
            assert np.isin(g[0], f[0]).all(), "drawn from the client's own training part"
            np.testing.assert_array_equal(g[1], f[1])  # val as with the whole training part
            np.testing.assert_array_equal(g[2], f[2])  # test likewise


def test_smaller_sizes_are_subsets_of_larger_ones_and_the_seed_draws():
    a, b, c = splits_of(SPLIT, 5), splits_of(SPLIT, 20), splits_of(SPLIT, 20, seed=1)
    other = splits_of(SPLIT, 0, seed=1)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x[0], y[0][:5])
    assert any(not np.isin(z[0], y[0]).all() for y, z in zip(b, c) if len(z[0]))
    for z, f in zip(c, other):  # seed 1's draw comes from seed 1's partition
        assert np.isin(z[0], f[0]).all()


def test_zero_leaves_the_splits_as_they_are_and_weights_follow_the_size():
    cfg0 = config.load(None, SPLIT).data
    assert cfg0.train_per_client == 0
    fed = build(cfg0, 0, np.arange(12))
    assert len(set(fed.sizes[:, 0].tolist())) > 1  # unequal shares without the key
    fixed = build(config.load(None, [*SPLIT, "data.train_per_client=30"]).data, 0, np.arange(12))
    assert (fixed.sizes[:, 0] == 30).all() and (fixed.label_hist.sum(1) == 30).all()
    np.testing.assert_array_equal(fixed.sizes[:, 1:], fed.sizes[:, 1:])
    np.testing.assert_allclose(fixed.weights(), np.full(12, 1 / 12))


@pytest.mark.parametrize("base", [SPLIT, TEST_SET], ids=["split", "test_set"])
def test_a_size_the_partition_cannot_supply_is_refused_naming_the_largest(base):
    smallest = min(len(s[0]) for s in splits_of(base, 0))
    with pytest.raises(ConfigError) as e:
        splits_of(base, smallest + 1)
    msg = str(e.value)
    assert "\n" not in msg and f"data.train_per_client={smallest + 1} is not allowed" in msg
    assert msg.endswith(f"at most {smallest}")


def test_negative_is_refused_at_load():
    with pytest.raises(ConfigError, match=r"data.train_per_client=-1 is not allowed; must be >= 0"):
        config.load(None, ["data.train_per_client=-1"])
