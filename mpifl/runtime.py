"""One run: config -> placement, device, data, clients -> rounds -> HDF5 log."""

from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mpifl import __version__, algorithms, models
from mpifl.algorithms.base import Algorithm, Context, Round, evaluates
from mpifl.algorithms.mixing import Dense, Mixing, issparse
from mpifl.comm import Comm, agree, node_local_rank, node_of_ranks, pick_device, set_threads, versions
from mpifl.config import Config
from mpifl.data import build as build_data
from mpifl.errors import RERUN, UNWRITABLE, ConfigError, StorageError, shorten, storage_error
from mpifl.logging.h5 import Writer, open_run
from mpifl.paths import RunDir, atomic_write_text
from mpifl.run import checkpoint, provenance
from mpifl.run import lock as runlock
from mpifl.run import memory as sizes
from mpifl.train import Clients
from mpifl.yamlio import read_yaml

if TYPE_CHECKING:
    from mpifl.logging.tensorboard import Events

METRICS = ("val_loss", "val_acc", "test_loss", "test_acc")
PREEMPTED = 75  # exit status after a signal-triggered checkpoint (EX_TEMPFAIL): requeue me
LOG_FAILED = 1 << 10  # above any signal number: rank 0's log write was refused (agreed with the stop flag)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preempted(Exception):
    """A stop signal arrived; a checkpoint of the last complete round was written."""


@dataclass
class Setup:
    ctx: Context
    algo: Algorithm
    threads: int
    nodes: np.ndarray  # [R] node index of every rank (comm.node_of_ranks)


def fits(cfg: Config, mpi_comm) -> None:
    """Refuse ``run.threads`` past this process's CPUs and a run whose memory
    estimate exceeds what the rank has (:mod:`mpifl.run.memory`), before anything is
    allocated. The collectives come first, so a rank that refuses keeps none waiting."""
    local, per_node = node_local_rank(mpi_comm)
    device = pick_device(cfg.run.device, mpi_comm)
    sizes.check_threads(cfg.run.threads)
    _, problem = sizes.assess(cfg, mpi_comm.Get_size(), mpi_comm.Get_rank(), device, local, per_node)
    if problem:
        raise ConfigError(problem)


def setup(cfg: Config, mpi_comm) -> Setup:
    """Everything before round 0; user errors surface on every rank together."""
    agree(mpi_comm, lambda: fits(cfg, mpi_comm))

    def build() -> Setup:
        comm = Comm(cfg.data.n_clients, mpi_comm)
        nodes = node_of_ranks(mpi_comm)
        threads = set_threads(mpi_comm, cfg.run.threads)
        device = pick_device(cfg.run.device, mpi_comm)
        data = build_data(cfg.data, cfg.run.seed, comm.local_ids)
        model = models.build(cfg.model, data.in_shape, data.n_classes, cfg.run.seed)
        clients = Clients(model, data, cfg.train, device, cfg.run.seed)
        if clients.needs_measuring:  # train.batched=auto: the faster path, timed on every rank
            tb, tl = clients.measure_paths()
            clients.path_times = comm.allreduce_sum(tb), comm.allreduce_sum(tl)
            clients.batched = clients.path_times[0] < clients.path_times[1]
        ctx = Context(cfg, comm, clients, data)
        return Setup(ctx, algorithms.get(cfg.algorithm.name), threads, nodes)

    return agree(mpi_comm, build)


def find_checkpoint(cfg: Config) -> Path | None:
    """The checkpoint to resume from, per ``run.resume``; refuses another
    experiment's (:mod:`mpifl.config.identity`: the directory may have moved, and a
    larger ``run.rounds`` extends the run), a ``run.rounds`` below the rounds done,
    and a damaged checkpoint (never a silent start over)."""
    rd = RunDir(cfg.run_dir)
    checkpoint.check_dir(rd)
    ck = (checkpoint.latest(rd) or checkpoint.unpublished(rd)) if cfg.run.resume != "never" else None
    if cfg.run.resume == "previous":
        before = checkpoint.previous(ck) if ck is not None else None
        if before is None:
            raise ConfigError(f"run.resume='previous' is not allowed here: {str(rd.checkpoint)!r} keeps no checkpoint "
                              f"before " + (f"{ck.name}" if ck else "the latest (it holds none)")
                              + "; use run.resume=auto, or run.resume=never to start over")
        ck = before
    if cfg.run.resume == "require" and ck is None:
        raise ConfigError(f"run.resume='require' is not allowed here: no checkpoint in {str(rd.checkpoint)!r}")
    if ck is not None:
        meta = checkpoint.read_meta(ck)
        checkpoint.check_config(meta, cfg.to_dict(), rd.root)
        done = int(meta["round"]) + 1
        if cfg.run.rounds < done:
            raise ConfigError(f"run.rounds={cfg.run.rounds} is fewer than the {done} rounds the run in "
                              f"{str(rd.root)!r} has done; give run.rounds>={done} to continue it (={done}: "
                              f"nothing to do), or run.resume=never to start it over")
    return ck


