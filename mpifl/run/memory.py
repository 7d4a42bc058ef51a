"""Before anything is allocated: the memory a run needs per rank, estimated from
its config alone, against the memory the rank has; and ``run.threads`` against the
CPUs the process may use. ``mpifl.run.runtime.setup`` refuses a run that cannot fit
in one line (exit 2) instead of thrashing or being killed minutes later;
``python -m mpifl.check`` prints the estimate.

The estimate is a lower bound, what every run keeps whatever its algorithm:

- on the run's device, per client of the rank: its parameter row, its optimizer
  state (SGD with momentum one row, Adam two), a copy of both under
  ``train.on_nonfinite=skip``, its BatchNorm buffers and its samples as float32;
  and the gradient rows of the clients trained together (all of the rank's on a
  GPU, ``CHUNK_BYTES`` of parameters' worth on the CPU);
- on every rank's host: the whole dataset as stored (every rank partitions it)
  and about :data:`PER_CLIENT` bytes of bookkeeping per client of the run (the
  partition, each client's splits; measured at 1.1 to 1.7 KiB).

- on every rank's host: the batch plan of the longest training call, the
  ``int64`` sample index of every step of every client of the rank
  (:func:`mpifl.train.plan.make_plan` builds it at once), for the largest of the
  run's epoch counts (:func:`epoch_counts`) over a client's average training
  split padded to whole batches.

Algorithms keep more (personal models, received rows). Those an algorithm is sure
to hold at once, per client, its config part names (``held_rows(cfg)``, in
``mpifl/algorithms/<name>_params.py``: FedeRiCo's 2 (k + 1), the personal models and
control variates of APFL, Ditto, FedDyn, MOON, pFedGraph, pFedMe and SCAFFOLD), and they are added to
the rows; the rest is left out, so a run refused here could not have fitted.
Counts that allocate nothing still take time: every
epoch count runs at least once and every round costs at least
:data:`ROUND_S`, at a rate of :data:`FLOPS` (above any device's), so a run
whose lower bound passes :data:`MAX_S` (``run.rounds=10**18``) is refused too
(:func:`duration`). Memory available: ``MemAvailable`` (``/proc/meminfo``)
capped by the process's cgroup limit (what SLURM enforces), shared by the ranks on
the node; on a GPU, ``torch.cuda.mem_get_info``, shared by the ranks on that GPU.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpifl.errors import ConfigError

PER_CLIENT = 1024  # host bytes per client of the run on every rank: partition and splits
MODEL_BIG = 1 << 30  # bytes of one client's rows past which the model, not the clients, is named
CGROUP = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")  # this process's cgroup in each hierarchy
MEMINFO = Path("/proc/meminfo")
PLAN_BYTES = 8  # per planned sample of a step: the int64 index (make_plan)
FLOPS = 1e15  # per rank, above any device's rate: the time estimate stays a lower bound
TRAIN_FLOPS = 6  # per parameter and sample of a training step (forward and backward)
ROUND_S = 1e-4  # the least a round costs: its collectives and bookkeeping
MAX_S = 366 * 86400  # a run longer than this at FLOPS would never finish: refused


def human(n: float) -> str:
    """Bytes as ``12.3 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


