"""Preflight: ``python -m mpifl.check [CONFIG] [section.key=value ...]``.

Launch it as the run will be launched (``srun -n R python -m mpi4py -m
mpifl.check CONFIG``, ``mpiexec -n R ...``, or alone) before spending an
allocation: it starts MPI and reports the ranks, nodes and node-local ranks, the
PMI in use, cores and GPUs per rank against the config's placement, the memory
a rank needs at least against what it has (:mod:`mpifl.run.memory`), whether every
rank sees the same run directory and data root, the versions on every rank, the
facts every run log records (:mod:`mpifl.run.provenance`: commit, CPU kernels, BLAS,
GPU, hosts), whether mpifl's fused conv kernel builds for a conv net (:mod:`mpifl.train.fused`; built
then, so the run finds it cached), the time ``import torch`` took and a tiny exchange timing. Each problem is one line
saying what is wrong and what to change; any problem makes the exit status 1
(a config no rank can read: 2, as for every entry point). Notes (shared cores,
shared GPUs) do not.

The parts that need no MPI launch (:func:`local_problems`, :func:`launch_problems`,
:func:`node_local`) also run in ``python -m mpifl.sweep --submit``; torch and
mpi4py are imported only when the MPI part starts, so those stay cheap.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from mpifl import config as config_mod
from mpifl.cli import parse
from mpifl.errors import ConfigError, ranges

if TYPE_CHECKING:  # building Config imports every algorithm (and torch): only once a config is loaded
    from mpifl.config import Config

NODE_LOCAL = ("/tmp", "/var/tmp", "/dev/shm")  # plus $TMPDIR: see node_local
PROBLEMS = 1  # exit status when anything would stop or break the run
LAUNCHER_VARS = ("SLURM_MPI_TYPE", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "PMI_RANK", "PMI_SIZE", "PMI_FD",
                 "PMI_PORT", "PMI_ID", "PMIX_RANK", "PMIX_NAMESPACE", "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")
FIX_PMI = "use srun --mpi=pmi2 for MPICH, Intel MPI or MVAPICH and --mpi=pmix for Open MPI (slurm.mpi in a sweep)"
SHARED = "on storage every compute node mounts"
UNREADABLE = "unreadable"  # a data root this rank may not list


# --------------------------------------------------------------------------- no MPI needed


def node_local(path: str | Path) -> str | None:
    """The node-local root (/tmp, /var/tmp, /dev/shm, $TMPDIR) that ``path`` lies
    under, or None. Symlinks count both ways: /tmp may itself be a link."""
    roots = list(NODE_LOCAL)
    tmpdir = os.environ.get("TMPDIR", "")
    if tmpdir and os.path.abspath(tmpdir) != "/":
        roots.append(os.path.abspath(tmpdir))
    p = os.path.abspath(path)
    for where in {p, os.path.realpath(p)}:
        for root in roots:
            for r in {root, os.path.realpath(root)}:
                if where == r or where.startswith(r.rstrip("/") + "/"):
                    return root
    return None


def _data_path(cfg: Config) -> Path | None:
    """Where the run reads its data (None: built-in data, or no root where one is needed)."""
    from mpifl.data.datasets import data_path  # imports torch: only when asked

    return data_path(cfg.data)


def _needs_root(cfg: Config) -> bool:
    from mpifl.data.datasets import BUILTIN

    return cfg.data.name not in BUILTIN


def _unwritable(path: Path) -> str | None:
    """Why the folder ``path`` (or the nearest existing parent it would be made
    in) cannot be written here, or None."""
    p = path.expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        return f"{p} is not a folder"
    if not os.access(p, os.W_OK | os.X_OK):
        return f"{p} is not writable"
    return None


def _placement(cfg: Config, n_ranks: int) -> str | None:
    n = cfg.data.n_clients
    if n >= n_ranks:
        return None
    return (f"data.n_clients={n} is fewer than the {n_ranks} MPI ranks: {n_ranks - n} rank(s) would host no "
            f"client; launch at most {n} ranks (srun -n, mpiexec -n, slurm.ntasks) or raise data.n_clients")


def _root_unset(cfg: Config) -> str | None:
    if cfg.data.root or not _needs_root(cfg) or _data_path(cfg) is not None:
        return None
    return (f"data.name={cfg.data.name!r} is read from disk but data.root is empty; set data.root=PATH of the "
            f"folder holding it, {SHARED}")


def _root_text(cfg: Config) -> str:
    if cfg.data.root:
        return f"data.root={cfg.data.root!r}"
    return f"{str(_data_path(cfg))!r} (data.name={cfg.data.name!r} with no data.root)"


def _root_missing(cfg: Config, where: str) -> str:
    if not cfg.data.root:  # the dataset's own fallback folder (Debian's Fashion-MNIST)
        return (f"data.name={cfg.data.name!r} with no data.root is read from {str(_data_path(cfg))!r}, which does "
                f"not exist on {where}; install Debian's package dataset-fashion-mnist on every node, or set "
                f"data.root=PATH of a copy {SHARED}")
    return f"data.root={cfg.data.root!r} does not exist on {where}; point data.root at the dataset, {SHARED}"


def local_problems(cfg: Config, n_ranks: int) -> list[str]:
    """What this process can tell without launching MPI: the placement of the
    clients on ``n_ranks`` ranks, the data root, and the run directory's parent."""
    out = [_placement(cfg, n_ranks), _root_unset(cfg)]
    where = _data_path(cfg)
    if where is not None and not where.exists():
        out.append(_root_missing(cfg, socket.gethostname()))
    why = _unwritable(Path(cfg.run.out_dir))
    if why:
        out.append(f"run.out_dir={cfg.run.out_dir!r} cannot be written on {socket.gethostname()} ({why}); "
                   f"pick a run.out_dir you can write, {SHARED}")
    return [p for p in out if p]