def finished_without_checkpoint(cfg: Config) -> int | None:
    """The rounds of a finished run that kept no checkpoint (``run.keep_final_checkpoint:
    false``), when this config is that run again (``run.resume=auto``): it has
    nothing to do. A larger ``run.rounds`` cannot extend it (one line). None in
    every other case (a checkpoint, a partial log, another experiment)."""
    rd = RunDir(cfg.run_dir)
    if cfg.run.resume != "auto" or checkpoint.latest(rd) or checkpoint.unpublished(rd) or not rd.log.is_file():
        return None
    try:
        run = open_run(rd.log)
        run.open_tries = 1
        done, stored = run.rounds_done, run.config
        planned, kept = int(stored["run"]["rounds"]), stored["run"].get("keep_final_checkpoint", True)
    except Exception:  # noqa: BLE001 - an unreadable log is the fresh start's or the resume's to judge
        return None
    if kept or done < planned or checkpoint.config_diff(stored, cfg.to_dict()):
        return None
    if cfg.run.rounds > done:
        raise ConfigError(f"run.rounds={cfg.run.rounds} cannot extend the run in {str(rd.root)!r}: it finished its "
                          f"{done} rounds and kept no checkpoint (run.keep_final_checkpoint=false); start it over "
                          f"with run.resume=never")
    return done


def check_log(cfg: Config, ck: Path) -> None:
    """Resuming from ``ck`` needs the log of the rounds before it: refuse (before
    anything is written) a log that is missing, unreadable or short of them."""
    rd = RunDir(cfg.run_dir)
    t = int(ck.name.removeprefix("round-"))
    if not rd.log.is_file():
        why = "is missing"
    else:
        try:
            run = open_run(rd.log)
            run.open_tries = 1  # this job holds the run directory: no writer to wait for
            logged = set(run.rounds.tolist())
        except Exception as e:  # noqa: BLE001 - whatever h5py says about a damaged file
            why = f"is unreadable ({type(e).__name__}: {shorten(str(e), 80)})"
        else:
            every = cfg.log.every
            lost = [r for r in range(every - 1, t + 1, every) if r not in logged]
            why = f"lacks round {lost[0] + 1}" if lost else ""
    if why:
        raise ConfigError(f"run directory {str(rd.root)!r} has a checkpoint after round {t + 1} but its log "
                          f"{str(rd.log)!r} {why}: the logged rounds cannot be rebuilt from a checkpoint; put the "
                          f"log back from a copy, or start over with run.resume=never (replaces the checkpoints)")


def _writer(cfg: Config, s: Setup, keep_rounds: int | None, origin: dict | None) -> Writer | None:
    """Rank 0's writer; ``origin``: this start's provenance (:mod:`mpifl.run.provenance`, rank 0's)."""
    ctx = s.ctx
    if not ctx.comm.is_writer:
        return None
    rd = RunDir(cfg.run_dir)
    text = cfg.to_yaml()  # the run directory exists: the run lock made it (run)
    try:
        if keep_rounds is None:
            _check_fresh(cfg, rd)
            checkpoint.forget(rd)  # a fresh start forgets the earlier run's checkpoints
        atomic_write_text(rd.config, text)  # the first write into an existing run directory
    except OSError as e:
        if e.errno not in UNWRITABLE:
            raise storage_error("the config", rd.config, e, "nothing was logged yet") from None
        raise _unwritable(cfg, rd, e) from None
    # the log's own provenance before this start (read before the writer cuts the log to the checkpoint)
    earlier = provenance.read(open_run(rd.log).attrs) if keep_rounds is not None and rd.log.is_file() else {}
    d = ctx.data
    attrs = {
        "mpifl_version": __version__, "algorithm": cfg.algorithm.name, "seed": cfg.run.seed,
        "n_clients": d.n_clients, "n_ranks": ctx.comm.size, "n_nodes": int(s.nodes.max()) + 1,
        "config_yaml": text,
        "versions": versions(), "hostname": socket.gethostname(),
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "threads_per_rank": s.threads, "device": str(ctx.clients.device), "n_params": ctx.clients.P,
        "train_path": "batched" if ctx.clients.batched else "per_client", "provenance": origin,
    }
    if ctx.clients.path_times is not None:  # train.batched=auto's timing (s, summed over ranks)
        attrs["train_path_times"] = list(ctx.clients.path_times)
    rank = ctx.comm.placement.owner(np.arange(d.n_clients))
    clients = {
        "cluster": d.cluster, "rank": rank, "node": s.nodes[rank],
        "n_train": d.sizes[:, 0], "n_val": d.sizes[:, 1], "n_test": d.sizes[:, 2], "label_hist": d.label_hist,
    }
    writer = Writer(rd.log, attrs, clients, d.n_clients, dense_max=cfg.log.dense_max, flush_s=cfg.log.flush_s,
                    keep_rounds=keep_rounds)
    if keep_rounds is not None:  # the stored config is the latest: an extension's run.rounds, a moved run's place
        writer.set_attrs(config_yaml=text, provenance=provenance.resumed(earlier, origin))
    return writer