@dataclass(frozen=True)
class Estimate:
    """Bytes one rank needs at least (see the module's docstring)."""

    n_clients: int
    n_local: int  # clients on this rank
    params: int  # P: parameters of one model
    rows: int  # [P] rows kept per client: parameters, optimizer state, a copy under on_nonfinite=skip, held_rows
    grad_rows: int  # [P] gradient rows of the clients trained together
    extra: int  # values per client besides the rows: BatchNorm buffers, Adam's step count
    data: int  # bytes of this rank's samples on its device
    pool: int  # bytes of the whole dataset on the host
    bookkeeping: int  # bytes of per-client bookkeeping on the host
    on_gpu: bool
    plan: int = 0  # host bytes of the largest batch plan (the longest training call)
    plan_key: str = "train.local_epochs"  # the epoch count that sets it, as key=value
    n_train: int = 0  # a client's average training samples

    @property
    def clients(self) -> int:
        """Bytes of the clients' rows (and the gradients) on the device."""
        return 4 * ((self.n_local * self.rows + self.grad_rows + 2) * self.params + self.n_local * self.extra)

    @property
    def device(self) -> int:
        return self.clients + self.data

    @property
    def host(self) -> int:
        """On the host: the pool and bookkeeping, and on the CPU everything."""
        return self.pool + self.bookkeeping + self.plan + (0 if self.on_gpu else self.device)

    def text(self) -> str:
        where = "on its GPU" if self.on_gpu else "in memory"
        gpu = f" (host: {human(self.host)})" if self.on_gpu else ""
        return (f"at least {human(self.device if self.on_gpu else self.host)} per rank {where}{gpu}: "
                f"{self.n_local:,} clients on the rank x {self.rows} row(s) of {self.params:,} parameters "
                f"({human(self.clients)} with the gradients), {human(self.data)} of their samples, "
                f"{human(self.pool)} of dataset, {human(self.bookkeeping)} to partition it among "
                f"{self.n_clients:,} clients and {human(self.plan)} of batch plan ({self.plan_key})")

    def culprit(self, cfg: Any) -> str:
        """The key to change, as ``key=value``, by the largest part of the estimate:
        the batch plan's epoch count (or ``train.batch_size`` when batches are
        mostly padding), the generated dataset's size, else the model's size when
        one client's rows alone take more than :data:`MODEL_BIG`, else the number
        of clients."""
        parts = {"plan": self.plan, "data": self.pool + self.data, "clients": self.clients + self.bookkeeping}
        largest = max(parts, key=parts.__getitem__)
        if largest == "plan":
            bs = cfg.train.batch_size
            return f"train.batch_size={bs}" if bs > 2 * max(self.n_train, 1) else self.plan_key
        if largest == "data" and cfg.data.name in ("mnist1d", "synthetic"):
            return f"data.n_samples={cfg.data.n_samples}"
        if 4 * self.params * (self.rows + 1) > MODEL_BIG:
            return f"model.hidden={cfg.model.hidden}" if cfg.model.name == "mlp" else f"model.name={cfg.model.name!r}"
        return f"data.n_clients={cfg.data.n_clients}"


def epoch_counts(cfg: Any) -> dict[str, int]:
    """The epoch counts of the run's training calls, by key: ``train.local_epochs``
    and the chosen algorithm's own keys named ``*epochs`` or ``tau_*`` (local
    epochs, by the project's naming: ``dpfl.tau_init``, ``fedrep.head_epochs``,
    ``fedavg_ft.ft_epochs``...)."""
    import dataclasses

    a = cfg.algorithm
    out = {"train.local_epochs": cfg.train.local_epochs}
    section = getattr(cfg, a.name, None)
    if dataclasses.is_dataclass(section):
        for f in dataclasses.fields(section):
            v = getattr(section, f.name)
            if f.name == "ft_epochs":  # the *_ft algorithms' fine-tuning: 0 means 2 * train.local_epochs
                v = v or 2 * cfg.train.local_epochs
            if (f.name.endswith("epochs") or f.name.startswith("tau_")) and isinstance(v, int):
                out[f"{a.name}.{f.name}"] = v
    return out


def train_samples(cfg: Any, n_samples: int) -> int:
    """A client's average training samples (``data.train_per_client`` when set)."""
    d = cfg.data
    frac = 1 - d.val_frac - (d.test_frac if d.test_source == "split" else 0)
    n = int(n_samples * d.subsample * frac) // d.n_clients
    return min(n, d.train_per_client) if d.train_per_client else n


