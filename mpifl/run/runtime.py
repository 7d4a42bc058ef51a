"""One run: config -> placement, device, data, clients -> rounds -> HDF5 log.

The round loop (:class:`_Rounds`) reads as the algorithm's outline: train,
evaluate, log, report, then checkpoint or stop as every rank agreed. What a start
resumes from is :mod:`mpifl.run.resume`'s; the log's writer and the rows of a
logged round are :mod:`mpifl.run.roundlog`'s.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mpifl import algorithms, models
from mpifl.algorithms.base import Algorithm, Context, Interrupt, RoundStopped, evaluates
from mpifl.comm import Comm, agree, keep_freed_memory, node_local_rank, node_of_ranks, pick_device, set_threads
from mpifl.config import Config
from mpifl.data import build as build_data
from mpifl.errors import RERUN, UNWRITABLE, ConfigError, StorageError
from mpifl.logging.h5 import Writer
from mpifl.paths import RunDir
from mpifl.run import checkpoint, provenance, resume, roundlog
from mpifl.run import lock as runlock
from mpifl.run import memory as sizes
from mpifl.train import Clients

METRICS = ("val_loss", "val_acc", "test_loss", "test_acc")
PREEMPTED = 75  # exit status after a signal-triggered checkpoint (EX_TEMPFAIL): requeue me
LOG_FAILED = 1 << 10  # above any signal number: rank 0's log write was refused (agreed with the stop flag)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
# a round longer than this is checkpointed when it ends, so that a stop signal inside
# the next one need not wait for its end (SLURM kills 30 s after SIGTERM by default)
LONG_ROUND_S = 30.0
# train.fused_conv=auto keeps the fused conv kernel unless torch's is faster by more than
# this: a timing near a tie could flip from launch to launch, and the kernel moves the bits
FUSED_MARGIN = 1.1


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
        keep_freed_memory()
        device = pick_device(cfg.run.device, mpi_comm)
        data = build_data(cfg.data, cfg.run.seed, comm.local_ids)
        model = models.build(cfg.model, data.in_shape, data.n_classes, cfg.run.seed)
        clients = Clients(model, data, cfg.train, device, cfg.run.seed)
        # one conv kernel on every rank, before the paths are timed: the log names one
        fallback = clients.agree_conv_kernel(comm.allgather(clients.conv_unavailable))
        if fallback and comm.rank == 0:
            _say(fallback, flush=True)
        if clients.conv_needs_measuring:  # train.fused_conv=auto: torch's kernels where the fused ones are slower
            tf, tt = clients.measure_conv()
            clients.conv_times = comm.allreduce_sum(tf), comm.allreduce_sum(tt)
            if clients.conv_times[0] > FUSED_MARGIN * clients.conv_times[1]:
                clients.keep_conv_kernel("torch")
                if comm.rank == 0:
                    _say(f"mpifl: train.fused_conv=auto: the fused conv kernel is slower than torch's here "
                         f"({1e3 * clients.conv_times[0]:.1f} ms against {1e3 * clients.conv_times[1]:.1f} ms, "
                         f"summed over ranks): every rank takes torch's kernels (other sums, other bits)", flush=True)
        if clients.needs_measuring:  # train.batched=auto: the faster path, timed on every rank
            tb, tl = clients.measure_paths()
            clients.path_times = comm.allreduce_sum(tb), comm.allreduce_sum(tl)
            clients.batched = clients.path_times[0] < clients.path_times[1]
        ctx = Context(cfg, comm, clients, data)
        return Setup(ctx, algorithms.get(cfg.algorithm.name), threads, nodes)

    return agree(mpi_comm, build)


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
            raise roundlog.unwritable(cfg, rd, e) from None
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
        raise StorageError(str(e).removesuffix(RERUN) + resume.rerun_text(cfg)) from None


def _already_done(cfg: Config, mpi_comm) -> bool:
    """A finished run that kept no checkpoint, started again: says so (rank 0)."""
    rd = RunDir(cfg.run_dir)
    rank0 = mpi_comm.Get_rank() == 0
    done = mpi_comm.bcast(agree(mpi_comm, lambda: resume.finished_without_checkpoint(cfg) if rank0 else None), root=0)
    if done is not None and rank0:
        _, acc = resume.last_evaluated(rd.log)
        _say(f"done: the run had already finished all {done} rounds (it kept no checkpoint; nothing to do), "
             f"final mean test_acc {acc:.4f}; log: {rd.log}; to start over: run.resume=never", flush=True)
    return done is not None


def _run(cfg: Config, mpi_comm) -> Path:
    if _already_done(cfg, mpi_comm):
        return RunDir(cfg.run_dir).log
    s = setup(cfg, mpi_comm)
    ctx, comm = s.ctx, s.ctx.comm
    ck = agree(mpi_comm, lambda: resume.find_checkpoint(cfg))
    state = s.algo.init(ctx)
    first = 0
    if ck is not None:
        first = agree(mpi_comm, lambda: checkpoint.load(ck, ctx, state)) + 1
        agree(mpi_comm, lambda: resume.check_log(cfg, ck) if comm.is_writer else None)
    # a finished run started again changes nothing: its log and config.yaml stay as they are
    finished = ck is not None and first >= cfg.run.rounds
    train = provenance.training(ctx.clients.trained_conv_kernel, s.threads, ctx.clients.batched,
                                ctx.clients.conv_times)
    origin = None if finished else provenance.collect(comm, str(ctx.clients.device), cfg.run_dir, train)
    keep = first if ck is not None else None
    writer = None if finished else agree(
        mpi_comm, lambda: roundlog.open_writer(cfg, ctx, s.threads, s.nodes, keep, origin))
    say = _say if comm.is_writer else (lambda *a, **k: None)
    say(f"mpifl {cfg.algorithm.name}: {ctx.N} clients on {comm.size} rank(s), {ctx.clients.P} parameters, "
        f"{ctx.clients.device}, {s.threads} thread(s)/rank, {_path_text(ctx.clients)} -> {cfg.run_dir}"
        + (f" (resumed after round {first})" if ck is not None else ""), flush=True)
    rounds = _Rounds(cfg, s, state, writer, first, say)
    try:
        for t in range(first, cfg.run.rounds):
            rounds.round(t)
        rounds.finish()
    finally:
        rounds.close()
    rounds.report()
    return rounds.rd.log


class _Rounds:
    """The round loop: what a round needs besides the algorithm's state, and what
    the progress lines and the last line report."""

    def __init__(self, cfg: Config, s: Setup, state, writer: Writer | None, first: int, say) -> None:
        self.cfg, self.ctx, self.algo, self.state, self.writer = cfg, s.ctx, s.algo, state, writer
        self.comm, self.rd, self.first, self.say = s.ctx.comm, RunDir(cfg.run_dir), first, say
        self.events = roundlog.events(cfg, writer)
        self.stop = _StopFlag(self.ctx.stop)
        self.saved = first - 1  # the last round a checkpoint holds (-1: a fresh start gives the same bits)
        self.fault = _injected_fault(self.comm.rank)
        self.t_start = time.perf_counter()
        self.last_at, self.last_acc = -1, float("nan")  # round of the last evaluation seen, its mean test_acc
        if self.comm.is_writer and first > 0:
            self.last_at, self.last_acc = resume.last_evaluated(self.rd.log)
        self.skipped, self.updates = 0, -self.ctx.clients.updates  # this rank's, over this run's rounds

    def round(self, t: int) -> None:
        """Round ``t``: train, evaluate, log, report; then checkpoint or stop, as every rank agreed."""
        cfg, ctx, comm = self.cfg, self.ctx, self.comm
        if self.fault == (t, "raise"):
            raise RuntimeError(f"injected fault (MPIFL_FAULT) at round {t}")
        if self.fault == (t, "kill"):
            os.kill(os.getpid(), signal.SIGKILL)
        comm.reset_counters()
        ctx.clients.skipped[:] = 0
        ctx.clients.steps[:], ctx.clients.samples[:] = 0, 0
        t0 = time.perf_counter()
        out = self._train(t)
        if evaluates(cfg, t):
            metrics = self.algo.evaluate(ctx, self.state, t)
        else:
            metrics = {k: np.full(comm.n_local, np.nan) for k in METRICS}
        wall = comm.allreduce_max(time.perf_counter() - t0)
        comm_s = comm.allreduce_max(comm.seconds)
        times = {"wall_s": wall, "comm_s": comm_s, "compute_s": wall - comm_s}
        # log.every thins the per-client rows (nothing is gathered in between);
        # evaluation keeps its own schedule so results do not depend on logging
        logged = (t + 1) % cfg.log.every == 0 or t == cfg.run.rounds - 1
        failed = None
        try:
            gathered = roundlog.log_round(self.writer, ctx, t, out, metrics, times) if logged else None
        except StorageError as e:  # rank 0's: the other ranks learn it at the reduction below
            gathered, failed = None, e
        self.skipped += int(ctx.clients.skipped.sum())
        if gathered is not None:
            self._progress(t, gathered, wall)
        flag = comm.allreduce_max(LOG_FAILED if failed else self.stop.signum)
        if flag >= LOG_FAILED:  # every rank stops with rank 0's message
            raise StorageError(comm.bcast(None if failed is None else str(failed)))
        self._checkpoint(t, stopping=flag, long=wall > LONG_ROUND_S or self.long_next(t + 1))

    def long_next(self, t: int) -> bool:
        """Whether the algorithm knows round ``t`` to be long (its ``long_round``)."""
        known = getattr(self.algo, "long_round", None)
        return t < self.cfg.run.rounds and known is not None and bool(known(self.cfg, t))

    def _train(self, t: int):
        """The algorithm's round; one that every rank agreed to abandon for a stop
        signal (``ctx.stop``) ends the job here, the round before already on disk."""
        stop = self.ctx.stop
        stop.abandonable, stop.cut = self.saved == t - 1, False
        if self.fault == (t, "stop_in_round"):  # as if the signal arrived during this round's work
            stop.signum = signal.SIGTERM
        try:
            out = self.algo.round(self.ctx, self.state, t)
            # abandonable is the same on every rank: this collective only runs where a cut could be
            if stop.abandonable and self.comm.allreduce_max(float(stop.cut)):
                raise RoundStopped()
        except RoundStopped:
            R = self.cfg.run.rounds
            then = f"the checkpoint of round {t} resumes" if t else "no round had finished, so it starts over " \
                "(the same bits)"
            self.say(f"mpifl: stop signal ({_signal_name(stop.signum or signal.SIGTERM)}) during round {t + 1}/{R}; "
                     f"the round was abandoned and {then}: run the same command again (exit {PREEMPTED})", flush=True)
            raise Preempted() from None
        finally:
            stop.abandonable = False
        return out

    def _progress(self, t: int, gathered: dict[str, np.ndarray], wall: float) -> None:
        R = self.cfg.run.rounds
        if self.events is not None:
            self.events.round(t + 1, gathered)
        acc = gathered["metrics/test_acc"]
        if not np.all(np.isnan(acc)):
            self.last_at, self.last_acc = t, float(np.nanmean(acc))
        elapsed = time.perf_counter() - self.t_start
        eta = elapsed / (t + 1 - self.first) * (R - t - 1)
        self.say(f"round {t + 1:>4}/{R}  test_acc {_acc_text(self.last_acc, self.last_at, t)}  {wall:.2f}s/round  "
                 f"eta {eta:.0f}s{_skipped_text(int(gathered['metrics/skipped'].sum()))}", flush=True)

    def _checkpoint(self, t: int, stopping: int, long: bool = False) -> None:
        """The checkpoints ``run.checkpoint_every`` asks for, one before a stop
        (``stopping``: the signal every rank agreed on, 0 for none), and one after a
        ``long`` round (the agreed wall time), so the next may be abandoned."""
        run, R, writer = self.cfg.run, self.cfg.run.rounds, self.writer
        last = t == R - 1
        every = run.checkpoint_every
        if (stopping or long or last or (every and (t + 1) % every == 0)) and (run.keep_final_checkpoint or not last):
            # the log must hold every round the checkpoint does
            agree(self.comm, lambda: writer.flush() if writer is not None else None)
            dying = self.fault == (t, "kill_in_checkpoint")
            checkpoint.save(self.rd, self.ctx, self.state, t, die_before_publish=dying,
                            keep=1 if last else run.keep_checkpoints)
            self.saved = t
        if stopping and t < R - 1:
            self.say(f"mpifl: stop signal ({_signal_name(stopping)}) after round {t + 1}/{R}; checkpoint written, "
                     f"resume by running the same command again (exit {PREEMPTED})", flush=True)
            raise Preempted()

    def finish(self) -> None:
        """After the last round: the log closed, and the checkpoints of a run that keeps none forgotten."""
        writer = self.writer
        agree(self.comm, lambda: writer.close() if writer is not None else None)
        if self.first < self.cfg.run.rounds and not self.cfg.run.keep_final_checkpoint and self.comm.is_writer:
            checkpoint.forget(self.rd)  # the log holds every round: a finished run of this config keeps none

    def close(self) -> None:
        """However the loop ended: buffered rounds (log.flush_s) written, also when a round failed."""
        self.stop.restore()
        if self.writer is not None:
            self.writer.close()
        if self.events is not None:
            self.events.close()

    def report(self) -> None:
        R, first, rd, comm = self.cfg.run.rounds, self.first, self.rd, self.comm
        total = time.perf_counter() - self.t_start
        sums = comm.allreduce_sum(np.array([self.skipped, self.updates + self.ctx.clients.updates]))
        skipped, updates = (int(x) for x in sums)
        if first >= R:
            self.say(f"done: the run had already finished all {R} rounds (checkpoint of round {first}; nothing to "
                     f"do), final mean test_acc {self.last_acc:.4f}; log: {rd.log}; to start over: run.resume=never",
                     flush=True)
            return
        ran = f" ({R - first} in this run, resumed after round {first})" if first else ""
        dropped = f", {skipped} of {updates} client updates skipped as non-finite" if skipped else ""
        self.say(f"done: {R} rounds{ran} in {total:.1f}s, final mean test_acc {self.last_acc:.4f}{dropped}; "
                 f"log: {rd.log}", flush=True)
        if skipped and skipped == updates and comm.is_writer:
            print(f"mpifl: warning: every client update of {'this run' if first else 'the run'} ({updates}) was "
                  f"skipped as non-finite (train.on_nonfinite=skip): no client trained; lower train.lr",
                  file=sys.stderr, flush=True)


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
    preemption) or a Ctrl-C (SIGINT: mpiexec forwards it to every rank) so the
    round in progress can finish and be checkpointed. A second Ctrl-C ends the
    process at once, as an unhandled one would (mpiexec aborts every rank on its
    own second Ctrl-C). The handlers before it come back when the loop ends."""

    def __init__(self, into: Interrupt | None = None) -> None:
        self.into = into if into is not None else Interrupt()  # the algorithms' view (ctx.stop)
        self._old: dict[int, object] = {}
        for sig in STOP_SIGNALS:
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (embedded use): no handler
                pass

    @property
    def signum(self) -> int:
        return self.into.signum

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        self.into.signum = signum

    def restore(self) -> None:
        for sig, old in self._old.items():
            if old is not None:  # None: a handler not set from Python, which cannot be put back
                signal.signal(sig, old)
        self._old = {}


def _signal_name(signum: int) -> str:
    """SIGINT as what sends it at a terminal, other signals by their names."""
    return "Ctrl-C, SIGINT" if signum == signal.SIGINT else signal.Signals(signum).name


def _injected_fault(rank: int) -> tuple[int, str] | None:
    """``MPIFL_FAULT=rank:round[:raise|kill|kill_in_checkpoint|stop_in_round]``: fail
    that rank at that round, for the reliability tests (raise an exception, SIGKILL
    itself at the round's start, SIGKILL itself in the middle of writing a
    checkpoint, or take a stop signal as the round's work begins)."""
    parts = os.environ.get("MPIFL_FAULT", "").split(":")
    if len(parts) < 2:
        return None
    kind = parts[2] if len(parts) > 2 else "raise"
    return (int(parts[1]), kind) if int(parts[0]) == rank else None
