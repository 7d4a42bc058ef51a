"""The run log: one HDF5 file written by rank 0, one row per round.

Layout (rows are rounds, columns clients)::

    attrs: mpifl_version, algorithm, seed, n_clients, n_ranks, n_nodes,
           config_yaml, versions, hostname, started_at,
           provenance (JSON: commit, CPU kernels, devices, hosts; mpifl.run.provenance)
    /clients/{cluster, rank, node, n_train, n_val, n_test, label_hist}
               (rank: the MPI rank hosting the client; node: that rank's node,
                numbered in the order of each node's lowest rank)
    /rounds/{round, wall_s, comm_s, compute_s}
    /metrics/{train_loss, val_loss, val_acc, test_loss, test_acc,
              skipped}  (updates dropped as non-finite that round)   [R, N]
    /comm/{bytes_sent, bytes_recv, models_recv}                     [R, N]
    /train/{steps, samples}  (optimizer steps a client took that round, and the
              training samples in them: mpifl.train.Clients.count)  [R, N]
    /graph/mixing                                                   [R, N, N]
    /<algorithm>/<extra>                                            [R, N, ...]

The writer keeps the file open and commits it after every round
(:mod:`mpifl.logging.journal`): the file on disk changes only by whole rounds, so
between rounds any reader (h5py, h5dump, ``open_run``) can open it while the run
goes on, and a SIGKILL at any instant leaves every finished round readable (a
complete ``run.h5.journal`` left by the kill is replayed by ``open_run`` in
memory and by the next writer for good). ``/rounds/round`` is written last: its
length is the number of complete rounds, and readers ignore rows past it.

Row i of every per-round dataset is round ``/rounds/round[i]`` (``Run.rounds``):
with ``log.every = k`` only every k-th round (and the last) is logged.
``/rounds/round`` holds 0-based round indices (the first round is 0); everything
shown to a user numbers rounds from 1 (``round 1/30`` on the console, the
``round`` column of ``mpifl.results`` frames), so round r of the console is index r - 1
here. ``Run.row(t)`` and ``Run.mixing(t)`` take a row index, negative from the end.

Above ``dense_max`` clients an N x N matrix per round stops fitting; the mixing
matrix is then stored compactly (``/graph`` attr ``mixing_format = compact``), in
the form the round's :class:`mpifl.logging.mixing.Mixing` encodes itself to, with
``mixing_kind`` per row naming the form (the codes are defined on the ``Mixing``
types): the non-zeros of ``Dense`` rows (``mixing_coo/{row,col,val}``
concatenated over rounds, round i's in ``[end[i-1], end[i])`` of
``mixing_coo/end``), the one row of ``Shared`` (``mixing_shared``), or the group
ids and weights of ``Grouped`` (``mixing_group``, ``mixing_shared``).

``Run.mixing(i)`` returns the dense matrix whichever the storage.

Every chunk of the log is checked on read: uncompressed chunks carry HDF5's
Fletcher-32 checksum, gzip'd ones zlib's Adler-32 (a Fletcher-32 over the 40 KB
gzip'd mixing chunk of an N = 100 round cost 20 us and adds nothing). A chunk
changed after it was written (a bit flip on disk, a damaged copy) fails to read,
and ``Run`` raises :class:`Corrupt` naming the dataset; scalars and empty
datasets are not chunked and carry none. A closed log also carries a CRC-32 of
every dataset's values (:mod:`.sums`), checked the first time a reader reads the
dataset: it sees the flips Fletcher-32 cannot (0x0000 <-> 0xFFFF) and a chunk
read as never written.

A write the file system refuses (full, over quota, I/O error) raises
``StorageError`` from the writer, which then writes nothing more; the file keeps
every round committed before it (:mod:`.journal`).
"""

from __future__ import annotations

import copy
import io
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from mpifl.errors import StorageError, storage_error
from mpifl.logging import pending as pending_rounds
from mpifl.logging import sums
from mpifl.logging.journal import Journaled, journal_path, read_journal, still
from mpifl.logging.mixing import COO_COL, COO_END, COO_ROW, COO_VAL, Dense, Mixing

ROUND_KEY = "rounds/round"
CHUNK_BYTES = 1 << 12  # per-round datasets: rows per chunk up to this size (measured: 4 KiB best)


