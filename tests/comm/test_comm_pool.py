"""Pooled receive buffers: reused only when nothing refers to them."""

import numpy as np
import torch

from mpifl.comm import BufferPool, Comm, solo


def test_pool_reuses_only_free_buffers():
    pool = BufferPool()
    a = pool.get(2, 5)
    a[:] = 1
    held = torch.from_numpy(a)[1]  # a torch view keeps the buffer busy
    del a
    b = pool.get(2, 5)
    b[:] = 2
    assert torch.all(held == 1)
    del held, b
    c = pool.get(1, 5)  # both free now: one of them comes back
    assert len(pool.free) == 2 and any(np.shares_memory(c, f) for f in pool.free)


def test_weighted_sum_results_stay_valid_across_calls():
    comm = Comm(3, solo())
    rows = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    w1, w2 = np.array([1.0, 0, 0]), np.array([0, 0.5, 0.5])
    first = comm.weighted_sum(rows, w1)
    second = comm.weighted_sum(rows, w2)
    torch.testing.assert_close(first, rows[0])
    torch.testing.assert_close(second, 0.5 * (rows[1] + rows[2]))
    third = comm.weighted_sum(rows, w1)
    assert not np.shares_memory(first.numpy(), third.numpy())
    torch.testing.assert_close(first, rows[0])