def _unwritable(cfg: Config, rd: RunDir, e: OSError) -> ConfigError:
    return ConfigError(f"run.out_dir={cfg.run.out_dir!r} is not allowed: the run directory {str(rd.root)!r} "
                       f"cannot be written ({e.strerror}); pick a run.out_dir you can write (a copy of the run "
                       f"directory there continues the run)")


def _check_fresh(cfg: Config, rd: RunDir) -> None:
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


def _log_round(writer: Writer | None, ctx: Context, t: int, out: Round, metrics: dict[str, np.ndarray],
               times: dict[str, float]) -> dict[str, np.ndarray] | None:
    comm = ctx.comm
    rows = {"metrics/train_loss": out.train_loss}
    rows.update({f"metrics/{k}": v for k, v in metrics.items()})
    rows.update({"comm/bytes_sent": comm.bytes_sent, "comm/bytes_recv": comm.bytes_recv,
                 "comm/models_recv": comm.models_recv, "metrics/skipped": ctx.clients.skipped})
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


def last_evaluated(log: Path) -> tuple[int, float]:
    """(round, mean test_acc over clients) of the last evaluated round in a log;
    (-1, nan) when it holds none. Seeds the progress line of a resumed run."""
    run = open_run(log)
    acc = run.metric("test_acc")
    done = np.flatnonzero(~np.all(np.isnan(acc), axis=1)) if acc.size else []
    if len(done) == 0:
        return -1, float("nan")
    return int(run.rounds[done[-1]]), float(np.nanmean(acc[done[-1]]))


def _acc_text(acc: float, at: int, t: int) -> str:
    """This round's accuracy, or the last evaluated one marked with its round, so a
    value carried over (run.eval_every > 1) does not read as fresh."""
    if at < 0:
        return "  --  "
    return f"{acc:.4f}" if at == t else f"{acc:.4f} (round {at + 1})"


def _path_text(c: Clients) -> str:
    text = f"batched={c.batched}"
    if c.path_times is not None:
        text += f" (auto, timed: batched {1e3 * c.path_times[0]:.1f} ms, per client {1e3 * c.path_times[1]:.1f} ms"
        text += ")" if c.batched == (c.path_times[0] < c.path_times[1]) else "; the checkpoint's path kept)"
    return text


def run(cfg: Config, mpi_comm) -> Path:
    """One job: the run directory is locked first (one job per directory, before
    anything there changes) and released when the job ends, however it ends."""
    rd = RunDir(cfg.run_dir)

    def acquire() -> runlock.RunLock | None:
        if mpi_comm.Get_rank() != 0:
            return None
        try:
            lock = runlock.acquire(rd)
        except OSError as e:
            if e.errno not in UNWRITABLE:
                raise
            raise _unwritable(cfg, rd, e) from None
        try:
            checkpoint.check_writable(rd)  # before any work: read-only is the user's to fix (exit 2)
        except BaseException:
            lock.release()
            raise
        return lock

    try:
        lock = agree(mpi_comm, acquire)
        try:
            return _run(cfg, mpi_comm)
        finally:
            if lock is not None:
                lock.release()
    except StorageError as e:  # every rank together, with one message: say what the rerun will do
        raise StorageError(str(e).removesuffix(RERUN) + rerun_text(cfg)) from None