def pmi_advice(library: str, plugin: str, n_ranks: int) -> str | None:
    """Why srun's MPI plugin ``plugin`` cannot start ``library``'s ranks, or None."""
    if plugin == "none" and n_ranks > 1:
        return (f"srun --mpi=none starts {n_ranks} separate 1-rank jobs of {library}, not one {n_ranks}-rank job; "
                f"{FIX_PMI}")
    m = re.search(r"Open MPI v(\d+)", library)
    if m and int(m.group(1)) >= 5 and not plugin.startswith("pmix"):
        return f"{library} starts only under PMIx, not srun --mpi={plugin}; set slurm.mpi: pmix (--mpi pmix)"
    return None


def srun_mpi_plugins() -> list[str] | None:
    """The plugins ``srun --mpi=list`` offers here (None: no srun, or no answer)."""
    exe = shutil.which("srun")
    if exe is None:
        return None
    try:
        res = subprocess.run([exe, "--mpi=list"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    # "MPI plugin types are...\n\tnone\n\tpmi2\n...specific pmix plugin versions available: pmix_v5"
    text = res.stdout + res.stderr
    names = re.findall(r"^\s+([A-Za-z0-9_.-]+)\s*$", text, re.M)
    names += [v.strip() for line in re.findall(r"versions available:(.*)$", text, re.M) for v in line.split(",")]
    return names or None


LIBRARY_PROBE = ("import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; import mpifl; "
                 "print(MPI.Get_library_version().splitlines()[0].strip())")


def launch_problems(python: str, mpi: str, n_ranks: int, workdir: Path) -> list[str]:
    """Whether ``srun --mpi=<mpi> <python> -m mpi4py -m mpifl.main`` from
    ``workdir`` can start, as far as the submitting node can tell: the interpreter
    imports mpi4py and mpifl there (without starting MPI), srun offers the plugin,
    and the plugin suits the MPI library."""
    fix = f"point slurm.python (--python) at a venv's python with mpifl installed, {SHARED}"
    try:
        res = subprocess.run([python, "-c", LIBRARY_PROBE], cwd=workdir, capture_output=True, text=True,
                             timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [f"the interpreter {python!r} cannot be run here ({getattr(e, 'strerror', None) or e}); {fix}"]
    if res.returncode:
        last = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
        return [f"the interpreter {python!r} cannot import mpi4py and mpifl from {workdir} ({last}); {fix}"]
    library = res.stdout.strip()
    out = []
    plugins = srun_mpi_plugins()
    if plugins is not None and mpi not in plugins:
        out.append(f"slurm.mpi={mpi!r} is not one of this cluster's srun MPI plugins ({', '.join(plugins)}); "
                   f"{FIX_PMI}")
    advice = pmi_advice(library, mpi, n_ranks)
    if advice:
        out.append(advice)
    return out


def launcher(env: dict[str, str]) -> tuple[str, int | None, int | None]:
    """(who started this process, its rank, how many tasks it started) as the
    launcher's environment says; MPI may disagree when the PMI does not match."""
    if "SLURM_STEP_NUM_TASKS" in env and "SLURM_PROCID" in env:  # srun sets no SLURM_MPI_TYPE for none
        return (f"srun --mpi={env.get('SLURM_MPI_TYPE', 'none')}", int(env["SLURM_PROCID"]),
                int(env["SLURM_STEP_NUM_TASKS"]))
    if "OMPI_COMM_WORLD_SIZE" in env:
        return "Open MPI's mpirun", int(env.get("OMPI_COMM_WORLD_RANK", 0)), int(env["OMPI_COMM_WORLD_SIZE"])
    if "PMI_SIZE" in env:
        return "mpiexec (PMI)", int(env.get("PMI_RANK", 0)), int(env["PMI_SIZE"])
    if "PMIX_RANK" in env:
        return "a PMIx launcher", int(env["PMIX_RANK"]), None
    return "no launcher", None, None


# --------------------------------------------------------------------------- with MPI


def _where(facts: list[dict], ranks: list[int]) -> str:
    hosts = sorted({facts[r]["host"] for r in ranks})
    return f"rank(s) {ranges(ranks)} ({', '.join(hosts[:3])}{', ...' if len(hosts) > 3 else ''})"


def _fingerprint(root: str) -> str | None:
    """Names and sizes two levels down, hashed: equal on ranks that see the same
    dataset, without reading it (None: the root does not exist; UNREADABLE)."""
    p = Path(root).expanduser()
    try:
        if not p.exists():
            return None
        if p.is_file():
            return f"{p.stat().st_size}"
        items = []
        for child in sorted(p.iterdir())[:200]:
            items.append(f"{child.name}:{child.stat().st_size if child.is_file() else 'd'}")
            if child.is_dir():
                items += [f"{child.name}/{g.name}:{g.stat().st_size if g.is_file() else 'd'}"
                          for g in sorted(child.iterdir())[:200]]
    except OSError:
        return UNREADABLE
    return hashlib.sha1("\n".join(items).encode()).hexdigest()


def _probe_run_dir(cfg: Config, mpi_comm) -> tuple[str | None, bool]:
    """Rank 0 writes a probe with a random token into run.out_dir (its parent
    folder, made if missing); every rank reads it through its own view of the
    same path. Returns (rank 0's failure or None, whether this rank read the token)."""
    out_dir = Path(cfg.run.out_dir).expanduser()
    probe, failed, token = None, None, None
    if mpi_comm.Get_rank() == 0:
        token = secrets.token_hex(8)
        probe = out_dir / f".mpifl-check-{socket.gethostname()}-{os.getpid()}-{token}"
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            probe.write_text(token)
        except OSError as e:
            failed, probe = f"{e.strerror}: {e.filename}", None
    failed, name, token = mpi_comm.bcast((failed, probe.name if probe else None, token))
    seen = False
    if name is not None:
        try:
            seen = (out_dir / name).read_text() == token
        except OSError:
            seen = False
    mpi_comm.Barrier()  # everyone has read it before it goes
    if probe is not None:
        probe.unlink(missing_ok=True)
    return failed, seen


def _facts(cfg: Config, mpi_comm, torch_s: float) -> dict:
    """What this rank sees (gathered, then judged on rank 0)."""
    import torch

    from mpifl.comm import cores_for_rank, node_local_rank, versions

    local, per_node = node_local_rank(mpi_comm)
    return {
        # SLURM's name for the node (several slurmd on one host have one hostname)
        "host": os.environ.get("SLURMD_NODENAME") or socket.gethostname(), "local": local, "per_node": per_node,
        "cpus": os.cpu_count() or 1, "cores": cores_for_rank(mpi_comm),
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "env": {k: v for k, v in os.environ.items() if k in LAUNCHER_VARS or k.startswith("PMIX_SERVER_URI")},
        "versions": versions(), "torch_s": torch_s,
        "data": _fingerprint(str(_data_path(cfg))) if _data_path(cfg) is not None else "",
        "fused": _fused_conv(cfg),
    }


def _fused_wanted(cfg: Config) -> bool:
    """Whether the run may take mpifl's fused conv kernel (mpifl.train.fused): a conv
    net, and the run asks for it (on a GPU its layers are torch's anyway; the
    check builds the kernel on every rank regardless, as a CPU run would)."""
    from mpifl.models import IMAGE_MODELS
    from mpifl.train import fused

    return cfg.model.name in IMAGE_MODELS and fused.asked(cfg.train.fused_conv, cfg.train.batched, "cpu")


def _fused_conv(cfg: Config) -> str | None:
    """Why the fused conv kernel does not build on this rank, or None where it builds
    (then cached for the run) or the run would not take it."""
    if not _fused_wanted(cfg):
        return None
    from mpifl.train import fused

    built = fused._build()
    return built if isinstance(built, str) else None


def _fused_failed(facts: list[dict]) -> list[int]:
    """The ranks on which the fused conv kernel did not build."""
    return [r for r, f in enumerate(facts) if f["fused"]]


def _device(cfg: Config, mpi_comm, facts: list[dict]) -> tuple[str, str | None]:
    """(this rank's device, a problem) via comm.pick_device, which is collective on
    GPU ranks: called only once every rank is known to agree on having GPUs."""
    from mpifl.comm import pick_device

    with_gpu = [r for r, f in enumerate(facts) if f["gpus"]]
    if with_gpu and len(with_gpu) < len(facts) and cfg.run.device != "cpu":
        without = [r for r in range(len(facts)) if r not in with_gpu]
        return "?", (f"{_where(facts, without)} see no GPU while {_where(facts, with_gpu)} do; give every rank "
                     f"a GPU (--gpus-per-task, slurm.gpus_per_task) or set run.device=cpu")
    try:
        return str(pick_device(cfg.run.device, mpi_comm)), None
    except ConfigError as e:
        return "?", str(e)


def _pmi_mismatch(size: int) -> str | None:
    """The launcher started more tasks than MPI sees: each task is a 1-rank world."""
    who, _, l_size = launcher(dict(os.environ))
    if l_size is None or l_size == size:
        return None
    fix = FIX_PMI if who.startswith("srun") else (
        f"launch with the mpiexec of the MPI library mpi4py uses ({Path(sys.executable).parent / 'mpiexec'} "
        f"in a venv with the mpich wheel, else the one your site's MPI module provides)")
    return (f"{who} started {l_size} tasks but MPI sees {size} rank(s) in each: the launcher's PMI does not "
            f"match {_library()}; {fix}")


def run(path: str | None, overrides: list[str], mpi_comm, torch_s: float = 0.0) -> tuple[list[str], list[str]]:
    """The whole check on every rank of ``mpi_comm`` (collective). Returns the
    report's lines and the problems, rank 0's, on every rank."""
    from mpifl.comm import exchange_timing, node_of_ranks

    mismatch = _pmi_mismatch(mpi_comm.Get_size())
    problems = [mismatch] if mismatch else []
    lines = [f"mpifl.check: {path or '(defaults)'} {' '.join(overrides)}".rstrip()]
    try:
        cfg, err = config_mod.load(path, overrides, n_ranks=1), None
    except ConfigError as e:
        cfg, err = None, str(e)
    errs = mpi_comm.allgather((err, socket.gethostname()))
    bad = [r for r, (e, _) in enumerate(errs) if e]
    if bad:
        problems.append(f"rank(s) {ranges(bad)} ({errs[bad[0]][1]}): {errs[bad[0]][0]}")
        return mpi_comm.bcast((lines, problems))

    facts = mpi_comm.allgather(_facts(cfg, mpi_comm, torch_s))
    device, dev_problem = _device(cfg, mpi_comm, facts)
    seen = {"devices": mpi_comm.allgather(device), "nodes": node_of_ranks(mpi_comm).tolist(),
            "memory": mpi_comm.allgather(_memory(cfg, mpi_comm, facts, device))}
    out_failed, probe_seen = _probe_run_dir(cfg, mpi_comm)
    seen.update(probe=mpi_comm.allgather(probe_seen), out_failed=out_failed, timing=exchange_timing(mpi_comm))
    lines += _report(cfg, facts, seen)
    lines += _provenance(cfg, mpi_comm, seen["devices"][mpi_comm.Get_rank()])
    problems += [p for p in (_placement(cfg, len(facts)), _root_unset(cfg), dev_problem) if p]
    problems += list(dict.fromkeys(p for m in seen["memory"] for p in m[1:] if p))
    problems += _judge(cfg, facts, seen, mismatch=mismatch is not None)
    if not problems:  # the rest of what mpifl.main refuses before round 0 (one problem is enough to fix first)
        problems += [p for p in [_as_main(cfg, mpi_comm)] if p]
    return mpi_comm.bcast((lines, problems))  # rank 0's words: the paths as rank 0 names them


def _as_main(cfg: Config, mpi_comm) -> str | None:
    """What ``mpifl.main`` refuses before its first round besides what the parts
    above look at, found by doing what it does (collective): the config against
    this rank count, the data partitioned and read (the clusters the labels allow,
    the clients a cluster needs), the model built on the data, and the run
    directory's checkpoint (another experiment's, more rounds done than asked)."""
    from mpifl import models
    from mpifl.comm import Comm, agree
    from mpifl.config.validate import validate
    from mpifl.data import build as build_data
    from mpifl.run import resume

    def dry() -> None:
        validate(cfg, mpi_comm.Get_size())
        comm = Comm(cfg.data.n_clients, mpi_comm)
        data = build_data(cfg.data, cfg.run.seed, comm.local_ids)
        models.build(cfg.model, data.in_shape, data.n_classes, cfg.run.seed)
        if mpi_comm.Get_rank() == 0:
            resume.find_checkpoint(cfg)

    try:
        agree(mpi_comm, dry)
    except ConfigError as e:
        return str(e)
    return None


def _memory(cfg: Config, mpi_comm, facts: list[dict], device: str) -> tuple[str, str | None, str | None]:
    """This rank's memory estimate against what it has, and the problems the run
    would refuse to start with: memory, run.threads past the CPUs (mpifl.run.memory)."""
    import torch

    from mpifl.run import memory as sizes

    rank = mpi_comm.Get_rank()
    dev = torch.device("cpu" if device == "?" else device)
    try:
        line, problem = sizes.assess(cfg, mpi_comm.Get_size(), rank, dev, facts[rank]["local"],
                                     facts[rank]["per_node"])
    except ConfigError as e:  # the model does not take the data: one problem line, as the run would stop
        line, problem = "not estimated: the config's model does not build on its data (see problems)", str(e)
    try:
        sizes.check_threads(cfg.run.threads)
        threads = None
    except ConfigError as e:
        threads = f"rank {rank} ({facts[rank]['host']}): {e}"
    return line, problem, threads


def _report(cfg: Config, facts: list[dict], seen: dict) -> list[str]:
    from mpifl.comm import Placement

    size, f0 = len(facts), facts[0]
    who = launcher(f0["env"])[0]
    pmi = " ".join(sorted({k for f in facts for k in f["env"]})) or "none"
    nodes = _nodes(facts, seen["nodes"])
    lines = [f"  launch     {who}, {size} rank(s) on {len(nodes)} node(s); PMI variables: {pmi}"]
    for name, rs in nodes.items():
        fh, local = facts[rs[0]], ranges(sorted(facts[r]["local"] for r in rs))
        lines.append(f"  node       {name}: rank(s) {ranges(rs)} (node-local {local}), {fh['cpus']} CPU(s), "
                     f"{fh['gpus']} GPU(s)")
        if len(rs) > fh["cpus"]:
            lines.append(f"  note       {name} runs {len(rs)} ranks on {fh['cpus']} CPU(s): they share cores; fine "
                         f"for tests, slow for real runs (fewer ranks per node, or more CPUs)")
    lines += _layout(cfg, facts, seen["devices"], nodes)
    counts = sorted({int(c) for c in Placement(cfg.data.n_clients, size).counts()})
    cores = sorted({f["cores"] for f in facts})
    threads = f"{cfg.run.threads}" if cfg.run.threads else f"{_span(cores)} (run.threads=0: the cores)"
    lines.append(f"  placement  {cfg.data.n_clients} clients on {size} rank(s): {_span(counts)} per rank; "
                 f"{_span(cores)} core(s) per rank, torch threads {threads}")
    lines.append(f"  memory     {seen['memory'][0][0]}")
    devices = seen["devices"]
    lines.append(f"  device     {', '.join(f'rank {r}: {d}' for r, d in enumerate(devices[:4]))}"
                 f"{', ...' if size > 4 else ''} (run.device={cfg.run.device})")
    lines.append(f"  run dir    {cfg.run_dir}: rank 0's probe in {Path(cfg.run.out_dir).expanduser().absolute()} "
                 f"read back by {sum(seen['probe'])} of {size} rank(s)")
    vs = f0["versions"]
    lines.append(f"  versions   python {vs['python']}, torch {vs['torch']}, mpi4py {vs['mpi4py']}, "
                 f"numpy {vs['numpy']}; {' '.join(vs['mpi'].split())}")
    slow = max(range(size), key=lambda r: facts[r]["torch_s"])
    lines.append(f"  import     torch took {facts[slow]['torch_s']:.1f} s (slowest: rank {slow}); every run pays "
                 f"this before round 1")
    t = seen["timing"]
    lines.append(f"  exchange   1 MiB: Allreduce {t['allreduce'] * 1e3:.2f} ms, Sendrecv ring step "
                 f"{t['sendrecv'] * 1e3:.2f} ms (median of 5, slowest rank)")
    failed = _fused_failed(facts)
    if not _fused_wanted(cfg):
        lines.append(f"  conv       torch's kernels (train.fused_conv={cfg.train.fused_conv}, "
                     f"train.batched={cfg.train.batched}, model.name={cfg.model.name})")
    elif failed:
        lines.append(f"  conv       the fused conv kernel does not build on {_where(facts, failed)} "
                     f"({facts[failed[0]]['fused']}): a run takes torch's kernels on every rank (other bits)")
    else:
        lines.append("  conv       the fused conv kernel builds on every rank (built now, cached for the run; "
                     "conv nets it fits, as cnn_dpfl, run on it)")
    if f0["data"] == "":
        lines.append(f"  data root  none used (data.name={cfg.data.name})")
    else:
        same = len({f["data"] for f in facts}) == 1 and f0["data"] not in (None, UNREADABLE)
        lines.append(f"  data root  {_data_path(cfg)}: {'the same listing on every rank' if same else 'see problems'}")
    return lines


def _provenance(cfg: Config, mpi_comm, device: str) -> list[str]:
    """What the run's log would record as its provenance (collective)."""
    from mpifl.comm import Comm
    from mpifl.run import provenance

    facts = provenance.collect(Comm(cfg.data.n_clients, mpi_comm), "cpu" if device == "?" else device, cfg.run_dir)
    return provenance.lines(facts) if facts is not None else []


def _nodes(facts: list[dict], node_of_rank: list[int]) -> dict[str, list[int]]:
    """{node's name: its ranks}, nodes as MPI groups them (MPI_COMM_TYPE_SHARED), in
    the order of their lowest rank; a host name that names several nodes (nodes
    simulated on one machine) gets the node's number."""
    groups: dict[int, list[int]] = {}
    for r, k in enumerate(node_of_rank):
        groups.setdefault(k, []).append(r)
    hosts = [facts[rs[0]]["host"] for rs in groups.values()]
    return {(h if hosts.count(h) == 1 else f"{h} (node {k})"): rs for h, (k, rs) in zip(hosts, groups.items())}


def _layout(cfg: Config, facts: list[dict], devices: list[str], nodes: dict[str, list[int]]) -> list[str]:
    """The layout line (ranks per node, devices per rank) and a warning for each
    uneven part of it: nodes with different numbers of ranks or GPUs, GPUs that
    some ranks share and others do not, GPUs no rank uses."""
    per_node = [len(rs) for rs in nodes.values()]
    gpus = [facts[rs[0]]["gpus"] for rs in nodes.values()]
    on_gpu = [d for d in devices if d.startswith("cuda")]
    if not on_gpu:
        per_rank = f"{devices[0]} (run.device={cfg.run.device})" if len(set(devices)) == 1 else ", ".join(
            sorted(set(devices)))
    else:
        sharing = set()
        for rs in nodes.values():
            used = [devices[r] for r in rs]
            sharing |= {used.count(d) for d in set(used)}
        per_rank = (f"1 GPU each, cuda:<node-local rank % {_span(sorted(set(gpus)))}>, "
                    f"{_span(sorted(sharing))} rank(s) per GPU")
    lines = [f"  layout     {len(nodes)} node(s), {_span(sorted(set(per_node)))} rank(s) per node; "
             f"devices per rank: {per_rank}"]
    warn = "  warning    "
    if len(set(per_node)) > 1:
        lines.append(f"{warn}uneven layout: {', '.join(map(str, per_node))} rank(s) on the {len(nodes)} nodes; "
                     f"the ranks of fuller nodes get fewer cores (threads are divided per node) and set the pace; "
                     f"ask for the same number on every node (srun -N {len(nodes)} --ntasks-per-node=R)")
    if len({g for g in gpus if g}) > 1:
        lines.append(f"{warn}the nodes see different numbers of GPUs ({', '.join(map(str, gpus))}); GPU = node-local "
                     f"rank % the node's GPUs, so ranks share GPUs on some nodes and not on others")
    if not on_gpu:
        return lines
    for name, rs in nodes.items():
        g = facts[rs[0]]["gpus"]
        load = [sum(devices[r] == f"cuda:{i}" for r in rs) for i in range(g)]
        if len(rs) < g:
            lines.append(f"{warn}{name}: {len(rs)} rank(s) use {len(rs)} of its {g} GPUs; launch {g} ranks on it "
                         f"(one per GPU), or ask for {len(rs)} GPU(s) (--gpus-per-task=1)")
        elif len(set(load)) > 1:
            lines.append(f"{warn}{name}: {len(rs)} ranks share its {g} GPUs unevenly ({', '.join(map(str, load))} "
                         f"rank(s) on cuda:0-{g - 1}); launch a multiple of {g} ranks per node")
        elif len(rs) > g:
            lines.append(f"  note       {name}: {len(rs)} ranks share {g} GPU(s) (GPU = node-local rank % {g}); "
                         f"fine for small models")
    return lines


def _judge(cfg: Config, facts: list[dict], seen: dict, mismatch: bool) -> list[str]:
    """The problems in what the ranks saw (run directory, data root, versions, PMI)."""
    f0, out = facts[0], []
    if seen["out_failed"]:
        out.append(f"run.out_dir={cfg.run.out_dir!r}: rank 0 ({f0['host']}) cannot write a probe there "
                   f"({seen['out_failed']}); pick a run.out_dir you can write, {SHARED}")
    elif not all(seen["probe"]):
        blind = [r for r, s in enumerate(seen["probe"]) if not s]
        out.append(f"run.out_dir={cfg.run.out_dir!r} is not the same folder on every rank: {_where(facts, blind)} "
                   f"do not see the file rank 0 wrote there; put run.out_dir {SHARED} (not /tmp or a local disk)")
    missing = [r for r, f in enumerate(facts) if f["data"] is None]
    if missing:
        out.append(_root_missing(cfg, _where(facts, missing)))
    locked = [r for r, f in enumerate(facts) if f["data"] == UNREADABLE]
    if locked:
        out.append(f"{_root_text(cfg)} cannot be listed on {_where(facts, locked)}; give your user read "
                   f"access there, or point data.root at a copy you can read")
    differ = [r for r, f in enumerate(facts) if f["data"] not in (None, UNREADABLE, f0["data"])]
    if differ and f0["data"] not in (None, UNREADABLE):
        out.append(f"{_root_text(cfg)} holds other files on {_where(facts, differ)} than on rank 0 "
                   f"({f0['host']}); use one copy {SHARED}")
    vs = f0["versions"]
    for key in ("python", "torch", "mpi4py", "mpi", "numpy"):
        other = [r for r, f in enumerate(facts) if f["versions"][key] != vs[key]]
        if other:
            out.append(f"{key} differs across ranks: {vs[key]} on rank 0, {facts[other[0]]['versions'][key]} on "
                       f"{_where(facts, other)}; run every rank from one environment {SHARED}")
    failed = _fused_failed(facts)
    if failed and cfg.train.fused_conv == "on":
        out.append(f"train.fused_conv=on but the fused conv kernel does not build on {_where(facts, failed)} "
                   f"({facts[failed[0]]['fused']}); install a C++ compiler and ninja there, or set "
                   f"train.fused_conv=auto (torch's kernels where it does not build)")
    plugin = f0["env"].get("SLURM_MPI_TYPE")
    advice = pmi_advice(vs["mpi"], plugin, len(facts)) if plugin and not mismatch else None
    return out + [advice] * bool(advice)


def _span(values: list[int]) -> str:
    return f"{values[0]}" if len(values) == 1 else f"{values[0]}-{values[-1]}"


def _library() -> str:
    from mpifl.comm import versions

    return " ".join(versions()["mpi"].split())


def main(argv: list[str] | None = None) -> int:
    """Check on every rank; rank 0 prints. Returns 0, 1 when there are problems, 2
    when the config itself is refused."""
    path, overrides = parse(sys.argv[1:] if argv is None else argv, prog="python -m mpifl.check",
                            description=__doc__.splitlines()[0], epilog="")
    t0 = time.perf_counter()
    import torch  # noqa: F401 - timed: the cost every rank pays before round 1

    torch_s = time.perf_counter() - t0
    from mpifl.comm import report_crash, world

    mpi = world()
    try:
        config_mod.load(path, overrides, n_ranks=1)
        err = None
    except ConfigError as e:
        err = str(e)
    errs = mpi.allgather(err)
    if all(errs):  # no rank can read it: a user error like any entry point's, one line, exit 2
        if mpi.Get_rank() == 0:
            print(f"mpifl.check: error: {errs[0]}", file=sys.stderr, flush=True)
        return 2
    try:  # some ranks only: a problem of the ranks, named by run()
        lines, problems = run(path, overrides, mpi, torch_s)
    except BaseException as e:  # noqa: BLE001 - a crash on one rank must not hang the others
        report_crash(mpi, e)
        return PROBLEMS
    # when the PMI does not match, every task is rank 0 of its own world: the
    # launcher's rank 0 alone speaks for them
    _, l_rank, _ = launcher(dict(os.environ))
    if mpi.Get_rank() == 0 and l_rank in (None, 0):
        print("\n".join(lines), flush=True)
        for p in problems:
            print(f"mpifl.check: problem: {p}", file=sys.stderr, flush=True)
        print(f"mpifl.check: {len(problems)} problem(s)" if problems else "mpifl.check: ok, no problems", flush=True)
    return PROBLEMS if problems else 0


if __name__ == "__main__":
    code = main()
    if code:  # past the interpreter, as mpifl.main: no MPI_Abort lines from `python -m mpi4py`
        from mpifl.comm import exit_all

        exit_all(code)
