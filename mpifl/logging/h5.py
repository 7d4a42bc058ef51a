"""The run log: one HDF5 file written by rank 0, one row per round.

Layout (rows are rounds, columns clients)::

    attrs: mpifl_version, algorithm, seed, n_clients, n_ranks, config_yaml,
           versions, hostname, started_at
    /clients/{cluster, rank, n_train, n_val, n_test, label_hist}
    /rounds/{round, wall_s, comm_s, compute_s}
    /metrics/{train_loss, val_loss, val_acc, test_loss, test_acc}   [R, N]
    /comm/{bytes_sent, bytes_recv, models_recv}                     [R, N]
    /graph/mixing                                                   [R, N, N]
    /<algorithm>/<extra>                                            [R, N, ...]

The writer opens, appends and closes the file every round, so between rounds the
file is complete and any reader (h5py, h5dump, ``open_run``) can open it while
the run goes on. ``/rounds/round`` is written last: its length is the number of
complete rounds, and readers ignore rows past it.

Above ``dense_max`` clients an N x N matrix per round stops fitting; the mixing
matrix is then stored compactly (``/graph`` attr ``mixing_format = compact``):
rounds where all rows are equal keep one row (``mixing_shared``), other rounds
keep their non-zeros (``mixing_coo/{row,col,val}`` with ``offsets``).
``Run.mixing(t)`` hides which.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

ROUND_KEY = "rounds/round"


def _append(f: h5py.File, path: str, row: np.ndarray, at: int) -> None:
    """Write ``row`` as row ``at`` of the extensible dataset ``path``."""
    row = np.asarray(row)
    if path not in f:
        chunk = (1, *row.shape) if row.ndim else (256,)
        f.create_dataset(path, shape=(0, *row.shape), maxshape=(None, *row.shape), dtype=row.dtype,
                         chunks=chunk, compression="gzip" if row.size > 64 else None,
                         compression_opts=1 if row.size > 64 else None)
        f[path].attrs["per_round"] = True
    ds = f[path]
    if ds.shape[0] < at + 1:
        ds.resize(at + 1, axis=0)
    ds[at] = row


def _append_flat(f: h5py.File, path: str, values: np.ndarray) -> int:
    """Extend a 1-D dataset by ``values``; returns its new length."""
    values = np.asarray(values).ravel()
    if path not in f:
        f.create_dataset(path, shape=(0,), maxshape=(None,), dtype=values.dtype, chunks=(65536,),
                         compression="gzip", compression_opts=1)
    ds = f[path]
    n = ds.shape[0]
    ds.resize(n + len(values), axis=0)
    ds[n:] = values
    return n + len(values)


class Writer:
    """Rank 0's handle on ``run.h5``; every call opens, writes and closes."""

    def __init__(self, path: Path, attrs: dict[str, Any], clients: dict[str, np.ndarray],
                 n_clients: int, dense_max: int = 1024):
        self.path = Path(path)
        self.n = n_clients
        self.compact = n_clients > dense_max
        with h5py.File(self.path, "w", locking=False) as f:
            for k, v in attrs.items():
                f.attrs[k] = json.dumps(v) if isinstance(v, (dict, list)) else v
            for k, v in clients.items():
                f.create_dataset(f"clients/{k}", data=np.asarray(v))
            g = f.create_group("graph")
            g.attrs["mixing_format"] = "compact" if self.compact else "dense"

    def write_round(self, t: int, rounds: dict[str, float], rows: dict[str, np.ndarray],
                    mixing: np.ndarray | None = None, mixing_row: np.ndarray | None = None,
                    once: dict[str, np.ndarray] | None = None, attrs: dict[str, Any] | None = None) -> None:
        """``rows``: ``{"metrics/val_acc": [N], "federico/client_weights": [N, N], ...}``;
        ``once``: datasets written whole, with attr ``round`` = t (e.g. LIA's influence)."""
        with h5py.File(self.path, "a", locking=False) as f:
            for k, v in rows.items():
                _append(f, k, v, t)
            for k, v in (once or {}).items():
                if k in f:
                    del f[k]
                f.create_dataset(k, data=v, compression="gzip" if np.size(v) > 64 else None)
                f[k].attrs["round"] = t
            for k, v in (attrs or {}).items():
                f.attrs[k] = json.dumps(v) if isinstance(v, (dict, list)) else v
            self._mixing(f, t, mixing, mixing_row)
            for k, v in rounds.items():
                _append(f, f"rounds/{k}", np.float64(v), t)
            _append(f, ROUND_KEY, np.int64(t), t)  # last: marks the round complete
            f.flush()

    def _mixing(self, f: h5py.File, t: int, mixing, mixing_row) -> None:
        if mixing is None and mixing_row is None:
            return
        if not self.compact:
            m = mixing if mixing is not None else np.broadcast_to(mixing_row, (self.n, self.n))
            _append(f, "graph/mixing", np.asarray(m, np.float32), t)
            return
        if mixing_row is not None:
            _append(f, "graph/mixing_kind", np.int8(1), t)
            _append(f, "graph/mixing_shared", np.asarray(mixing_row, np.float32), t)
            rows = cols = vals = np.empty(0)
        else:
            _append(f, "graph/mixing_kind", np.int8(0), t)
            _append(f, "graph/mixing_shared", np.zeros(self.n, np.float32), t)
            rows, cols = np.nonzero(mixing)
            vals = mixing[rows, cols]
        _append_flat(f, "graph/mixing_coo/row", rows.astype(np.int32))
        _append_flat(f, "graph/mixing_coo/col", cols.astype(np.int32))
        end = _append_flat(f, "graph/mixing_coo/val", vals.astype(np.float32))
        _append(f, "graph/mixing_coo/end", np.int64(end), t)

    def set_attrs(self, **attrs: Any) -> None:
        with h5py.File(self.path, "a", locking=False) as f:
            for k, v in attrs.items():
                f.attrs[k] = json.dumps(v) if isinstance(v, (dict, list)) else v


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

    The writer opens and closes the file every round, so a reader normally finds
    it closed; opening is retried for a moment when it catches the writer inside
    a round.
    """

    open_tries = 10

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.is_dir():
            self.path = self.path / "run.h5"
        if not self.path.is_file():
            raise FileNotFoundError(f"no run log at {self.path}")

    def _file(self) -> h5py.File:
        for i in range(self.open_tries):
            try:
                return h5py.File(self.path, "r", locking=False)
            except OSError:
                if i == self.open_tries - 1:
                    raise
                time.sleep(0.2)
        raise AssertionError("unreachable")

    @property
    def attrs(self) -> dict[str, Any]:
        with self._file() as f:
            return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}

    @property
    def config(self) -> dict:
        import yaml

        return yaml.safe_load(self.attrs["config_yaml"])

    @property
    def n_rounds(self) -> int:
        with self._file() as f:
            return f[ROUND_KEY].shape[0] if ROUND_KEY in f else 0

    @property
    def planned_rounds(self) -> int | None:
        """run.rounds of the config, when the log holds one."""
        try:
            return int(self.config["run"]["rounds"])
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def complete(self) -> bool:
        planned = self.planned_rounds
        return planned is not None and self.n_rounds >= planned

    def datasets(self) -> dict[str, DatasetInfo]:
        """Every dataset of the log by path, with shapes cut to the complete rounds."""
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
        return out

    def matrices(self) -> dict[str, DatasetInfo]:
        """The [N, N, ...] datasets (per round or once), ``graph/mixing`` whatever its storage."""
        n = self.attrs.get("n_clients")
        info = self.datasets()
        if n is None and "clients/cluster" in info:
            n = info["clients/cluster"].shape[0]
        out = {}
        for k, d in info.items():
            tail = d.shape[1:] if d.per_round else d.shape
            if k.startswith("graph/mixing"):
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
            raise IndexError(f"round {t} of {path}: the log holds {n} complete round(s)")
        t = t % n
        if path == "graph/mixing":
            return self.mixing(t)
        with self._file() as f:
            return f[path][t]

    def keys(self) -> list[str]:
        out: list[str] = []
        with self._file() as f:
            f.visititems(lambda name, obj: out.append(name) if isinstance(obj, h5py.Dataset) else None)
        return out

    def get(self, path: str) -> np.ndarray:
        """A dataset; per-round datasets are cut to the complete rounds."""
        with self._file() as f:
            ds = f[path]
            if not ds.attrs.get("per_round", False):
                return ds[()]
            n = f[ROUND_KEY].shape[0] if ROUND_KEY in f else 0
            return ds[:n]

    def metric(self, name: str) -> np.ndarray:
        return self.get(f"metrics/{name}")

    def mixing(self, t: int) -> np.ndarray:
        with self._file() as f:
            g = f["graph"]
            if g.attrs.get("mixing_format", "dense") == "dense":
                return g["mixing"][t]
            n = f["clients/cluster"].shape[0]
            if g["mixing_kind"][t] == 1:
                return np.broadcast_to(g["mixing_shared"][t], (n, n)).copy()
            end = g["mixing_coo/end"]
            lo = int(end[t - 1]) if t > 0 else 0
            hi = int(end[t])
            m = np.zeros((n, n), np.float32)
            m[g["mixing_coo/row"][lo:hi], g["mixing_coo/col"][lo:hi]] = g["mixing_coo/val"][lo:hi]
            return m


def open_run(path: str | Path) -> Run:
    return Run(path)