def _plan(cfg: Any, n_local: int, n_train: int) -> tuple[int, str]:
    """(host bytes of the largest batch plan, its epoch count as key=value)."""
    key, epochs = max(epoch_counts(cfg).items(), key=lambda kv: kv[1])
    bs = cfg.train.batch_size
    steps = -(-max(n_train, 1) // bs)  # batches per epoch, the last one padded to bs
    return PLAN_BYTES * n_local * epochs * steps * bs, f"{key}={epochs}"


def _held_rows(cfg: Any) -> int:
    """The rows per client the chosen algorithm's config part says it holds at once (0: none said)."""
    from mpifl.algorithms import config_part

    held = getattr(config_part(cfg.algorithm.name), "held_rows", None)
    return int(held(cfg)) if held is not None else 0


def estimate(cfg: Any, n_ranks: int, rank: int, on_gpu: bool) -> Estimate | None:
    """The estimate for ``rank`` of ``n_ranks``; None where the dataset's shape is
    not known without its files (:func:`mpifl.data.shape.shape`)."""
    from mpifl.comm import Placement
    from mpifl.data.shape import shape
    from mpifl.models import sizes
    from mpifl.train.batched import CHUNK_BYTES

    d = shape(cfg.data)
    if d is None:
        return None
    N = cfg.data.n_clients
    n_local = int(Placement(N, n_ranks).counts()[rank])
    try:
        P, B = sizes(cfg.model, d.in_shape, d.n_classes)
    except ConfigError:  # the model does not take this data (an image model on vectors): its own words
        raise
    except (RuntimeError, OverflowError, ValueError) as e:  # torch cannot even size it (storage overflow)
        model = f"model.hidden={cfg.model.hidden}" if cfg.model.name == "mlp" else f"model.name={cfg.model.name!r}"
        raise ConfigError(f"{model} is not allowed: the model cannot be sized ({str(e).splitlines()[0][:80]}); "
                          f"use smaller widths") from None
    t = cfg.train
    opt = t.state_rows
    copies = 2 if t.on_nonfinite == "skip" else 1  # the rows before training, to drop a non-finite update
    rows = (1 + opt) * copies + _held_rows(cfg)
    extra = B + (copies if t.optimizer == "adam" else 0)
    grad_rows = n_local if on_gpu else min(n_local, max(1, CHUNK_BYTES // (4 * P)))
    features = math.prod(d.in_shape)
    local_samples = d.n_samples * n_local // N
    n_train = train_samples(cfg, d.n_samples)
    plan, plan_key = _plan(cfg, n_local, n_train)
    return Estimate(N, n_local, P, rows, grad_rows, extra, 4 * local_samples * features,
                    d.n_samples * features * d.stored_bytes, PER_CLIENT * N, on_gpu, plan, plan_key, n_train)


def duration(cfg: Any, est: Estimate) -> tuple[float, str]:
    """(a lower bound of the run's seconds, the count that sets it as key=value):
    every epoch count runs at least once over every client of the rank at
    :data:`FLOPS`, every round costs at least :data:`ROUND_S`."""
    epoch_s = TRAIN_FLOPS * est.params * est.n_local * max(est.n_train, 1) / FLOPS
    key, epochs = max(epoch_counts(cfg).items(), key=lambda kv: kv[1])
    by_rounds, by_epochs = cfg.run.rounds * ROUND_S, epochs * epoch_s
    if by_rounds >= by_epochs:
        return by_rounds, f"run.rounds={cfg.run.rounds}"
    return by_epochs, f"{key}={epochs}"


def human_s(s: float) -> str:
    """Seconds as ``3.2 days`` (or years)."""
    for unit, n in (("years", 365.25 * 86400), ("days", 86400), ("hours", 3600)):
        if s >= n:
            return f"{s / n:.3g} {unit}"
    return f"{s:.3g} s"


def check_duration(cfg: Any, est: Estimate) -> None:
    """A run whose lower-bound time passes :data:`MAX_S` is refused, naming the count."""
    s, key = duration(cfg, est)
    if s > MAX_S:
        raise ConfigError(f"{key} is not allowed: the run would take at least {human_s(s)} per rank (at most "
                          f"{MAX_S // 86400} days is accepted; {est.n_local:,} clients x {max(est.n_train, 1):,} "
                          f"training samples x {est.params:,} parameters per epoch at {FLOPS:.0e} FLOP/s, at least "
                          f"{ROUND_S:g} s a round); lower it")


# --------------------------------------------------------------------------- what there is


def _read_text(path: Path) -> str | None:
    """A /proc or /sys file's text; None where the kernel has none."""
    try:
        return path.read_text()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = (_read_text(path) or "").strip()
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def cgroup_room() -> int | None:
    """Bytes the process's cgroup (and every cgroup above it) still allows it:
    limit - usage at the tightest level; None without a limit."""
    text = _read_text(PROC_CGROUP)
    if text is None:
        return None
    lines = text.splitlines()
    room: list[int] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: the unified hierarchy, limits on the path and above it
            d = CGROUP / path.lstrip("/")
            while True:
                limit, used = _read_int(d / "memory.max"), _read_int(d / "memory.current")
                if limit is not None and used is not None:
                    room.append(limit - used)
                if d == CGROUP or CGROUP not in d.parents:
                    break
                d = d.parent
        elif "memory" in controllers.split(","):
            d = CGROUP / "memory" / path.lstrip("/")
            limit, used = _read_int(d / "memory.limit_in_bytes"), _read_int(d / "memory.usage_in_bytes")
            if limit is not None and used is not None and limit < 1 << 60:  # v1's "unlimited" is a huge number
                room.append(limit - used)
    return max(0, min(room)) if room else None


def host_available() -> tuple[int, str]:
    """(bytes this node's memory still has for the process, where that came from)."""
    avail, how = None, "MemAvailable"
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        avail, how = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free pages"
    room = cgroup_room()
    if room is not None and room < avail:
        avail, how = room, "cgroup memory limit"
    return avail, how


def available(on_gpu: Any, ranks_on_node: int, ranks_on_device: int) -> tuple[int, int | None, str]:
    """(host bytes per rank, device bytes per rank or None on the CPU, how they
    were found): the node's memory shared by its ranks, a GPU's by the ranks on it."""
    host, how = host_available()
    host //= max(1, ranks_on_node)
    how = f"{how} shared by {ranks_on_node} rank(s) on the node"
    if not on_gpu:
        return host, None, how
    import torch

    try:
        free, _ = torch.cuda.mem_get_info(on_gpu)
    except (RuntimeError, AssertionError):  # the driver does not say: the GPU's side is not checked
        return host, None, how + "; the GPU's free memory unknown"
    return host, free // max(1, ranks_on_device), how + f"; GPU free memory shared by {ranks_on_device} rank(s)"


# --------------------------------------------------------------------------- the checks


def assess(cfg: Any, n_ranks: int, rank: int, device: Any, local: int, per_node: int) -> tuple[str, str | None]:
    """(the estimate and what the rank has, as one line; why the run cannot fit,
    naming the key, or None) for ``rank`` of ``n_ranks``, the ``local``-th of the
    ``per_node`` ranks on its node, running on ``device``."""
    on_gpu = getattr(device, "type", "cpu") == "cuda"
    est = estimate(cfg, n_ranks, rank, on_gpu)
    if est is None:
        return f"not estimated: the shape of data.name={cfg.data.name!r} is read from its files", None
    try:
        check_duration(cfg, est)
    except ConfigError as e:
        return est.text(), str(e)
    sharing = per_node
    if on_gpu:
        import torch

        gpus = torch.cuda.device_count()
        sharing = len(range(local % gpus, per_node, gpus))
    host, dev, how = available(device if on_gpu else None, per_node, sharing)
    have = [f"{human(host)} of host memory"] + ([f"{human(dev)} of GPU memory"] if dev is not None else [])
    short = [h for h, need, got in zip(have, (est.host, est.device), (host, dev)) if got is not None and need > got]
    line = f"{est.text()}; rank {rank} has {' and '.join(have)} ({how})"
    if not short:
        return line, None
    return line, (f"{est.culprit(cfg)} is too large for this machine: the run needs {est.text()}; rank {rank} has "
                  f"{' and '.join(short)} ({how}); use fewer clients or a smaller model, or more ranks on more nodes")


def cpus() -> int:
    """CPUs this process may run on (its affinity: what SLURM or the launcher gave it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def check_threads(threads: int) -> None:
    """``run.threads`` above the CPUs this process may use is refused (more
    threads than CPUs only contend; a huge number crashes torch's thread pool)."""
    n = cpus()
    if threads > n:
        raise ConfigError(f"run.threads={threads} is not allowed here: this process may use {n} CPU(s) (its "
                          f"affinity); use run.threads=0 (the cores of this rank) or at most {n}")
