"""comm.py verbs against a serial reference computed from all rows, with the
per-client byte counters; run under mpiexec -n 1, 2 and 4.

Bits: ``weighted_sum`` and ``grouped_sum`` are compared bit for bit with one
left-to-right fold over the clients (``left_fold``) on any number of ranks: each
product and each sum is rounded once in float32, in client order, so the order and
not the CPU's vector width makes the bits, on any x86 kind. So is ``push``: each
receiver's rows summed from zero in the senders' client order (float32 additions, one
at a time). The other exact
comparisons are of ids, byte and model counters and copied rows."""

import numpy as np
import pytest
import torch

from mpifl.comm import F32, Comm, Placement
from mpifl.comm import collectives as comm_mod

P = 37


def all_rows(n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    return torch.randn(n, P, generator=g)


def local_block(comm: Comm, rows: torch.Tensor) -> torch.Tensor:
    return rows[comm.local_ids].clone()


@pytest.mark.parametrize("n", [5, 8, 13])
def test_placement_is_contiguous_and_complete(mpi, n):
    if n < mpi.Get_size():
        pytest.skip("more ranks than clients")
    pl = Placement(n, mpi.Get_size())
    ids = np.concatenate([pl.local_ids(r) for r in range(pl.n_ranks)])
    assert np.array_equal(ids, np.arange(n))
    assert all(pl.owner(c) == r for r in range(pl.n_ranks) for c in pl.local_ids(r))
    assert pl.counts().max() - pl.counts().min() <= 1


def test_weighted_sum_matches_serial_and_counts(mpi):
    n = 11
    comm = Comm(n, mpi)
    rows = all_rows(n)
    w = np.linspace(0.0, 1.0, n)  # client 0 has weight 0: it sends nothing
    w = w / w.sum()
    out = comm.weighted_sum(local_block(comm, rows), w[comm.local_ids])
    ref = (torch.as_tensor(w, dtype=torch.float64) @ rows.double()).float()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    expect_sent = np.where(w[comm.local_ids] > 0, P * F32, 0)
    assert np.array_equal(comm.bytes_sent, expect_sent)
    assert comm.bytes_recv.sum() == 0


def test_grouped_sum_matches_serial(mpi):
    n, k = 10, 3
    comm = Comm(n, mpi)
    rows = all_rows(n)
    groups = np.arange(n) % k
    w = np.arange(1, n + 1, dtype=float)
    out = comm.grouped_sum(local_block(comm, rows), w[comm.local_ids], groups[comm.local_ids], k)
    ref = torch.stack([(rows[groups == g] * torch.as_tensor(w[groups == g], dtype=torch.float32)[:, None]).sum(0)
                       for g in range(k)])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert np.array_equal(comm.bytes_sent, np.full(comm.n_local, P * F32))


def left_fold(rows: torch.Tensor, w: np.ndarray, groups: np.ndarray, k: int) -> torch.Tensor:
    """acc[g_i] = acc[g_i] + fl(w_i * row_i) for i = 0, 1, ..., N-1: the one order."""
    acc = torch.zeros(k, rows.shape[1])
    for i in range(len(rows)):
        if w[i] != 0:
            acc[groups[i]] = acc[groups[i]] + rows[i] * float(np.float32(w[i]))
    return acc


# 16 floats: several chunks in the pipeline, the last one short; "min": a small model cut
# into _CHAIN_MIN chunks of at least _CHAIN_MIN_FLOATS (here 4)
@pytest.mark.parametrize("chunk", [None, 16, "min"])
@pytest.mark.parametrize("run", [None, 2])  # 2: a rank's clients of a group in several runs of products
def test_sums_add_the_clients_in_client_order_on_any_placement(mpi, monkeypatch, chunk, run):
    """Bit for bit one left-to-right fold over the clients, so the same on any number
    of ranks and nodes (run under 1, 2, 3, 4 ranks and simulated nodes)."""
    if chunk == "min":
        monkeypatch.setattr(comm_mod, "_CHAIN_MIN_FLOATS", 4)
    elif chunk:
        monkeypatch.setattr(comm_mod, "_CHAIN_FLOATS", chunk)
    if run:
        monkeypatch.setattr(comm_mod, "_PRODUCT_ROWS", run)
    n, k = 13, 3
    comm = Comm(n, mpi)
    g = torch.Generator().manual_seed(7)
    # magnitudes over six decades: any other order of additions rounds differently
    rows = torch.randn(n, P, generator=g) * 10.0 ** torch.randint(-3, 3, (n, 1), generator=g)
    w = np.random.default_rng(3).random(n)
    w[[2, 5]] = 0  # unsampled clients
    groups = np.arange(n) % k
    mine = comm.local_ids
    out = comm.weighted_sum(local_block(comm, rows), w[mine])
    assert torch.equal(out, left_fold(rows, w, np.zeros(n, np.int64), 1)[0])
    assert not torch.equal(out, left_fold(rows.flip(0), w[::-1], np.zeros(n, np.int64), 1)[0])  # order matters
    grouped = comm.grouped_sum(local_block(comm, rows), w[mine], groups[mine], k)
    assert torch.equal(grouped, left_fold(rows, w, groups, k))
    assert mpi.allgather(out.numpy().tobytes()) == [out.numpy().tobytes()] * mpi.Get_size()


def wanted_for(ids: np.ndarray, n: int) -> dict[int, list[int]]:
    # each client wants the next two clients and client 0: crosses ranks, repeats ids
    return {k: sorted({(int(c) + 1) % n, (int(c) + 2) % n, 0} - {int(c)}) for k, c in enumerate(ids)}


# 70 clients ask for more ids than comm._SMALL: the vectorised bookkeeping path
@pytest.mark.parametrize("n", [9, 70])
def test_pull_returns_rows_and_counts_each_pair(mpi, n):
    comm = Comm(n, mpi)
    rows = all_rows(n)
    wanted = wanted_for(comm.local_ids, n)
    got = comm.pull(local_block(comm, rows), wanted)
    for js in wanted.values():
        for j in js:
            torch.testing.assert_close(got[j], rows[j], rtol=0, atol=0)
    # logical counters: received = models asked for; sent = times others asked for me
    all_wanted = wanted_for(np.arange(n), n)
    asked_for = np.zeros(n, int)
    for js in all_wanted.values():
        for j in js:
            asked_for[j] += 1
    assert np.array_equal(comm.models_recv, [len(wanted[k]) for k in range(comm.n_local)])
    assert np.array_equal(comm.bytes_recv, comm.models_recv * P * F32)
    assert np.array_equal(comm.bytes_sent, asked_for[comm.local_ids] * P * F32)
    # wire: each (source rank, destination rank, client) row once
    pl = comm.placement
    need = {j for js in wanted.values() for j in js if pl.owner(j) != comm.rank}
    assert comm.wire_recv == len(need) * P * F32


@pytest.mark.parametrize("n", [9, 70])
def test_push_sums_at_owner_and_counts(mpi, n):
    comm = Comm(n, mpi)
    wanted = wanted_for(comm.local_ids, n)
    # client i sends (i+1) * e_j-ish contributions to each j it wants
    # (random rows: a sum in another order would round otherwise)
    def row(i, j):
        return torch.randn(P, generator=torch.Generator().manual_seed(1000 * i + j)) * 10.0 ** (i % 5)

    contrib = {k: {j: row(int(c), j) for j in wanted[k]} for k, c in enumerate(comm.local_ids)}
    out = comm.push(contrib, P)
    ref = torch.zeros(n, P)
    nrecv = np.zeros(n, int)
    for i, js in wanted_for(np.arange(n), n).items():  # senders in client order, on one rank or many
        for j in js:
            ref[j] += row(i, j)
            nrecv[j] += 1
    assert torch.equal(out, ref[comm.local_ids])
    assert np.array_equal(comm.bytes_sent, [len(wanted[k]) * P * F32 for k in range(comm.n_local)])
    assert np.array_equal(comm.bytes_recv, nrecv[comm.local_ids] * P * F32)


def test_ring_visits_every_block_once(mpi):
    n = 10
    comm = Comm(n, mpi)
    rows = all_rows(n)
    seen = {}
    held = []

    def visit(ids, block):
        held.append(len(ids))
        for i, r in zip(ids, block):
            assert int(i) not in seen
            seen[int(i)] = r.clone()

    comm.ring(local_block(comm, rows), visit)
    assert sorted(seen) == list(range(n))
    for i, r in seen.items():
        torch.testing.assert_close(r, rows[i], rtol=0, atol=0)
    assert max(held) <= comm.placement.counts().max()
    # each client receives the other N-1 models and its model goes to the other N-1
    assert np.array_equal(comm.models_recv, np.full(comm.n_local, n - 1))
    assert np.array_equal(comm.bytes_recv, np.full(comm.n_local, (n - 1) * P * F32))
    assert np.array_equal(comm.bytes_sent, np.full(comm.n_local, (n - 1) * P * F32))


def test_gather_and_allgather_rows(mpi):
    n = 7
    comm = Comm(n, mpi)
    local = np.stack([comm.local_ids * 10.0, comm.local_ids + 0.5], 1)
    full = comm.gather_rows(local)
    ref = np.stack([np.arange(n) * 10.0, np.arange(n) + 0.5], 1)
    if comm.is_writer:
        assert np.array_equal(full, ref)
    else:
        assert full is None
    assert np.array_equal(comm.allgather_rows(local), ref)
    ints = comm.allgather_rows(comm.local_ids.astype(np.int64))
    assert np.array_equal(ints, np.arange(n))


def test_pulled_rows_survive_the_next_pull(mpi):
    """Receive buffers are pooled: a kept result must not be overwritten."""
    size, rank = mpi.Get_size(), mpi.Get_rank()
    comm = Comm(2 * size, mpi)
    P = 1000
    rows = torch.arange(comm.n_local * P, dtype=torch.float32).reshape(comm.n_local, P) + 1000 * rank
    other = int(comm.placement.local_ids((rank + 1) % size)[0])
    wanted = [[other]] + [[] for _ in range(comm.n_local - 1)]
    first = comm.pull(rows, wanted)
    kept = {k: v.clone() for k, v in first.items()}
    second = comm.pull(rows + 7, wanted)
    for k, v in kept.items():
        torch.testing.assert_close(first[k], v)
        torch.testing.assert_close(second[k], v + 7)


def test_pull_charges_a_repeated_request_once(mpi):
    n = max(6, mpi.Get_size())  # every rank hosts a client
    comm = Comm(n, mpi)
    rows = all_rows(n)
    far = (comm.local_ids[-1] + 1) % n
    got = comm.pull(local_block(comm, rows), {0: [far, far, far]})
    torch.testing.assert_close(got[far], rows[far], rtol=0, atol=0)
    assert comm.models_recv[0] == 1 and comm.bytes_recv[0] == P * F32


@pytest.mark.parametrize("ids", [[0, 3, 4, 10], [], [7], list(range(11))])
def test_allgather_ids_gives_every_rank_the_listed_rows_uncharged(mpi, ids):
    comm = Comm(11, mpi)  # uneven blocks on 2 and 4 ranks
    rows = torch.arange(comm.n_local * 3, dtype=torch.float32).view(comm.n_local, 3) + 100 * comm.first
    every = np.concatenate(mpi.allgather(rows.numpy()))
    got = comm.allgather_ids(rows, np.array(ids, np.int64))
    np.testing.assert_array_equal(got.numpy(), every[ids].reshape(len(ids), 3))
    assert comm.bytes_sent.sum() == comm.bytes_recv.sum() == comm.models_recv.sum() == 0
    rows.add_(1.0)  # a copy: later updates of the block do not show
    np.testing.assert_array_equal(got.numpy(), every[ids].reshape(len(ids), 3))
