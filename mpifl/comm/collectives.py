"""The communication verbs the algorithms use: placement of clients on ranks and
the point-to-point and collective calls on flat float32 rows.

Models travel as contiguous float32 rows through the buffer-based (uppercase)
calls; the pickle-based calls carry small metadata only (request lists, sizes).

Byte accounting is *logical*, per client, as a real deployment would see it: a
client that receives a neighbour's model counts ``P*4`` bytes received even when
the neighbour happens to live on the same rank. Algorithms' budgets (DPFL's B_c,
FedeRiCo's k models per round) are checked against these counters. The bytes that
actually crossed MPI are counted per rank in ``wire_sent``/``wire_recv``.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from mpi4py import MPI

F32 = 4  # bytes per model coordinate on the wire
_SMALL = 32  # below this many ids a plain Python loop beats numpy's per-call cost
# floats per chunk of an ordered sum's pipeline (Comm._ordered_sum): 256 KiB messages, and a
# small model still cut into up to _CHAIN_MIN chunks of at least _CHAIN_MIN_FLOATS (16 KiB), so
# that the next rank adds one chunk while this one makes the next: the 23k-parameter MLP
# of bench/README.md (Performance III) in one chunk left the last rank's whole sum after the wait
_CHAIN_FLOATS = 1 << 16
_CHAIN_MIN, _CHAIN_MIN_FLOATS = 8, 1 << 12
# clients whose products w_i * row_i an ordered sum makes in one kernel (its scratch: this many rows of a chunk)
_PRODUCT_ROWS = 64


def _timed(fn):
    """Add the verb's wall time to ``self.seconds`` (the round's comm time)."""

    @functools.wraps(fn)
    def wrapper(self, *a, **k):
        t0 = time.perf_counter()
        try:
            return fn(self, *a, **k)
        finally:
            self.seconds += time.perf_counter() - t0

    return wrapper


@dataclass(frozen=True)
class Placement:
    """Clients in contiguous blocks: rank r hosts ids [starts[r], starts[r+1])."""

    n_clients: int
    n_ranks: int

    @functools.cached_property
    def starts(self) -> np.ndarray:  # every verb asks: computed once
        return np.array([r * self.n_clients // self.n_ranks for r in range(self.n_ranks + 1)])

    def owner(self, client: int | np.ndarray) -> np.ndarray | int:
        return np.searchsorted(self.starts, client, side="right") - 1

    def local_ids(self, rank: int) -> np.ndarray:
        s = self.starts
        return np.arange(s[rank], s[rank + 1])

    def counts(self) -> np.ndarray:
        return np.diff(self.starts)


def _runs(terms: list[int], groups: np.ndarray) -> list[tuple[int, list[int]]]:
    """``terms`` (client positions, in order) as (group, positions) runs: each group's
    clients in their order, cut into runs of at most ``_PRODUCT_ROWS``."""
    if not terms:
        return []
    t = np.asarray(terms)
    order = t[np.argsort(groups[t], kind="stable")]
    keys = groups[order]
    out = []
    for part in np.split(order, np.flatnonzero(np.diff(keys)) + 1):  # one part per group, in one pass
        ids = part.tolist()
        out += [(int(groups[ids[0]]), ids[j:j + _PRODUCT_ROWS]) for j in range(0, len(ids), _PRODUCT_ROWS)]
    return out


class BufferPool:
    """Reusable float32 receive buffers.

    A fresh ``[n, P]`` buffer costs a page fault per 4 KiB on first touch, as much
    as the transfer itself for large models. A pooled buffer is handed out again
    only when nothing else refers to it (no numpy view, no ``torch.from_numpy``
    tensor or view of one is alive), so results a caller keeps are never
    overwritten."""

    def __init__(self, keep: int = 4):
        self.keep = keep
        self.free: list[np.ndarray] = []

    def get(self, n: int, P: int) -> np.ndarray:
        for i in range(len(self.free)):
            # 2 references when unused: the list's and getrefcount's argument
            if self.free[i].shape[1] == P and self.free[i].shape[0] >= n and sys.getrefcount(self.free[i]) <= 2:
                b = self.free.pop(i)
                self.free.append(b)  # most recently used last
                return b[:n]
        b = np.empty((n, P), np.float32)
        self.free.append(b)
        if len(self.free) > self.keep:
            self.free.pop(0)
        return b


class Comm:
    """A communicator plus the clients placed on it and their traffic counters."""

    itemsize = F32  # bytes per model coordinate, for algorithms counting traffic themselves

    def __init__(self, n_clients: int, mpi_comm: MPI.Comm | None = None):
        self.mpi = mpi_comm if mpi_comm is not None else MPI.COMM_WORLD
        self.rank = self.mpi.Get_rank()
        self.size = self.mpi.Get_size()
        self.is_writer = self.rank == 0
        self.placement = Placement(n_clients, self.size)
        self.local_ids = self.placement.local_ids(self.rank)
        self.n_local = len(self.local_ids)
        self.first = int(self.local_ids[0]) if self.n_local else 0
        self.pool = BufferPool()
        self._scratch_buf: np.ndarray | None = None  # see _scratch
        self._bounds = self.placement.starts.tolist()  # plain ints: small requests skip numpy
        self._layouts: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.reset_counters()

    # ------------------------------------------------------------------ counters
    def reset_counters(self) -> None:
        self.bytes_sent = np.zeros(self.n_local, np.int64)
        self.bytes_recv = np.zeros(self.n_local, np.int64)
        self.models_recv = np.zeros(self.n_local, np.int64)
        self.wire_sent = 0
        self.wire_recv = 0
        self.seconds = 0.0

    def count(self, local: np.ndarray | slice | int, *, sent: int = 0, recv: int = 0, models: int = 0) -> None:
        """Charge logical traffic to local clients (indices into this rank's block, or
        a slice); amounts are scalars or per-index arrays, repeated indices add up."""
        # np.add.at costs microseconds a call, a visible share of a small model's
        # transfer: skip the counters an amount leaves alone, and index directly
        # where no index can repeat (one client)
        one = isinstance(local, slice) or np.ndim(local) == 0 or len(local) == 1
        for counter, amount in ((self.bytes_sent, sent), (self.bytes_recv, recv), (self.models_recv, models)):
            if not (amount.any() if isinstance(amount, np.ndarray) else amount):
                continue
            if one:
                counter[local] += amount
            else:
                np.add.at(counter, local, amount)

    def _post_recvs(self, ids: list[list[int]], P: int, tag: int) -> tuple[dict[int, np.ndarray], list]:
        """Post an Irecv of ``len(ids[r])`` rows of P floats from every other rank r
        that sends any, into pooled buffers: (buffer by rank, requests)."""
        bufs, reqs = {}, []
        for r in range(self.size):
            if r == self.rank or not ids[r]:
                continue
            bufs[r] = self.pool.get(len(ids[r]), P)
            reqs.append(self.mpi.Irecv([bufs[r], MPI.FLOAT], source=r, tag=tag))
        return bufs, reqs

    def _isend_rows(self, ids: list[list[int]], make: Callable[[int], np.ndarray], tag: int,
                    reqs: list) -> list[np.ndarray]:
        """Isend ``make(r)`` to every other rank r that ``ids[r]`` gives rows; the
        requests join ``reqs``; returns the buffers, which must outlive the sends."""
        keep = []
        for r in range(self.size):
            if r == self.rank or not ids[r]:
                continue
            sb = make(r)
            keep.append(sb)
            reqs.append(self.mpi.Isend([sb, MPI.FLOAT], dest=r, tag=tag))
            self.wire_sent += sb.nbytes
        return keep

    def _by_owner(self, ids: list[int]) -> list[list[int]]:
        """Sorted global ``ids`` split by the rank hosting them."""
        if len(ids) <= _SMALL:
            bounds = self._bounds
            return [[j for j in ids if bounds[r] <= j < bounds[r + 1]] for r in range(self.size)]
        cut = np.searchsorted(np.asarray(ids, np.int64), self.placement.starts[1:-1])
        return [part.tolist() for part in np.split(np.asarray(ids, np.int64), cut)]

    def to_local(self, ids: np.ndarray) -> np.ndarray:
        return np.asarray(ids) - self.first

    # ------------------------------------------------------------------ small metadata
    def barrier(self) -> None:
        self.mpi.Barrier()

    def bcast(self, obj, root: int = 0):
        return self.mpi.bcast(obj, root=root)

    def allgather(self, obj) -> list:
        return self.mpi.allgather(obj)

    def allreduce_max(self, x: float) -> float:
        return self.mpi.allreduce(x, op=MPI.MAX)

    def allreduce_sum(self, x: float) -> float:
        return self.mpi.allreduce(x, op=MPI.SUM)

    # ------------------------------------------------------------------ collectives
    @_timed
    def weighted_sum(self, rows: torch.Tensor, weights: torch.Tensor | np.ndarray) -> torch.Tensor:
        """sum_i w_i * rows_i over every client of every rank, the same bits for any
        placement (see :meth:`_ordered_sum`).

        ``rows`` is this rank's ``[n_local, P]`` block, ``weights`` its ``[n_local]``
        weights. Clients with non-zero weight are charged one model sent.
        """
        out = self._ordered_sum(rows, weights, None, 1)[0]
        self._charge_senders(weights, rows.shape[1])
        return out

    @_timed
    def grouped_sum(self, rows: torch.Tensor, weights, groups, n_groups: int) -> torch.Tensor:
        """Per-group weighted sums ``[n_groups, P]``: sum over clients i with groups[i] == g."""
        out = self._ordered_sum(rows, weights, np.asarray(groups), n_groups)
        self._charge_senders(weights, rows.shape[1])
        return out

    def _charge_senders(self, weights, P: int) -> None:
        w = weights.detach().cpu().numpy() if torch.is_tensor(weights) else np.asarray(weights)
        self.count(np.flatnonzero(w), sent=P * F32)

    def _scratch(self, n: int, L: int) -> np.ndarray:
        """A reused ``[n, L]`` float32 scratch (an ordered sum's products): a fresh one
        would page-fault its megabytes in every round."""
        s = self._scratch_buf
        if s is None or s.shape[0] < n or s.shape[1] != L:
            s = self._scratch_buf = np.empty((n, L), np.float32)
        return s

    def _ordered_sum(self, rows: torch.Tensor, weights, groups: np.ndarray | None, K: int) -> torch.Tensor:
        """``[K, P]``: for every client i in order 0..N-1 with w_i != 0,
        ``acc[g_i] = acc[g_i] + fl(w_i * row_i)``, whatever the placement.

        Not an Allreduce: float addition is not associative and MPI leaves the order
        of a reduction to the library, which picks it by rank count and node layout
        (MPICH reduces inside each node first when the ranks span nodes), so the
        same run gave other bits on other layouts. Here the partial sum travels
        along the ranks in rank order, which is client order (contiguous blocks):
        rank r receives the sum over the clients before its block, adds its own one
        at a time and passes it on; the last rank broadcasts the total. It goes in
        chunks of columns, so neighbouring ranks work on different chunks at once (a
        pipeline): each rank receives and sends the ``[K, P]`` once on the chain and
        once in the broadcast, as a reduce-scatter + allgather Allreduce does; it
        costs more latency (R - 1 hops in a row), which only small models notice.
        Each term is rounded before it is added (two IEEE operations, never a fused
        multiply-add), so threads, SIMD width and the device change no bit. On the
        CPU a rank makes a run of products in one kernel (before its partial sum
        arrives, for the first run) and adds them in order in one numpy reduction;
        on a GPU it loops over its clients.
        """
        P, dev = rows.shape[1], rows.device
        w = (weights.detach().cpu().numpy() if torch.is_tensor(weights) else np.asarray(weights)).astype(np.float32)
        g = np.zeros(len(w), np.int64) if groups is None else np.asarray(groups, np.int64)
        terms = np.flatnonzero(w).tolist()
        n_chunks = max(1, -(-K * P // _CHAIN_FLOATS), min(_CHAIN_MIN, K * P // _CHAIN_MIN_FLOATS))
        L = -(-P // n_chunks)  # columns per chunk, the last one padded
        buf = self.pool.get(n_chunks * K, L).reshape(n_chunks, K, L)
        left = self.rank - 1 if self.rank > 0 else None
        right = self.rank + 1 if self.rank < self.size - 1 else None
        recvs = [self.mpi.Irecv([buf[k], MPI.FLOAT], source=left, tag=15) for k in range(n_chunks)] \
            if left is not None else []
        if left is None:
            buf[:] = 0
        terms_of = (_HostTerms(rows, w, g, terms, self._scratch, L) if dev.type == "cpu"
                    else _DeviceTerms(rows, w, g, terms, L))
        sends = []
        for k in range(n_chunks):
            a, b = k * L, min(P, (k + 1) * L)
            work = bool(terms) and b > a
            if work:  # on the CPU the first products need no partial sum: made while the left neighbour still adds
                terms_of.prepare(a, b)
            if recvs:
                recvs[k].Wait()
                self.wire_recv += buf[k].nbytes
            if work:
                terms_of.add(buf[k], a, b)
            if right is not None:
                sends.append(self.mpi.Isend([buf[k], MPI.FLOAT], dest=right, tag=15))
                self.wire_sent += buf[k].nbytes
        MPI.Request.Waitall(sends)
        return self._total(buf, right, K, P).to(dev)

    def _total(self, buf: np.ndarray, right: int | None, K: int, P: int) -> torch.Tensor:
        """The last rank's ``[n_chunks, K, L]`` chain sum on every rank, as ``[K, P]``."""
        if self.size > 1:
            self.mpi.Bcast([buf, MPI.FLOAT], root=self.size - 1)
            if right is None:
                self.wire_sent += buf.nbytes
            else:
                self.wire_recv += buf.nbytes
        n_chunks, _, L = buf.shape
        if n_chunks == 1:  # [1, K, P]: the buffer itself, no copy
            return torch.from_numpy(buf[0][:, :P])
        return torch.from_numpy(np.ascontiguousarray(buf.transpose(1, 0, 2).reshape(K, n_chunks * L)[:, :P]))

    @_timed
    def gather_rows(self, local: np.ndarray | torch.Tensor, root: int = 0) -> np.ndarray | None:
        """Stack every rank's ``[n_local, ...]`` rows in client order on ``root``."""
        arr = np.ascontiguousarray(local.detach().cpu().numpy() if torch.is_tensor(local) else local)
        if self.size == 1:  # one rank holds every row: a Gatherv to itself cost the log step 0.05 ms of 0.9
            # (bench/logging_share.py, cold after the round's torch work)
            return arr.copy()
        trailing = arr.shape[1:]
        out = np.empty((self.placement.n_clients, *trailing), arr.dtype) if self.rank == root else None
        mpitype = MPI._typedict[arr.dtype.char]
        recv = [out, self._layout(arr), mpitype] if self.rank == root else None
        self.mpi.Gatherv([arr, mpitype], recv, root=root)
        return out

    def _layout(self, arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(counts, displacements) of every rank's rows shaped like ``arr``'s in a
        gather: a round's logging gathers the same few shapes each round, so cached."""
        per = int(np.prod(arr.shape[1:]))
        got = self._layouts.get(per)
        if got is None:
            counts = self.placement.counts() * per
            got = self._layouts[per] = (counts, np.concatenate([[0], np.cumsum(counts)[:-1]]))
        return got

    @_timed
    def gather_concat(self, local: np.ndarray, root: int = 0) -> np.ndarray | None:
        """Concatenate every rank's 1-D array (any length) in rank order on ``root``
        (the non-zeros of sparse logs)."""
        arr = np.ascontiguousarray(np.asarray(local).ravel())
        counts = self.mpi.gather(len(arr), root=root)
        mpitype = MPI._typedict[arr.dtype.char]
        if self.rank != root:
            self.mpi.Gatherv([arr, mpitype], None, root=root)
            return None
        counts = np.asarray(counts)
        out = np.empty(int(counts.sum()), arr.dtype)
        self.mpi.Gatherv([arr, mpitype], [out, (counts, np.concatenate([[0], np.cumsum(counts)[:-1]])), mpitype],
                         root=root)
        return out

    @_timed
    def allgather_rows(self, local: np.ndarray | torch.Tensor) -> np.ndarray:
        """Every rank gets the ``[N, ...]`` stack of every client's small row."""
        arr = np.ascontiguousarray(local.detach().cpu().numpy() if torch.is_tensor(local) else local)
        out = np.empty((self.placement.n_clients, *arr.shape[1:]), arr.dtype)
        mpitype = MPI._typedict[arr.dtype.char]
        self.mpi.Allgatherv([arr, mpitype], [out, self._layout(arr), mpitype])
        return out

    @_timed
    def allgather_ids(self, rows: torch.Tensor, ids: np.ndarray) -> torch.Tensor:
        """Every rank gets ``[len(ids), P]``: the rows of the listed clients (global
        ids, sorted, the same list on every rank), in that order. A server's view of
        the round's uploads (CFL's, pFedGraph's similarity of the sampled clients'
        models): one Allgatherv carrying each listed row once. The logical traffic is
        the caller's to charge (``count``), as what a client uploads to a server is
        charged once however many ranks play the server."""
        ids = np.asarray(ids, np.int64)
        P = rows.shape[1]
        mine = ids[(ids >= self.first) & (ids < self.first + self.n_local)]
        send = _take_rows(_host(rows), self.to_local(mine)) if len(mine) else np.empty((0, P), np.float32)
        counts = np.diff(np.searchsorted(ids, self.placement.starts)) * P
        out = np.empty((len(ids), P), np.float32)
        displ = np.concatenate([[0], np.cumsum(counts)[:-1]])
        self.mpi.Allgatherv([np.ascontiguousarray(send), MPI.FLOAT], [out, (counts, displ), MPI.FLOAT])
        self.wire_sent += send.nbytes * (self.size - 1)
        self.wire_recv += out.nbytes - send.nbytes
        return torch.from_numpy(out).to(rows.device)

    # ------------------------------------------------------------------ point to point
    @_timed
    def pull(self, rows: torch.Tensor, wanted: dict[int, list[int]] | list[list[int]]) -> dict[int, torch.Tensor]:
        """Fetch other clients' rows.

        ``rows``: this rank's ``[n_local, P]`` block (what others may pull).
        ``wanted``: for each local client (index into the block) the global ids whose
        rows it needs. Returns ``{global id: row}`` covering every id any local client
        asked for; every row is a copy, whether it came from another rank or this
        one. One small alltoall of requests, then one Isend/Irecv per rank pair
        carrying each needed row once, however many local clients want it.
        """
        wanted = _as_wanted(wanted, self.n_local)
        P = rows.shape[1]
        askers: dict[int, int] = {}
        for js in wanted.values():
            for j in js:
                askers[j] = askers.get(j, 0) + 1
        req = self._by_owner(sorted(askers))
        # asked[r]: (id, number of asking clients) that rank r needs from us
        asked_n = self.mpi.alltoall([[(j, askers[j]) for j in ids] for ids in req])
        asked = [[j for j, _ in pairs] for pairs in asked_n]

        out: dict[int, torch.Tensor] = {}
        recv_bufs, reqs = self._post_recvs(req, P, tag=11)
        host = functools.cache(lambda: _host(rows))  # copied to the host once, and only when a rank asks
        send_keep = self._isend_rows(asked, lambda r: _take_rows(host(), self.to_local(asked[r])), 11, reqs)
        # everything below but the wait reads no received data: it runs while the
        # rows are in flight (views of the receive buffers are filled by the wait)
        cpu = rows.device.type == "cpu"
        for r, buf in recv_bufs.items():
            self.wire_recv += buf.nbytes
            if cpu:
                t = torch.from_numpy(buf)
                for k, j in enumerate(req[r]):
                    out[j] = t[k]
        # a copy, like the rows that crossed MPI: a view would follow later in-place
        # updates of the block, so what a client holds would depend on the placement
        for j in req[self.rank]:
            out[j] = rows[j - self.first].clone()

        # logical accounting: every (asking client, id) pair is one model moved;
        # owners are charged one model sent per asking client
        pairs = [jn for ps in asked_n for jn in ps]
        if len(wanted) + len(pairs) <= _SMALL:  # numpy's per-call cost would dominate
            for i, js in wanted.items():
                if js:
                    self.bytes_recv[i] += len(js) * P * F32
                    self.models_recv[i] += len(js)
            for j, n in pairs:
                self.bytes_sent[j - self.first] += n * P * F32
        else:
            n_wanted = np.array([len(js) for js in wanted.values()], np.int64)
            self.count(np.fromiter(wanted, np.int64, len(wanted)), recv=n_wanted * P * F32, models=n_wanted)
            pairs = np.array(pairs, np.int64).reshape(-1, 2)
            self.count(pairs[:, 0] - self.first, sent=pairs[:, 1] * P * F32)
        MPI.Request.Waitall(reqs)
        del send_keep  # the sent buffers lived until here
        if not cpu:  # one host-to-device copy per received block
            for r, buf in recv_bufs.items():
                t = torch.from_numpy(buf).to(rows.device)
                for k, j in enumerate(req[r]):
                    out[j] = t[k]
        return out

    @_timed
    def push(self, contributions: dict[int, dict[int, torch.Tensor]], P: int, device=None) -> torch.Tensor:
        """Reverse of :meth:`pull`: local client i sends tensor ``contributions[i][j]``
        to the owner of client j; returns ``[n_local, P]`` sums of what each local
        client received (zeros where nothing arrived).

        Every (sender, receiver) row travels on its own, and each receiver's rows are
        summed in the senders' client order from zero, wherever the senders live: the
        same bits on any number of ranks (a sum grouped by sending rank first would
        follow the placement). On one rank nothing travels and the order is the same.
        """
        device = device or "cpu"
        terms = sorted((int(j), int(self.local_ids[i]), g) for i, cs in contributions.items() for j, g in cs.items())
        n_sent = np.array([len(cs) for cs in contributions.values()], np.int64)
        self.count(np.fromiter(contributions, np.int64, len(contributions)), sent=n_sent * P * F32)
        owners = self.placement.owner(np.array([t[0] for t in terms], np.int64)) if terms else np.zeros(0, np.int64)
        by_rank: list[list[tuple[int, int, torch.Tensor]]] = [[] for _ in range(self.size)]
        for t, r in zip(terms, owners.tolist()):
            by_rank[r].append(t)
        recv_keys = self.mpi.alltoall([[(j, i) for j, i, _ in ts] for ts in by_rank])

        recv_bufs, reqs = self._post_recvs(recv_keys, P, tag=12)
        keep = self._isend_rows(by_rank, lambda r: np.ascontiguousarray(np.stack([_host(g) for _, _, g in by_rank[r]])),
                                12, reqs)
        MPI.Request.Waitall(reqs)
        del keep  # the sent buffers lived until here
        arrived = [(j, i, g.detach().cpu()) for j, i, g in by_rank[self.rank]]
        for r, buf in recv_bufs.items():
            self.wire_recv += buf.nbytes
            arrived += [(j, i, torch.from_numpy(buf[q])) for q, (j, i) in enumerate(recv_keys[r])]
        arrived.sort(key=lambda t: (t[0], t[1]))
        out = torch.zeros(self.n_local, P, dtype=torch.float32)
        for j, _, row in arrived:
            out[j - self.first] += row

        # owners are charged one model received per contributing client
        got = np.array([j for j, _, _ in arrived], np.int64)
        if len(got):
            ids, n = np.unique(got, return_counts=True)
            self.count(ids - self.first, recv=n * P * F32)
        return out.to(device)

    @_timed
    def ring(self, rows: torch.Tensor, visit: Callable[[np.ndarray, torch.Tensor], None],
             count_as_models: bool = True) -> None:
        """Rotate every rank's block of rows around the ranks; ``visit(ids, rows)`` is
        called once per block (this rank's own block first), so each rank sees all N
        rows while holding its own block and one incoming block (one buffer, replaced
        in place by ``Sendrecv_replace``; the MPI library may stage a copy in flight).
        The rows given to ``visit`` are overwritten by the next step: copy what you keep.

        Each local client is charged the rows of every other client as received, and
        its own row as sent once per other client (the N-1 copies a real all-to-all
        exchange would send); ``count_as_models`` also counts them in ``models_recv``.
        """
        P = rows.shape[1]
        b = self._bounds  # plain ints: a ring step of a small model costs microseconds
        counts = [b[r + 1] - b[r] for r in range(self.size)]
        maxn = max(counts)
        everyone = slice(None)
        models = 1 if count_as_models else 0
        t_visit = time.perf_counter()
        visit(self.local_ids, rows)
        busy = time.perf_counter() - t_visit
        if self.n_local > 1:  # own clients' rows seen by the other local clients
            k = self.n_local - 1
            self.count(everyone, sent=k * P * F32, recv=k * P * F32, models=k * models)
        if self.size == 1:
            self.seconds -= busy  # visiting is compute: keep it out of the comm time
            return
        # one foreign block at a time; every exchange moves maxn rows so that the
        # in-place swap works with uneven blocks (they differ by at most one row)
        buf = self.pool.get(maxn, P)  # not a fresh buffer: see BufferPool
        left, right = (self.rank - 1) % self.size, (self.rank + 1) % self.size
        for step in range(1, self.size):
            if step == 1:
                own = _host(rows)
                self.mpi.Sendrecv([own, MPI.FLOAT], dest=right, sendtag=13,
                                  recvbuf=[buf[:counts[left]], MPI.FLOAT], source=left, recvtag=13)
                self.wire_sent += own.nbytes
                self.wire_recv += counts[left] * P * F32
                del own
            else:
                self.mpi.Sendrecv_replace([buf, MPI.FLOAT], dest=right, sendtag=13, source=left, recvtag=13)
                self.wire_sent += buf.nbytes
                self.wire_recv += buf.nbytes
            src = (self.rank - step) % self.size  # origin of the block held now
            n = counts[src]
            t_visit = time.perf_counter()
            visit(np.arange(b[src], b[src + 1]), torch.from_numpy(buf[:n]).to(rows.device))
            busy += time.perf_counter() - t_visit
            self.count(everyone, recv=n * P * F32, models=n * models)
            # meanwhile our own block is being visited by rank + step
            self.count(everyone, sent=counts[(self.rank + step) % self.size] * P * F32)
        self.seconds -= busy  # visiting is compute: keep it out of the comm time


class _HostTerms:
    """A rank's terms on the CPU: a run of products ``fl(w_i * row_i)`` in one kernel
    (a product is one rounding in any kernel), added to the partial sum in order in
    one numpy reduction."""

    def __init__(self, rows: torch.Tensor, w: np.ndarray, g: np.ndarray, terms: list[int],
                 scratch: Callable[[int, int], np.ndarray], L: int):
        self.X, self.w = rows.detach().numpy(), w
        self.runs = _runs(terms, g)
        self.stack = scratch(1 + max((len(ids) for _, ids in self.runs), default=0), L)

    def products(self, ids: list[int], a: int, b: int) -> None:
        """The clients ``ids``' products on columns a:b into rows 1.. of ``stack``."""
        out, lo, hi = self.stack[1:1 + len(ids), :b - a], ids[0], ids[-1] + 1
        if hi - lo == len(ids):  # consecutive clients: views, no gather
            np.multiply(self.X[lo:hi, a:b], self.w[lo:hi, None], out=out)
        else:
            np.multiply(self.X[ids, a:b], self.w[ids, None], out=out)

    def prepare(self, a: int, b: int) -> None:
        self.products(self.runs[0][1], a, b)

    def add(self, chunk: np.ndarray, a: int, b: int) -> None:
        stack = self.stack
        for n, (kk, ids) in enumerate(self.runs):
            if n:
                self.products(ids, a, b)
            acc = chunk[kk, :b - a]
            stack[0, :b - a] = acc
            # numpy reduces an axis that is not the fastest in memory by adding
            # row after row in order (pairwise summation is only along the fast
            # axis): ((acc + t_1) + t_2) + ..., the bits of a loop of adds
            np.add.reduce(stack[:1 + len(ids), :b - a], axis=0, out=acc)


class _DeviceTerms:
    """A rank's terms on a GPU: one product and one add per client, in order."""

    def __init__(self, rows: torch.Tensor, w: np.ndarray, g: np.ndarray, terms: list[int], L: int):
        self.rows, self.w, self.g, self.terms = rows, w, g, terms
        self.tmp = torch.empty(L, dtype=torch.float32, device=rows.device)

    def prepare(self, a: int, b: int) -> None:
        """Nothing before the partial sum arrives."""

    def add(self, chunk: np.ndarray, a: int, b: int) -> None:
        acc_t = torch.from_numpy(chunk).to(self.rows.device)
        t = self.tmp[:b - a]
        for i in self.terms:
            torch.mul(self.rows[i, a:b], float(self.w[i]), out=t)
            acc_t[self.g[i], :b - a].add_(t)
        chunk[...] = acc_t.cpu().numpy()


def agree(comm: Comm | MPI.Comm, fn: Callable):
    """Run ``fn`` on every rank; if it raised a user error (ConfigError) or a
    refused write (StorageError) on any rank, raise it on all, so that a setup
    mistake or a full disk seen by one rank cannot leave the others waiting in a
    collective."""
    from mpifl.errors import ConfigError, StorageError

    mpi = comm.mpi if isinstance(comm, Comm) else comm
    kinds = (ConfigError, StorageError)
    try:
        result, err = fn(), None
    except kinds as e:
        result, err = None, (int(isinstance(e, StorageError)), str(e))
    errs = mpi.allgather(err)
    first = next((e for e in errs if e is not None), None)
    if first is not None:
        raise kinds[first[0]](first[1])
    return result


def _as_wanted(wanted, n_local: int) -> dict[int, list[int]]:
    """Per local client its distinct wanted ids: a model asked for twice arrives
    (and is charged) once."""
    if not isinstance(wanted, dict):
        assert len(wanted) == n_local, "one list of wanted ids per local client"
        wanted = dict(enumerate(wanted))
    return {int(i): sorted({int(j) for j in js}) for i, js in wanted.items()}


def _take_rows(host: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Rows ``idx`` of ``host`` as a contiguous array: a view (no copy) when they
    are consecutive, as when a whole block or a run of clients is asked for."""
    idx = np.asarray(idx)
    if len(idx) and np.all(np.diff(idx) == 1):
        return host[int(idx[0]):int(idx[-1]) + 1]
    return np.ascontiguousarray(host[idx])


def _host(t: torch.Tensor) -> np.ndarray:
    """A float32 numpy view (CPU) or copy (GPU) of a tensor for MPI buffers."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype != torch.float32:
        t = t.float()
    return np.ascontiguousarray(t.numpy())


# --------------------------------------------------------------------------- process setup