def rerun_text(cfg: Config) -> str:
    """After a refused write: what the same command will do once there is room,
    read from the checkpoints on disk (every rank sees the same run directory)."""
    rd = RunDir(cfg.run_dir)
    if cfg.run.resume == "never":
        return "free space and rerun the same command: it starts the run over (run.resume=never)"
    try:
        ck = checkpoint.latest(rd) or checkpoint.unpublished(rd)
    except (ConfigError, OSError):
        ck = None
    if ck is not None:
        return f"{RERUN} after round {int(ck.name.removeprefix('round-')) + 1} (its last checkpoint)"
    every = cfg.run.checkpoint_every
    why = ("run.checkpoint_every=0 writes one only at the end and on a signal" if every == 0 else
           f"the first comes after round {every}")
    return (f"free space and rerun the same command: it starts the run over, as no checkpoint was written yet "
            f"({why})")


def _events(cfg: Config, writer: Writer | None) -> Events | None:
    """The TensorBoard events of a run that asks for them (``log.tensorboard``), on the log's writer."""
    if not cfg.log.tensorboard or writer is None:
        return None
    from mpifl.logging.tensorboard import Events

    return Events(RunDir(cfg.run_dir).tb)


def _already_done(cfg: Config, mpi_comm) -> bool:
    """A finished run that kept no checkpoint, started again: says so (rank 0)."""
    rd = RunDir(cfg.run_dir)
    rank0 = mpi_comm.Get_rank() == 0
    done = mpi_comm.bcast(agree(mpi_comm, lambda: finished_without_checkpoint(cfg) if rank0 else None), root=0)
    if done is not None and rank0:
        _, acc = last_evaluated(rd.log)
        _say(f"done: the run had already finished all {done} rounds (it kept no checkpoint; nothing to do), "
             f"final mean test_acc {acc:.4f}; log: {rd.log}; to start over: run.resume=never", flush=True)
    return done is not None


