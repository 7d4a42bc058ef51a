"""Seeded random streams keyed by (seed, round, client, purpose).

Every random choice in a run draws from one of these streams, never from a
process-global generator, so a run's partition, sampled clients and neighbour
draws are the same whatever the number of MPI ranks hosting the clients.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

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


# numpy's SeedSequence (O'Neill's seed_seq) and PCG64 seeding, vectorised over
# clients: building one Generator per client costs ~11 us, most of a training
# call's batch plan at 128 clients. The constants are numpy's; the streams are
# bit-identical to rng()'s (tests/test_rng.py checks them against numpy).
_M32 = 0xFFFFFFFF
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_PCG_MULT = (2549297995355413924 << 64) + 4865540595714422341
_M128 = (1 << 128) - 1


def _hashmix(v: np.ndarray, h: list[int]) -> np.ndarray:
    # h[0]: the hash constant, advanced the same way for every client
    v = v ^ np.uint32(h[0])
    h[0] = (h[0] * _MULT_A) & _M32
    v = v * np.uint32(h[0])
    return v ^ (v >> np.uint32(16))


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    r = np.uint32(_MIX_L) * x - np.uint32(_MIX_R) * y
    return r ^ (r >> np.uint32(16))


def _pcg64_states(words: np.ndarray) -> list[tuple[int, int]]:
    """(state, inc) of PCG64(SeedSequence(row)) for each row of 4 uint32 words."""
    h = [_INIT_A]
    pool = [_hashmix(words[:, i], h) for i in range(4)]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = _mix(pool[dst], _hashmix(pool[src], h))
    hb, out = _INIT_B, []
    for i in range(8):  # generate_state(4, uint64): 8 words cycling over the pool
        v = pool[i % 4] ^ np.uint32(hb)
        hb = (hb * _MULT_B) & _M32
        v = v * np.uint32(hb)
        out.append((v ^ (v >> np.uint32(16))).astype(np.uint64))
    u = [(out[2 * j] | (out[2 * j + 1] << np.uint64(32))).tolist() for j in range(4)]
    states = []
    for s_hi, s_lo, i_hi, i_lo in zip(*u):
        inc = ((((i_hi << 64) | i_lo) << 1) | 1) & _M128
        # pcg_setseq_128_srandom_r: state 0, step, add the seed, step
        state = ((inc + ((s_hi << 64) | s_lo)) * _PCG_MULT + inc) & _M128
        states.append((state, inc))
    return states


def streams(seed: int, round: int, clients, purpose: str) -> Iterator[np.random.Generator]:
    """``rng(seed, round, c, purpose)`` for each ``c`` of ``clients`` in turn, at a
    fraction of the cost: one Generator re-seeded per client, so use each stream
    before taking the next."""
    base = _key(seed, round, 0, purpose)  # only the client word differs between clients
    cl = np.asarray(clients, np.int64).reshape(-1) + 2
    if min(base) < 0 or max(base) > _M32 or (len(cl) and (cl.min() < 0 or cl.max() > _M32)):
        yield from (rng(seed, round, c, purpose) for c in clients)  # multi-word keys: numpy's own path
        return
    words = np.empty((len(cl), 4), np.uint32)
    words[:] = np.array(base, np.uint32)
    words[:, 2] = cl
    bg = np.random.PCG64(0)
    g = np.random.Generator(bg)
    for state, inc in _pcg64_states(words):
        bg.state = {"bit_generator": "PCG64", "state": {"state": state, "inc": inc}, "has_uint32": 0, "uinteger": 0}
        yield g
