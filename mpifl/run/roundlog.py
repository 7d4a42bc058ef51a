"""Round-log assembly: rank 0's writer, opened for a fresh start (its run
directory checked first) or a resumed one, and each logged round's rows gathered
from every rank (per-client metrics, counters, the algorithm's extras, the mixing
matrix) into it; the TensorBoard events beside it."""

from __future__ import annotations

import datetime as dt
import socket
from typing import TYPE_CHECKING

import numpy as np

from mpifl import __version__
from mpifl.algorithms.base import Context, Round
from mpifl.comm import Comm, versions
from mpifl.config import Config
from mpifl.errors import UNWRITABLE, ConfigError, storage_error
from mpifl.logging.h5 import Writer, open_run
from mpifl.logging.mixing import Dense, Mixing, issparse
from mpifl.paths import RunDir, atomic_write_text
from mpifl.run import checkpoint, provenance
from mpifl.yamlio import read_yaml

if TYPE_CHECKING:
    from mpifl.logging.tensorboard import Events


def open_writer(cfg: Config, ctx: Context, threads: int, nodes: np.ndarray, keep_rounds: int | None,
                origin: dict | None) -> Writer | None:
    """Rank 0's writer; ``origin``: this start's provenance (:mod:`mpifl.run.provenance`, rank 0's)."""
    if not ctx.comm.is_writer:
        return None
    rd = RunDir(cfg.run_dir)
    text = cfg.to_yaml()  # the run directory exists: the run lock made it (run)
    try:
        if keep_rounds is None:
            check_fresh(cfg, rd)
            checkpoint.forget(rd)  # a fresh start forgets the earlier run's checkpoints
        atomic_write_text(rd.config, text)  # the first write into an existing run directory
    except OSError as e:
        if e.errno not in UNWRITABLE:
            raise storage_error("the config", rd.config, e, "nothing was logged yet") from None
        raise unwritable(cfg, rd, e) from None
    # the log's own provenance before this start (read before the writer cuts the log to the checkpoint)
    earlier = provenance.read(open_run(rd.log).attrs) if keep_rounds is not None and rd.log.is_file() else {}
    d = ctx.data
    attrs = {
        "mpifl_version": __version__, "algorithm": cfg.algorithm.name, "seed": cfg.run.seed,
        "n_clients": d.n_clients, "n_ranks": ctx.comm.size, "n_nodes": int(nodes.max()) + 1,
        "config_yaml": text,
        "versions": versions(), "hostname": socket.gethostname(),
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "threads_per_rank": threads, "device": str(ctx.clients.device), "n_params": ctx.clients.P,
        "train_path": "batched" if ctx.clients.batched else "per_client", "provenance": origin,
    }
    if ctx.clients.trained_conv_kernel is not None:  # torch's or mpifl.train.fused's layers
        attrs["conv_kernel"] = ctx.clients.trained_conv_kernel
    if ctx.clients.conv_times is not None:  # train.fused_conv=auto's timing: fused, torch (s, summed over ranks)
        attrs["conv_kernel_times"] = list(ctx.clients.conv_times)
    if ctx.clients.path_times is not None:  # train.batched=auto's timing (s, summed over ranks)
        attrs["train_path_times"] = list(ctx.clients.path_times)
    rank = ctx.comm.placement.owner(np.arange(d.n_clients))
    clients = {
        "cluster": d.cluster, "rank": rank, "node": nodes[rank],
        "n_train": d.sizes[:, 0], "n_val": d.sizes[:, 1], "n_test": d.sizes[:, 2], "label_hist": d.label_hist,
    }
    writer = Writer(rd.log, attrs, clients, d.n_clients, dense_max=cfg.log.dense_max, flush_s=cfg.log.flush_s,
                    keep_rounds=keep_rounds)
    if keep_rounds is not None:  # the stored config is the latest: an extension's run.rounds, a moved run's place
        writer.set_attrs(config_yaml=text, provenance=provenance.resumed(earlier, origin))
    return writer


def unwritable(cfg: Config, rd: RunDir, e: OSError) -> ConfigError:
    return ConfigError(f"run.out_dir={cfg.run.out_dir!r} is not allowed: the run directory {str(rd.root)!r} "
                       f"cannot be written ({e.strerror}); pick a run.out_dir you can write (a copy of the run "
                       f"directory there continues the run)")