def _checksummed(shape: tuple, compress: bool = False) -> dict[str, Any]:
    """``create_dataset`` keywords of a dataset written whole: gzip when ``compress``
    (zlib checks its own), else Fletcher-32 where it can be chunked (not a scalar,
    not empty)."""
    if compress:
        return {"compression": "gzip"}
    return {"fletcher32": True} if shape and 0 not in shape else {}


class Corrupt(ValueError):
    """A chunk of the log fails its checksum (or decompression): the file changed
    after it was written."""


@contextmanager
def _checked(path: str):
    """Reading dataset ``path``: a chunk failing its filters raises :class:`Corrupt`."""
    try:
        yield
    except OSError as e:
        if "filter returned failure" not in str(e):  # HDF5's words for a checksum (or gzip) failure
            raise
        raise Corrupt(f"/{path} fails its checksum: the file changed after it was written "
                      f"(a bit flip or a damaged disk or copy)") from None


class _Log:
    """The writer's open file and its extensible datasets.

    Dataset handles are kept across rounds and rows are written through h5py's
    low-level calls: a name lookup and h5py's slicing machinery each cost more
    than writing a round's row, and a round writes a dozen of them."""

    GROW = 64  # per-round datasets grow this many rows at a time (rounds/round: one)

    def __init__(self, f: h5py.File):
        self.f = f
        self.ds: dict[str, h5py.Dataset] = {}
        self.size: dict[str, int] = {}  # rows allocated per dataset, to skip a shape query
        # h5py builds a file space, a memory space and a memory type for every
        # write, three times the cost of HDF5's own write of a cached chunk: kept
        # here (a dataset's file space until it is resized)
        self._fspace: dict[str, Any] = {}
        self._mspace: dict[tuple, Any] = {}
        self._types: dict[str, tuple[np.dtype, Any]] = {}
        self.sums = sums.Running()  # the appended datasets' CRC-32s, for the seal at close

    def _dataset(self, path: str, row: np.ndarray) -> h5py.Dataset:
        """Open (or create, for rows like ``row``) the per-round dataset ``path`` and
        keep its handle."""
        if path not in self.f:
            # rows of a round are small at small N: a chunk of many rounds stays in
            # HDF5's chunk cache, so a round's write is a copy rather than a new
            # chunk's allocation and index insert
            per = max(1, min(self.GROW, CHUNK_BYTES // max(row.nbytes, 1)))
            chunk = (per, *row.shape) if row.ndim else (256,)
            # a chunk rewritten every round would be recompressed every round
            big = row.size > 64 and per == 1
            # a row the file holds but no write reached (grown ahead, or a process killed
            # before its chunk was flushed while rounds/round's extent was) reads as
            # missing (nan), never as a measured 0
            fill = np.nan if row.dtype.kind == "f" else None
            self.f.create_dataset(path, shape=(0, *row.shape), maxshape=(None, *row.shape), dtype=row.dtype,
                                  chunks=chunk, compression="gzip" if big else None,
                                  compression_opts=1 if big else None, fletcher32=not big,  # see the module
                                  fillvalue=fill)
            self.f[path].attrs["per_round"] = True
        ds = self.ds[path] = self.f[path]
        self.size[path] = ds.shape[0]
        return ds

    def append(self, path: str, row: np.ndarray, at: int) -> None:
        """Write ``row`` as row ``at`` of the extensible dataset ``path``."""
        self.append_block(path, np.asarray(row)[None], at)

    def append_block(self, path: str, block: np.ndarray, at: int) -> None:
        """Write ``block`` (k rows) as rows ``at .. at+k-1`` of the per-round dataset ``path``."""
        block = np.asarray(block)
        ds = self.ds.get(path)
        if ds is None:
            ds = self._dataset(path, block[0])
        end = at + len(block)
        if self.size[path] < end:
            # readers stop at the length of rounds/round, so other datasets may run
            # ahead of it: growing them in steps saves a resize per round each
            grow = end if path == ROUND_KEY else -(-end // self.GROW) * self.GROW
            ds.id.set_extent((grow, *block.shape[1:]))  # h5py's resize re-reads the shape: 10x slower
            self.size[path] = grow
            self._fspace.pop(path, None)
        self._write(path, block, at)

    def _write(self, path: str, block: np.ndarray, at: int) -> None:
        """``ds[at:at+len(block)] = block`` through the low-level API."""
        ds = self.ds[path]
        kind = self._types.get(path)
        if kind is None:
            kind = self._types[path] = (ds.dtype, h5py.h5t.py_create(ds.dtype))
        block = np.ascontiguousarray(block, dtype=kind[0])
        space = self._fspace.get(path)
        if space is None:
            space = self._fspace[path] = ds.id.get_space()
        space.select_hyperslab((at,) + (0,) * (block.ndim - 1), block.shape)
        mem = self._mspace.get(block.shape)
        if mem is None:
            mem = self._mspace[block.shape] = h5py.h5s.create_simple(block.shape)
        ds.id.write(mem, space, block, mtype=kind[1])
        self.sums.update(path, ds, block, at)

    def trim(self, rows: int) -> None:
        """Cut the datasets grown ahead back to ``rows`` (at close: exact shapes)."""
        for path, ds in self.ds.items():
            if ds.attrs.get("per_round", False) and self.size[path] > rows:
                ds.resize(rows, axis=0)
                self.size[path] = rows
                self._fspace.pop(path, None)

    def append_flat(self, path: str, values: np.ndarray) -> int:
        """Extend a 1-D dataset by ``values``; returns its new length."""
        values = np.asarray(values).ravel()
        ds = self.ds.get(path)
        if ds is None:
            if path not in self.f:
                self.f.create_dataset(path, shape=(0,), maxshape=(None,), dtype=values.dtype, chunks=(65536,),
                                      compression="gzip", compression_opts=1)
            ds = self.ds[path] = self.f[path]
        n = ds.shape[0]
        ds.resize(n + len(values), axis=0)
        self._fspace.pop(path, None)
        if len(values):
            self._write(path, values, n)
        return n + len(values)


def _stack(rows: list) -> np.ndarray:
    """``np.stack(rows)``, without its generic machinery for the usual single round."""
    return np.asarray(rows[0])[None] if len(rows) == 1 else np.stack([np.asarray(r) for r in rows])


def _compact(f: h5py.File) -> bool:
    return f["graph"].attrs.get("mixing_format", "dense") == "compact"


def _rows(f: h5py.File) -> int:
    """Complete rounds in the file (the length of ``/rounds/round``)."""
    return f[ROUND_KEY].shape[0] if ROUND_KEY in f else 0


def _append_rounds(log: _Log, recs: list[dict[str, Any]], compact: bool, at: int) -> int:
    """Write rounds ``recs`` (as ``Writer.write_round`` takes them) as rows ``at``..
    of the file; returns its rows now. ``/rounds/round`` last: it marks them complete."""
    f = log.f
    same = all(r["rows"].keys() == recs[0]["rows"].keys() and r["rounds"].keys() == recs[0]["rounds"].keys()
               for r in recs)
    if same:  # one extension per dataset for all the buffered rounds
        for k in recs[0]["rows"]:
            log.append_block(k, _stack([r["rows"][k] for r in recs]), at)
    for i, r in enumerate(recs):
        if not same:
            for k, v in r["rows"].items():
                log.append(k, v, at + i)
        for k, v in r["once"].items():
            if k in f:
                del f[k]
            f.create_dataset(k, data=v, **_checksummed(np.shape(v), np.size(v) > 64))
            f[k].attrs["round"] = r["t"]
        for k, v in r["attrs"].items():
            f.attrs[k] = json.dumps(v) if isinstance(v, (dict, list)) else v
    _mixing_rounds(log, at, recs, compact)
    for k in recs[0]["rounds"] if same else []:
        log.append_block(f"rounds/{k}", np.array([r["rounds"][k] for r in recs], np.float64), at)
    if not same:
        for i, r in enumerate(recs):
            for k, v in r["rounds"].items():
                log.append(f"rounds/{k}", np.float64(v), at + i)
    log.append_block(ROUND_KEY, np.array([r["t"] for r in recs], np.int64), at)
    return at + len(recs)


def _mixing_rounds(log: _Log, at: int, recs: list[dict[str, Any]], compact: bool) -> None:
    ms: list[Mixing | None] = [r["mixing"] for r in recs]
    if not compact:
        if all(m is not None for m in ms):
            log.append_block("graph/mixing", _stack([m.densify() for m in ms]), at)
        else:
            for i, m in enumerate(ms):
                if m is not None:
                    log.append("graph/mixing", m.densify(), at + i)
        return
    for i, m in enumerate(ms):
        if m is None:
            continue
        stored = m.encode()
        for k, v in stored.items():
            if not k.startswith("mixing_coo/"):
                log.append(f"graph/{k}", v, at + i)
        # every round has its (possibly empty) run of non-zeros
        for k in (COO_ROW, COO_COL):
            log.append_flat(f"graph/{k}", stored.get(k, np.empty(0, np.int32)))
        end = log.append_flat(f"graph/{COO_VAL}", stored.get(COO_VAL, np.empty(0, np.float32)))
        log.append(f"graph/{COO_END}", np.int64(end), at + i)


def _last_round(f: h5py.File) -> int:
    """The last complete round in the file, -1 when none."""
    n = _rows(f)
    return int(f[ROUND_KEY][n - 1]) if n else -1


class Writer:
    """Rank 0's handle on ``run.h5``: open from the first write to :meth:`close`,
    committed through the journal after every write. Reopening the file each round
    made HDF5 read every dataset's metadata again, three times the cost of the writes.

    ``flush_s`` > 0 buffers rounds and writes them into run.h5 together once that
    many seconds have passed since the last write (and on :meth:`flush` and
    :meth:`close`): a dozen dataset writes and a commit cost about the same for one
    round as for fifty. Meanwhile each round is appended to ``run.h5.rounds`` in
    one write (:mod:`.pending`), so a kill still loses no finished round:
    ``open_run`` reads both; h5py and h5dump see run.h5 at most ``flush_s`` late.
    ``flush_s = 0``: every round into run.h5 as it comes.
    """

    def __init__(self, path: Path, attrs: dict[str, Any], clients: dict[str, np.ndarray],
                 n_clients: int, dense_max: int = 1024, flush_s: float = 0.0, keep_rounds: int | None = None):
        """A new log, or with ``keep_rounds`` the existing one cut to the rounds before
        that one (resuming from a checkpoint: rounds logged after it are dropped)."""
        self.path = Path(path)
        self.n = n_clients
        self.compact = n_clients > dense_max
        self.flush_s = flush_s
        self.pending: list[dict[str, Any]] = []
        self._last = time.monotonic()
        self._log: _Log | None = None
        self._file: Journaled | None = None
        self._rows: int | None = None  # rounds in the file, once known
        self._kept: int | None = None  # rows committed (what a refused write leaves), once known
        self._failed = False  # a write was refused: nothing more is written
        self._closed = False
        self._appender = pending_rounds.Appender(self.path)
        if keep_rounds is not None and self.path.is_file():
            self._adopt()
            self.truncate(keep_rounds)
            self.compact = _compact(self._open().f)  # the form the log was begun with
            self.set_attrs(resumed_from_round=keep_rounds, n_ranks=attrs["n_ranks"])
            return
        # built beside the old log and renamed over it: a kill leaves one or the other
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            jf = Journaled(tmp, "w")
            try:
                with h5py.File(jf, "w") as f:
                    for k, v in attrs.items():
                        f.attrs[k] = json.dumps(v) if isinstance(v, (dict, list)) else v
                    for k, v in clients.items():
                        v = np.asarray(v)
                        f.create_dataset(f"clients/{k}", data=v, **_checksummed(v.shape))
                    g = f.create_group("graph")
                    g.attrs["mixing_format"] = "compact" if self.compact else "dense"
                jf.commit()
            finally:
                jf.close()
            journal_path(tmp).unlink(missing_ok=True)
            journal_path(self.path).unlink(missing_ok=True)  # the old log's, before the old log goes
            pending_rounds.rounds_path(self.path).unlink(missing_ok=True)
            os.replace(tmp, self.path)
            # the writer's mark for readers from now on: they copy the log while it exists (journal.snapshot)
            journal_path(self.path).touch()
        except OSError as e:
            if e.errno is None:  # HDF5's own failure, not the disk's
                raise
            for p in (tmp, journal_path(tmp)):
                p.unlink(missing_ok=True)
            raise storage_error("the log", self.path, e, "nothing was logged yet") from None
        self._kept = 0

    def write_round(self, t: int, rounds: dict[str, float], rows: dict[str, np.ndarray],
                    mixing: Mixing | None = None, once: dict[str, np.ndarray] | None = None,
                    attrs: dict[str, Any] | None = None) -> None:
        """Append round ``t`` as the next row. ``rows``: ``{"metrics/val_acc": [N],
        "federico/client_weights": [N, N], ...}``; ``once``: datasets written whole,
        with attr ``round`` = t (e.g. LIA's influence); ``mixing``: the whole
        ``[N, N]`` mixing matrix in any of its forms."""
        rec = {"t": t, "rounds": dict(rounds), "rows": rows, "mixing": mixing, "once": once or {},
               "attrs": attrs or {}}
        self.pending.append(rec)
        if time.monotonic() - self._last >= self.flush_s:
            self.flush()
        elif not self._failed:
            with self._storage():
                self._appender.append(pending_rounds.encode(rec, self.compact))

    def _adopt(self) -> None:
        """Rounds a killed writer left in ``run.h5.rounds``, into run.h5 for good
        (those past its last round: a kill inside a flush leaves some in both)."""
        try:
            recs = pending_rounds.read(self._appender.path)
        except pending_rounds.Damaged:  # its rounds come after the last flush, so after the checkpoint: cut anyway
            recs = []
        if recs:
            with self._storage():
                log = self._open()
                last = _last_round(log.f)
                recs = [r for r in recs if r["t"] > last]
                if recs:
                    _append_rounds(log, recs, _compact(log.f), _rows(log.f))
                    self._commit()
        self._appender.path.unlink(missing_ok=True)

    def close(self) -> None:
        """Write what is buffered and close the file. After a refused write
        (``StorageError``), close without writing anything more. Closing again does
        nothing (the run's cleanup closes a writer its last round already closed)."""
        if self._closed:
            return
        if self._failed:
            self._abandon()
            return
        with self._storage():
            self.flush()
            self._seal()
            if self._log is not None:
                self._log.f.close()
                self._log = None
            if self._file is not None:
                self._file.commit()
                self._file.close()
                self._file = None
                journal_path(self.path).unlink(missing_ok=True)
            self._appender.close(remove=True)  # run.h5 holds every round
        self._closed = True

    def _seal(self) -> None:
        """Exact shapes, then every dataset's CRC-32 (:mod:`.sums`), in the last commit."""
        log = self._open()
        if self._rows is not None:
            log.trim(self._rows)
        sums.seal(log.f, log.sums)

    @contextmanager
    def _storage(self):
        """A write the file system refuses becomes ``StorageError`` (one line, naming
        the log and what it keeps), and the writer writes nothing more."""
        try:
            yield
        except OSError as e:
            if e.errno is None or isinstance(e, StorageError):  # HDF5's own failure, or already said
                raise
            self._failed = True
            self._abandon()
            n = None if self._kept is None else self._kept + self._appender.records  # run.h5's and run.h5.rounds'
            kept = ("the rounds committed before it are kept" if n is None else
                    f"its first {n} logged round(s) are kept" if n else "it holds no round yet")
            raise storage_error("the log", self.path, e, kept) from None

    def _abandon(self) -> None:
        """Close the file without committing: the log keeps its last commit. The
        journal goes unless it holds that commit (the log is then behind it)."""
        self.pending = []
        self._appender.close()  # its complete records are rounds run.h5 may not hold: kept
        if self._log is not None:
            try:
                self._log.f.close()
            except Exception:  # noqa: BLE001, S110 - what HDF5 says now changes nothing on disk
                pass
            self._log = None
        if self._file is not None:
            self._file.close()
            self._file = None
        # the writer's empty mark too (made when the log was created): a refusal in
        # run.h5.rounds, before the log was opened again, left it behind for readers
        if read_journal(journal_path(self.path)) is None:
            journal_path(self.path).unlink(missing_ok=True)

    def _open(self) -> _Log:
        if self._log is None:
            self._file = Journaled(self.path, "r+")
            self._log = _Log(h5py.File(self._file, "r+"))
            sums.unseal(self._log.f)  # the datasets are about to change: the next commit drops their sums
        return self._log

    def _commit(self) -> None:
        """Flush HDF5's caches and commit the file: it now holds the rounds written."""
        assert self._log is not None and self._file is not None
        self._log.f.flush()
        self._file.commit()

    def flush(self) -> None:
        if not self.pending:
            return
        if self._failed:
            raise StorageError(f"the log {str(self.path)!r} was closed after a refused write")
        with self._storage():
            self._flush()

    def _flush(self) -> None:
        recs, self.pending = self.pending, []
        log = self._open()
        if self._rows is None:
            self._rows = _rows(log.f)
        self._rows = _append_rounds(log, recs, self.compact, self._rows)
        self._commit()
        self._appender.clear()  # after the commit: a kill between leaves rounds in both, read once
        self._kept = self._rows
        self._last = time.monotonic()

    def truncate(self, n: int) -> None:
        """Drop every logged round >= n (rows are rounds ``/rounds/round``, which
        skip rounds under ``log.every``)."""
        with self._storage():
            self._truncate(n)

    def _truncate(self, n: int) -> None:
        f = self._open().f
        logged = f[ROUND_KEY][()] if ROUND_KEY in f else np.empty(0, np.int64)
        cut = n
        n = int(np.searchsorted(logged, cut))  # rows of rounds < cut
        coo_end = None
        if "graph/mixing_coo/end" in f and n > 0:
            coo_end = int(f["graph/mixing_coo/end"][n - 1])
        elif "graph/mixing_coo/end" in f:
            coo_end = 0
        per_round, once = [], []

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                if obj.attrs.get("per_round", False):
                    per_round.append(name)
                elif "round" in obj.attrs and int(obj.attrs["round"]) >= cut:
                    once.append(name)

        f.visititems(visit)
        for name in per_round:
            if f[name].shape[0] > n:
                f[name].resize(n, axis=0)
        for name in once:
            del f[name]
        if coo_end is not None:
            for k in ("row", "col", "val"):
                f[f"graph/mixing_coo/{k}"].resize(coo_end, axis=0)
        self._commit()
        self._kept = n
        self._log = _Log(f)  # sizes changed under the cached handles
        self._rows = None

    def set_attrs(self, **attrs: Any) -> None:
        with self._storage():
            f = self._open().f
            for k, v in attrs.items():
                f.attrs[k] = json.dumps(v) if isinstance(v, (dict, list)) else v
            self._commit()


@dataclass(frozen=True)
class DatasetInfo:
    """What a log holds at a path, without reading it."""

    path: str
    shape: tuple[int, ...]  # per-round datasets: cut to the complete rounds
    dtype: np.dtype
    per_round: bool  # axis 0 is the round
    round: int | None  # datasets logged once: the round they were written


class Run:
    """Read access to a run log, complete or still being written.

    While a writer has the log open, each read holds it at its last commit (the
    writer's next commit waits for the read: :func:`.journal.still`), so a reader
    sees whole rounds, those flushed to run.h5 and those waiting in run.h5.rounds.
    """

    open_tries = 10

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.is_dir():
            self.path = self.path / "run.h5"
        if not self.path.is_file():
            raise FileNotFoundError(f"no run log at {self.path}")
        self._held = None  # the file kept open by reading()
        self._held_info: dict[str, DatasetInfo] | None = None
        self._held_attrs: dict[str, Any] | None = None
        self._config: tuple[str, dict] | None = None
        self._merged: tuple[tuple, bytes] | None = None  # run.h5 with its pending rounds, and what it was made of
        self._summed: dict[str, tuple] = {}  # datasets whose CRC-32 matched, with the file's state then

    @contextmanager
    def reading(self):
        """Keep the log open, and its list of datasets, across the calls made
        inside: many small reads of one log (a summary) open it once. The rounds
        seen are those complete when it was opened; a live writer's next commit
        waits until the block ends."""
        if self._held is not None:
            yield self
            return
        with self._file() as f:
            self._held = f
            try:
                self.datasets  # noqa: B018 - listed once, for every call inside
                yield self
            finally:
                self._held, self._held_info, self._held_attrs = None, None, None

    @contextmanager
    def _file(self):
        """The log open for reading, held at its last commit while open
        (:func:`.journal.still`: a live writer's next commit waits for the reader),
        with the rounds waiting in ``run.h5.rounds`` (:mod:`.pending`) added."""
        if self._held is not None:
            yield self._held
            return
        with still(self.path) as image:
            for i in range(self.open_tries):
                try:
                    f = h5py.File(self.path if image is None else io.BytesIO(image), "r", locking=False)
                    break
                except OSError:
                    if i == self.open_tries - 1:
                        raise
                    time.sleep(0.2)
            try:
                merged = self._with_pending(f, image)
                if merged is not None:
                    f.close()
                    f = h5py.File(io.BytesIO(merged), "r")
                yield f
            finally:
                f.close()

    def _with_pending(self, f: h5py.File, image: bytes | None) -> bytes | None:
        """The log's bytes (``image`` when read from a copy) with the rounds of
        ``run.h5.rounds`` past its last one added (made once per state of the two
        files), or None when there are none."""
        side = pending_rounds.rounds_path(self.path)
        try:
            st, ss = self.path.stat(), side.stat()
        except FileNotFoundError:
            return None
        if ss.st_size == 0:
            return None
        key = (st.st_size, st.st_mtime_ns, ss.st_size, ss.st_mtime_ns, image is not None)
        if self._merged is not None and self._merged[0] == key:
            return self._merged[1]
        try:
            recs = pending_rounds.read(side)
        except pending_rounds.Damaged as e:
            raise Corrupt(str(e)) from None
        if not recs or recs[-1]["t"] <= _last_round(f):
            return None
        buf = io.BytesIO(self.path.read_bytes() if image is None else image)
        try:
            with h5py.File(buf, "r+") as mf:
                last = _last_round(mf)  # of these bytes: a flush since f was opened may hold more rounds
                recs = [r for r in recs if r["t"] > last]
                if not recs:
                    return None
                _append_rounds(_Log(mf), recs, _compact(mf), _rows(mf))
                sums.unseal(mf)  # rounds added: the sums, if any, are not of these datasets
        except OSError:  # the bytes caught a writer inside a commit: the log as opened, pending rounds next time
            return None
        self._merged = (key, buf.getvalue())
        return self._merged[1]

    def _kept(self, name: str, out: dict) -> dict:
        """``out``, and a copy kept as ``name`` for the next call while the file is held open."""
        if self._held is not None:
            setattr(self, name, dict(out))
        return out

    @property
    def attrs(self) -> dict[str, Any]:
        if self._held_attrs is not None:
            return dict(self._held_attrs)
        with self._file() as f:
            out = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        return self._kept("_held_attrs", out)

    @property
    def config(self) -> dict:
        """The run's config as stored in the log, read as any config file is
        (``mpifl.yamlio``: a hostile log cannot make the reader expand a bomb)."""
        return copy.deepcopy(self._stored_config())

    def _stored_config(self) -> Any:
        """The parsed config, shared between calls: parsed once per text."""
        from mpifl.yamlio import parse_yaml

        text = self.attrs["config_yaml"]
        if self._config is None or self._config[0] != text:
            self._config = (text, parse_yaml(text, f"the config stored in {str(self.path)!r}"))
        return self._config[1]

    @property
    def n_rounds(self) -> int:
        """Complete rounds in the log (the length of ``/rounds/round``)."""
        if self._held_info is not None:
            return self._held_info[ROUND_KEY].shape[0] if ROUND_KEY in self._held_info else 0
        with self._file() as f:
            return f[ROUND_KEY].shape[0] if ROUND_KEY in f else 0

    @property
    def planned_rounds(self) -> int | None:
        """run.rounds of the config, when the log holds one."""
        try:
            return int(self._stored_config()["run"]["rounds"])
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def rounds_done(self) -> int:
        """Rounds the run has finished: its last logged round + 1 (the last round is
        always logged; ``log.every`` > 1 logs fewer rows than rounds); 0 when none.
        One open, so one snapshot: a count from one open indexed into the next read
        a live run's log between a flush of its rounds and the next, and a sweep
        driver probing another driver's point died of an IndexError (tests/logging/test_log.py)."""
        with self._file() as f:
            rounds = f[ROUND_KEY] if ROUND_KEY in f else None
            return int(rounds[-1]) + 1 if rounds is not None and rounds.shape[0] else 0

    @property
    def complete(self) -> bool:
        """Every round of the stored config (the latest: an extended run's stored
        config records its new ``run.rounds``) is done."""
        planned = self.planned_rounds
        return planned is not None and self.rounds_done >= planned

    @property
    def datasets(self) -> dict[str, DatasetInfo]:
        """Every dataset of the log by path (``"metrics/test_acc"``), with shapes cut
        to the complete rounds; nothing is read but the file's metadata."""
        if self._held_info is not None:
            return dict(self._held_info)
        out: dict[str, DatasetInfo] = {}
        with self._file() as f:
            n = f[ROUND_KEY].shape[0] if ROUND_KEY in f else 0

            def visit(name: str, obj) -> None:
                if not isinstance(obj, h5py.Dataset):
                    return
                per_round = bool(obj.attrs.get("per_round", False))
                shape = (min(obj.shape[0], n), *obj.shape[1:]) if per_round else tuple(obj.shape)
                rnd = obj.attrs.get("round")
                out[name] = DatasetInfo(name, shape, obj.dtype, per_round, None if rnd is None else int(rnd))

            f.visititems(visit)
        return self._kept("_held_info", out)

    @property
    def matrices(self) -> dict[str, DatasetInfo]:
        """The [N, N, ...] datasets (per round or once), ``graph/mixing`` whatever its storage."""
        n = self.attrs.get("n_clients")
        info = self.datasets
        if n is None and "clients/cluster" in info:
            n = info["clients/cluster"].shape[0]
        out = {}
        for k, d in info.items():
            tail = d.shape[1:] if d.per_round else d.shape
            if k.startswith(("graph/mixing", "clients/")):  # clients/label_hist is [N, classes]
                continue
            if len(tail) >= 2 and tail[0] == n and tail[1] == n:
                out[k] = d
        if "graph/mixing" in info or "graph/mixing_kind" in info:
            src = info.get("graph/mixing") or info["graph/mixing_kind"]
            out["graph/mixing"] = DatasetInfo("graph/mixing", (src.shape[0], n, n), np.dtype(np.float32), True, None)
        return out

    def row(self, path: str, t: int) -> np.ndarray:
        """Round ``t`` of a per-round dataset (negative: from the last complete round);
        ``graph/mixing`` in either storage."""
        n = self.n_rounds
        if not -n <= t < n:
            raise IndexError(f"row {t} of {path}: the log holds {n} complete round(s)")
        t = t % n
        if path == "graph/mixing":
            return self.mixing(t)
        with self._file() as f, _checked(path):
            self._intact(f, [path])
            return f[path][t]

    def _intact(self, f: h5py.File, paths: list[str]) -> None:
        """Datasets ``paths`` match their stored CRC-32 (:mod:`.sums`), or
        :class:`Corrupt`; each is summed once per state of the file."""
        try:
            st = self.path.stat()
            state: tuple | None = (st.st_size, st.st_mtime_ns)
        except OSError:
            state = None
        if state is None or self._summed.get("/") != state:
            if not sums.names_intact(f):
                raise Corrupt(f"the list of datasets of {str(self.path)!r} fails its CRC-32: the file changed after "
                              f"it was written (a bit flip or a damaged disk or copy)")
            self._summed["/"] = state
        for p in paths:
            if state is not None and self._summed.get(p) == state:
                continue
            with _checked(p):
                ok = sums.intact(f[p])
            if not ok:
                raise Corrupt(f"/{p} fails its CRC-32: the file changed after it was written "
                              f"(a bit flip or a damaged disk or copy)")
            self._summed[p] = state

    def keys(self) -> list[str]:
        out: list[str] = []
        with self._file() as f:
            self._intact(f, [])
            f.visititems(lambda name, obj: out.append(name) if isinstance(obj, h5py.Dataset) else None)
        return out

    def get(self, path: str) -> np.ndarray:
        """A dataset; per-round datasets are cut to the complete rounds."""
        with self._file() as f, _checked(path):
            self._intact(f, [path])
            ds = f[path]
            if not ds.attrs.get("per_round", False):
                return ds[()]
            n = f[ROUND_KEY].shape[0] if ROUND_KEY in f else 0
            return ds[:n]

    def metric(self, name: str) -> np.ndarray:
        """``/metrics/<name>`` as ``[logged rounds, clients]``: ``train_loss``,
        ``val_loss``, ``val_acc``, ``test_loss``, ``test_acc`` (accuracies as fractions
        in [0, 1]), ``skipped``; nan where a round was not evaluated
        (``run.eval_every``). Row i is round ``rounds[i]`` (0-based)."""
        return self.get(f"metrics/{name}")

    @property
    def rounds(self) -> np.ndarray:
        """The round number of each logged row (``log.every`` may skip rounds)."""
        return self.get(ROUND_KEY)

    def mixing(self, t: int) -> np.ndarray:
        """The dense [N, N] mixing matrix of logged row ``t`` (round ``rounds[t]``)."""
        return self.mixing_of(t).densify()

    def mixing_of(self, t: int) -> Mixing:
        """The mixing matrix of logged row ``t`` in the form it was stored."""
        with self._file() as f, _checked("graph/mixing"):
            g = f["graph"]
            self._intact(f, [f"graph/{k}" for k in g if isinstance(g[k], h5py.Dataset)]
                         + [f"graph/mixing_coo/{k}" for k in g.get("mixing_coo", {})])
            if g.attrs.get("mixing_format", "dense") == "dense":
                return Dense(g["mixing"][t])
            end = g[COO_END]
            lo, hi = (int(end[t - 1]) if t > 0 else 0), int(end[t])

            def read(name: str) -> np.ndarray:
                return g[name][lo:hi] if name.startswith("mixing_coo/") else g[name][t]

            return Mixing.decode(read, f["clients/cluster"].shape[0])


def open_run(path: str | Path) -> Run:
    return Run(path)