def _run(cfg: Config, mpi_comm) -> Path:
    if _already_done(cfg, mpi_comm):
        return RunDir(cfg.run_dir).log
    s = setup(cfg, mpi_comm)
    ctx, algo = s.ctx, s.algo
    comm = ctx.comm
    rd = RunDir(cfg.run_dir)
    ck = agree(mpi_comm, lambda: find_checkpoint(cfg))
    state = algo.init(ctx)
    first = 0
    if ck is not None:
        first = agree(mpi_comm, lambda: checkpoint.load(ck, ctx, state)) + 1
        agree(mpi_comm, lambda: check_log(cfg, ck) if comm.is_writer else None)
    # a finished run started again changes nothing: its log and config.yaml stay as they are
    finished = ck is not None and first >= cfg.run.rounds
    origin = None if finished else provenance.collect(comm, str(ctx.clients.device), cfg.run_dir)
    writer = None if finished else agree(mpi_comm, lambda: _writer(cfg, s, first if ck is not None else None, origin))
    say = _say if comm.is_writer else (lambda *a, **k: None)
    say(f"mpifl {cfg.algorithm.name}: {ctx.N} clients on {comm.size} rank(s), {ctx.clients.P} parameters, "
        f"{ctx.clients.device}, {s.threads} thread(s)/rank, {_path_text(ctx.clients)} -> {cfg.run_dir}"
        + (f" (resumed after round {first})" if ck is not None else ""), flush=True)
    events = _events(cfg, writer)
    stop = _StopFlag()
    fault = _injected_fault(comm.rank)
    t_start = time.perf_counter()
    R = cfg.run.rounds
    every = cfg.run.checkpoint_every
    last_at, last_acc = -1, float("nan")  # round of the last evaluation seen, its mean test_acc
    if comm.is_writer and first > 0:
        last_at, last_acc = last_evaluated(rd.log)
    skipped, updates = 0, -ctx.clients.updates  # this rank's, over this run's rounds
    try:
        for t in range(first, R):
            if fault == (t, "raise"):
                raise RuntimeError(f"injected fault (MPIFL_FAULT) at round {t}")
            if fault == (t, "kill"):
                os.kill(os.getpid(), signal.SIGKILL)
            comm.reset_counters()
            ctx.clients.skipped[:] = 0
            t0 = time.perf_counter()
            out = algo.round(ctx, state, t)
            if evaluates(cfg, t):
                metrics = algo.evaluate(ctx, state, t)
            else:
                metrics = {k: np.full(comm.n_local, np.nan) for k in METRICS}
            wall = comm.allreduce_max(time.perf_counter() - t0)
            comm_s = comm.allreduce_max(comm.seconds)
            times = {"wall_s": wall, "comm_s": comm_s, "compute_s": wall - comm_s}
            # log.every thins the per-client rows (nothing is gathered in between);
            # evaluation keeps its own schedule so results do not depend on logging
            logged = (t + 1) % cfg.log.every == 0 or t == R - 1
            failed = None
            try:
                gathered = _log_round(writer, ctx, t, out, metrics, times) if logged else None
            except StorageError as e:  # rank 0's: the other ranks learn it at the reduction below
                gathered, failed = None, e
            skipped += int(ctx.clients.skipped.sum())
            if events is not None and gathered is not None:
                events.round(t + 1, gathered)
            if gathered is not None:
                acc = gathered["metrics/test_acc"]
                if not np.all(np.isnan(acc)):
                    last_at, last_acc = t, float(np.nanmean(acc))
                elapsed = time.perf_counter() - t_start
                eta = elapsed / (t + 1 - first) * (R - t - 1)
                say(f"round {t + 1:>4}/{R}  test_acc {_acc_text(last_acc, last_at, t)}  {wall:.2f}s/round  "
                    f"eta {eta:.0f}s{_skipped_text(int(gathered['metrics/skipped'].sum()))}", flush=True)
            flag = comm.allreduce_max(LOG_FAILED if failed else stop.signum)
            if flag >= LOG_FAILED:  # every rank stops with rank 0's message
                raise StorageError(comm.bcast(None if failed is None else str(failed)))
            stopping = flag > 0
            last = t == R - 1
            if (stopping or last or (every and (t + 1) % every == 0)) and (cfg.run.keep_final_checkpoint or not last):
                # the log must hold every round the checkpoint does
                agree(comm, lambda: writer.flush() if writer is not None else None)
                checkpoint.save(rd, ctx, state, t, die_before_publish=fault == (t, "kill_in_checkpoint"),
                                keep=1 if last else cfg.run.keep_checkpoints)
            if stopping and t < R - 1:
                say(f"mpifl: stop signal after round {t + 1}/{R}; checkpoint written, resume by running the same "
                    f"command again (exit {PREEMPTED})", flush=True)
                raise Preempted()
        agree(comm, lambda: writer.close() if writer is not None else None)
        if first < R and not cfg.run.keep_final_checkpoint and comm.is_writer:
            checkpoint.forget(rd)  # the log holds every round: a finished run of this config keeps none
    finally:
        if writer is not None:  # buffered rounds (log.flush_s), also when a round failed
            writer.close()
        if events is not None:
            events.close()
    total = time.perf_counter() - t_start
    skipped, updates = (int(x) for x in comm.allreduce_sum(np.array([skipped, updates + ctx.clients.updates])))
    if first >= R:
        say(f"done: the run had already finished all {R} rounds (checkpoint of round {first}; nothing to do), "
            f"final mean test_acc {last_acc:.4f}; log: {rd.log}; to start over: run.resume=never", flush=True)
    else:
        ran = f" ({R - first} in this run, resumed after round {first})" if first else ""
        dropped = f", {skipped} of {updates} client updates skipped as non-finite" if skipped else ""
        say(f"done: {R} rounds{ran} in {total:.1f}s, final mean test_acc {last_acc:.4f}{dropped}; log: {rd.log}",
            flush=True)
        if skipped and skipped == updates and comm.is_writer:
            print(f"mpifl: warning: every client update of {'this run' if first else 'the run'} ({updates}) was "
                  f"skipped as non-finite (train.on_nonfinite=skip): no client trained; lower train.lr",
                  file=sys.stderr, flush=True)
    return rd.log


def _say(*args, **kwargs) -> None:
    """A progress line; a stdout that cannot take it (a file on a full disk) costs
    the line, not the run: the log is the record."""
    try:
        print(*args, **kwargs)
    except OSError:
        pass


def _skipped_text(n: int) -> str:
    """The progress line's note of the updates ``train.on_nonfinite=skip`` dropped."""
    return f"  {n} update{'s' if n != 1 else ''} skipped (non-finite)" if n else ""


class _StopFlag:
    """Remembers a SIGTERM/SIGUSR1 (SLURM's warning before a time limit or
    preemption) so the round in progress can finish and be checkpointed."""

    def __init__(self) -> None:
        self.signum = 0
        for sig in STOP_SIGNALS:
            try:
                signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (embedded use): no handler
                pass

    def _handle(self, signum, frame) -> None:
        self.signum = signum


def _injected_fault(rank: int) -> tuple[int, str] | None:
    """``MPIFL_FAULT=rank:round[:raise|kill|kill_in_checkpoint]``: fail that rank at
    that round, for the reliability tests (raise an exception, SIGKILL itself at
    the round's start, or SIGKILL itself in the middle of writing a checkpoint)."""
    parts = os.environ.get("MPIFL_FAULT", "").split(":")
    if len(parts) < 2:
        return None
    kind = parts[2] if len(parts) > 2 else "raise"
    return (int(parts[1]), kind) if int(parts[0]) == rank else None