def check_fresh(cfg: Config, rd: RunDir) -> None:
    """A fresh start may replace the files of an earlier start of this config (its
    config.yaml, run.h5 and checkpoints) and nothing else: a directory holding
    anything without an mpifl config.yaml, or another config's run, is refused."""
    if not rd.root.is_dir() or not any(p != rd.lock for p in rd.root.iterdir()):
        return
    where = str(rd.root)
    if not rd.config.is_file():
        raise ConfigError(f"run directory {where!r} is not empty and holds no mpifl run; "
                          f"use another run.name (or run.out_dir)")
    try:
        old = read_yaml(rd.config, f"config file {str(rd.config)!r}")
    except ConfigError:
        old = None
    if not isinstance(old, dict):
        raise ConfigError(f"run directory {where!r} holds a config.yaml mpifl cannot read; use another run.name")
    diff = checkpoint.config_diff(old, cfg.to_dict())
    if diff:
        raise ConfigError(f"run directory {where!r} holds a run with a different config: {diff}; "
                          f"use another run.name (or run.out_dir), or remove that directory to start over in it")


def log_round(writer: Writer | None, ctx: Context, t: int, out: Round, metrics: dict[str, np.ndarray],
               times: dict[str, float]) -> dict[str, np.ndarray] | None:
    comm = ctx.comm
    rows = {"metrics/train_loss": out.train_loss}
    rows.update({f"metrics/{k}": v for k, v in metrics.items()})
    rows.update({"comm/bytes_sent": comm.bytes_sent, "comm/bytes_recv": comm.bytes_recv,
                 "comm/models_recv": comm.models_recv, "metrics/skipped": ctx.clients.skipped,
                 "train/steps": ctx.clients.steps, "train/samples": ctx.clients.samples})
    group = ctx.cfg.algorithm.name
    path = (lambda k: k if "/" in k else f"{group}/{k}")
    rows.update({path(k): v for k, v in out.extras.items()})
    gathered = _gather_grouped(comm, rows)
    once = {path(k): comm.gather_rows(np.asarray(v)) for k, v in out.once.items()}
    mixing = _gather_mixing(ctx, out.mixing)
    if writer is not None:
        writer.write_round(t, times, gathered, mixing=mixing, once=once, attrs=out.attrs)
        return gathered
    return None


def _gather_grouped(comm: Comm, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray | None]:
    """``gather_rows`` of each entry, with one Gatherv per (dtype, row shape) rather
    than per entry: the dozen per-client metrics and counters of a round travel
    in two messages, which matters when rounds take milliseconds."""
    groups: dict[tuple, list[str]] = {}
    arrays = {k: np.asarray(v) for k, v in rows.items()}
    for k, v in arrays.items():
        groups.setdefault((v.dtype.str, v.shape[1:]), []).append(k)
    out: dict[str, np.ndarray | None] = {}
    for keys in groups.values():
        stacked = comm.gather_rows(np.stack([arrays[k] for k in keys], axis=1))  # [n_local, k, ...]
        for i, k in enumerate(keys):
            out[k] = None if stacked is None else stacked[:, i]
    return out


def _gather_mixing(ctx: Context, m: Mixing | None) -> Mixing | None:
    """Rank 0 gets the whole [N, N] mixing matrix. Shared and grouped forms are the
    same on every rank already; dense rows are stacked at small N, else only the
    non-zeros of every rank's rows travel (sparse, or dense rows made sparse here),
    so no dense N x N array is built at large N."""
    if not isinstance(m, Dense):
        return m
    comm, N = ctx.comm, ctx.N
    if not issparse(m.rows) and N <= ctx.cfg.log.dense_max:
        rows = comm.gather_rows(np.asarray(m.rows, np.float32))
        return None if rows is None else Dense(rows)
    from scipy import sparse

    coo = sparse.coo_matrix(m.rows)
    rows = comm.gather_concat((coo.row + comm.first).astype(np.int64))
    cols = comm.gather_concat(coo.col.astype(np.int64))
    vals = comm.gather_concat(coo.data.astype(np.float32))
    if rows is None:
        return None
    return Dense(sparse.coo_matrix((vals, (rows, cols)), shape=(N, N)))


def events(cfg: Config, writer: Writer | None) -> Events | None:
    """The TensorBoard events of a run that asks for them (``log.tensorboard``), on the log's writer."""
    if not cfg.log.tensorboard or writer is None:
        return None
    from mpifl.logging.tensorboard import Events

    return Events(RunDir(cfg.run_dir).tb)
