"""rng.streams gives exactly rng()'s streams, client after client.

Bits: numpy generators' draws are compared with the same generators' (one algorithm,
the same bits on any CPU)."""

import numpy as np

from mpifl.rng import GLOBAL, rng, streams


def test_streams_equal_numpy_seeded_generators():
    g = np.random.default_rng(0)
    for t in range(60):
        seed, round = int(g.integers(0, 2**32 - 2)), int(g.integers(-1, 10**6))
        clients = [GLOBAL, 0, *g.integers(0, 10**7, size=20).tolist()]
        purpose = ["train", "lia_batch", "", "kmeans"][t % 4]
        for c, s in zip(clients, streams(seed, round, clients, purpose), strict=True):
            ref = rng(seed, round, c, purpose)
            assert np.array_equal(s.permutation(37), ref.permutation(37))
            assert np.array_equal(s.random(5), ref.random(5))
            assert np.array_equal(s.integers(0, 1000, 7), ref.integers(0, 1000, 7))


def test_streams_with_keys_past_32_bits_fall_back_to_numpy():
    for c, s in zip([3, 4], streams(2**40 + 5, 2, [3, 4], "train"), strict=True):
        assert np.array_equal(s.random(4), rng(2**40 + 5, 2, c, "train").random(4))
    assert list(streams(1, 1, [], "train")) == []


def test_streams_take_an_array_of_clients_and_a_seed_past_63_bits():
    ids = np.array([5, 9, 2])
    for c, s in zip(ids.tolist(), streams(7, 3, ids, "x"), strict=True):
        assert np.array_equal(s.permutation(9), rng(7, 3, c, "x").permutation(9))
    for c, s in zip([1], streams(2**70, 0, [1], "x"), strict=True):
        assert np.array_equal(s.random(3), rng(2**70, 0, c, "x").random(3))
