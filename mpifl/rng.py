"""Seeded random streams keyed by (seed, round, client, purpose).

Every random choice in a run draws from one of these streams, never from a
process-global generator, so a run's partition, sampled clients and neighbour
draws are the same whatever the number of MPI ranks hosting the clients.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

GLOBAL = -1  # the "client" of draws every rank must agree on (sampling, init)


def _key(seed: int, round: int, client: int, purpose: str) -> list[int]:
    # +2 keeps the setup round (-1) and the global client (-1) non-negative
    return [int(seed), int(round) + 2, int(client) + 2, zlib.crc32(purpose.encode())]


def rng(seed: int, round: int, client: int, purpose: str) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(_key(seed, round, client, purpose))))


def torch_gen(seed: int, round: int, client: int, purpose: str) -> torch.Generator:
    s = np.random.SeedSequence(_key(seed, round, client, purpose)).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(s) & ((1 << 63) - 1))
