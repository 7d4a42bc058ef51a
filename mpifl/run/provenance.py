"""Where a number came from: the code, the packages, the CPU kernels, the
devices and the nodes that made a run, and the sweep point it belongs to.

One dict, :func:`collect`, is stored as the JSON root attribute ``provenance`` of
every ``run.h5`` (:mod:`mpifl.run.runtime`), printed by ``python -m mpifl.check``,
summed up per table by ``python -m mpifl.analyze`` and compared by
``python -m mpifl.reproduce``. Its keys:

- ``mpifl``: ``{"commit", "dirty", "version"}``: the git commit of the checkout
  mpifl is imported from and whether it differs from it: a tracked file changed,
  or a file git does not track (nor ignores) inside the package, ``mpifl/``, which
  a run may import (a copied algorithm module) (``commit``
  None where mpifl is not a git checkout, an installed copy: ``version`` then
  says which);
- ``versions``: :func:`mpifl.comm.versions` (python, torch, mpi4py, MPI, numpy);
- ``cpu_capability``: the vector kernels torch dispatches to
  (``torch.backends.cpu.get_cpu_capability()``: AVX2, AVX512, ...), the first
  cause of float differences between two machines with the same versions;
- ``cpu``: the CPU model (``/proc/cpuinfo``); ``blas``: the BLAS torch was built with;
- ``device``: where the run computed (``cpu``, ``cuda:0``); ``gpu``: ``{"name",
  "driver", "cuda"}`` where that is a GPU, else None;
- ``train``: what trains the clients besides the code and the CPU, each of which
  can change a run's bits on the same commit and CPU (:func:`training`):
  ``{"path", "threads", "conv_kernel"}`` (``path``: ``batched`` or
  ``per_client``; ``threads``: a rank's; ``conv_kernel``: ``fused`` or ``torch``,
  None where no grouped convolution trains), with the fused kernel's
  ``conv_flags`` and ``compiler`` where it trains, and ``conv_kernel_times``
  (``{"fused_s", "torch_s"}``) where ``train.fused_conv=auto`` timed the two to
  choose (torch's where the fused one is over 1.1x slower on this CPU);
- ``hosts``: every node's host name, in the order of its lowest rank;
- ``sweep``: ``{"name", "point", "values"}`` for a point of a sweep
  (``<sweep>/runs/<point>/`` beside ``<sweep>/sweep.yaml``, as
  :mod:`mpifl.sweep.cli` lays them out), else None.

Logs written before this module have no ``provenance``; :func:`read` gives them
an empty dict and :func:`brief` calls every fact of theirs ``unknown``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

from mpifl.paths import REPO

UNKNOWN = "unknown"
PACKAGE = "mpifl"  # the folder of the checkout whose untracked files count as changes (ignored ones do not)
GIT_TIMEOUT_S = 5.0  # a checkout on a slow shared file system must not hold up round 0
# the facts that decide whether a re-run can be bitwise equal: what reproduce and analyze compare
CODE_KEYS = ("commit", "dirty")
MACHINE_KEYS = ("cpu_capability", "device")


def _git(*args: str) -> str | None:
    try:
        res = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                             timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):  # no git, or a hung file system
        return None
    return res.stdout.strip() if res.returncode == 0 else None


@cache
def code() -> dict[str, Any]:
    """mpifl's commit and whether the checkout differs from it (tracked files);
    commit None where mpifl does not run from a git checkout."""
    from mpifl import __version__

    commit = _git("rev-parse", "HEAD") if (REPO / ".git").exists() else None
    dirty = None
    if commit is not None:
        status = _git("status", "--porcelain", "--untracked-files=no")
        # a file git does not track inside the package (a copied algorithm module) runs too
        package = _git("status", "--porcelain", "--untracked-files=all", "--", PACKAGE)
        if status is not None and package is not None:
            dirty = bool(status) or any(line.startswith("??") for line in package.splitlines())
    return {"commit": commit, "dirty": dirty, "version": __version__}


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux
        import platform

        return platform.processor() or UNKNOWN
    m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return m.group(1).strip() if m else UNKNOWN


def blas() -> str:
    """The BLAS of torch's build, with the library's own version line where torch
    names it (``mkl (Intel(R) oneAPI Math Kernel Library Version 2024.2 ...)``)."""
    import torch

    text = torch.__config__.show()
    m = re.search(r"BLAS_INFO=(\w+)", text)
    name = m.group(1) if m else UNKNOWN
    lib = next((line.strip(" -") for line in text.splitlines()
                if "Math Kernel Library" in line or "OpenBLAS" in line), "")
    return f"{name} ({lib})" if lib else name


def _driver() -> str | None:
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"],
                             capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip().splitlines()[0] if res.returncode == 0 and res.stdout.strip() else None


def gpu(device: str) -> dict[str, Any] | None:
    """Name, driver and CUDA version of ``device`` where it is a GPU, else None."""
    if not device.startswith("cuda"):
        return None
    import torch

    index = torch.device(device).index or 0
    try:
        name = torch.cuda.get_device_name(index)
    except Exception:  # noqa: BLE001 - a GPU torch cannot query (a broken driver): named unknown, the run goes on
        name = UNKNOWN
    return {"name": name, "driver": _driver(), "cuda": torch.version.cuda}


def machine(device: str = "cpu") -> dict[str, Any]:
    """This process's facts besides the code and the nodes."""
    import torch

    from mpifl.comm import versions

    return {"versions": versions(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu": cpu_model(), "blas": blas(), "device": device, "gpu": gpu(device)}


def host() -> str:
    # SLURM's name for the node (several slurmd on one host have one hostname), as mpifl.check says it
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def sweep_point(run_dir: str | Path) -> dict[str, Any] | None:
    """The sweep and point ``run_dir`` is, from ``<sweep>/sweep.yaml`` (None: not a sweep's point)."""
    from mpifl.errors import ConfigError
    from mpifl.yamlio import read_yaml

    point = Path(run_dir).absolute()
    spec = point.parent.parent / "sweep.yaml"
    if point.parent.name != "runs" or not spec.is_file():
        return None
    try:
        raw = read_yaml(spec, f"sweep record {str(spec)!r}") or {}
    except ConfigError:  # a damaged record names no point; the run itself goes on
        return None
    for p in raw.get("points") or [] if isinstance(raw, dict) else []:
        if isinstance(p, dict) and str(p.get("name")) == point.name:
            return {"name": str(raw.get("name", point.parent.parent.name)), "point": point.name,
                    "values": p.get("values") or {}}
    return None


def training(conv_kernel: str | None, threads: int, batched: bool,
             conv_times: tuple[float, float] | None = None) -> dict[str, Any]:
    """The ``train`` facts of a run whose clients train on ``conv_kernel`` (what the
    log's ``conv_kernel`` attribute names), ``threads`` a rank, batched or not;
    ``conv_times``: ``train.fused_conv=auto``'s timing of the fused and torch's
    kernels (s, summed over ranks), which chose ``conv_kernel``, where it ran."""
    out: dict[str, Any] = {"path": "batched" if batched else "per_client", "threads": threads,
                           "conv_kernel": conv_kernel}
    if conv_times is not None:
        out["conv_kernel_times"] = {"fused_s": conv_times[0], "torch_s": conv_times[1]}
    if conv_kernel == "fused":
        from mpifl.train import fused

        out.update(conv_flags=" ".join(fused.FLAGS), compiler=fused.compiler())
    return out


def collect(comm: Any, device: str, run_dir: str | Path | None = None,
            train: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Every fact above, on rank 0 (None elsewhere); ``train``: :func:`training`'s.
    Collective over ``comm`` (a :class:`mpifl.comm.Comm`): the host names are
    gathered; git runs on rank 0 only."""
    hosts = comm.allgather(host())
    if comm.rank != 0:
        return None
    return {"mpifl": code(), **machine(device), "train": train, "hosts": list(dict.fromkeys(hosts)),
            "sweep": sweep_point(run_dir) if run_dir is not None else None}


def resumed(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A resumed run's provenance: this start's, with the earlier starts' kept
    under ``earlier`` where they ran other code or on another machine."""
    earlier = list(old.get("earlier", []))
    old = {k: v for k, v in old.items() if k != "earlier"}
    if old and brief(old) != brief(new):
        earlier.append(old)
    return {**new, "earlier": earlier} if earlier else new


def read(attrs: dict[str, Any]) -> dict[str, Any]:
    """The provenance of a log's root attributes; {} for a log written before it existed."""
    raw = attrs.get("provenance")
    if raw is None:
        return {}
    try:
        value = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def commit_text(p: dict[str, Any]) -> str:
    """``2ccba5b``, ``2ccba5b+dirty``, ``0.1.0 (no checkout)`` or ``unknown``."""
    m = p.get("mpifl") or {}
    if m.get("commit"):
        return m["commit"][:7] + ("+dirty" if m.get("dirty") else "")
    return f"{m['version']} (no checkout)" if m.get("version") else UNKNOWN


def train_text(p: dict[str, Any]) -> str:
    """``batched, fused conv (c++ 12.2.0; -O3 ...), 2 threads``, ``per_client, 1 thread`` or ``unknown``."""
    t = p.get("train")
    if not isinstance(t, dict):
        return UNKNOWN
    conv = t.get("conv_kernel")
    kernel = "" if conv is None else f", {conv} conv" + (
        f" ({t.get('compiler') or UNKNOWN}; {t.get('conv_flags') or UNKNOWN})" if conv == "fused" else "")
    n = t.get("threads")
    return f"{t.get('path') or UNKNOWN}{kernel}, {n} thread{'' if n == 1 else 's'}"


def brief(p: dict[str, Any]) -> dict[str, str]:
    """The facts a table is summed up by, as text: commit, CPU capability, device
    (a GPU by its name), the torch version and what trained (:func:`train_text`)."""
    dev = p.get("device") or UNKNOWN
    g = p.get("gpu")
    if g:
        dev = f"{dev} ({g.get('name', UNKNOWN)})"
    return {"commit": commit_text(p), "cpu_capability": str(p.get("cpu_capability") or UNKNOWN),
            "device": dev, "torch": str((p.get("versions") or {}).get("torch") or UNKNOWN), "train": train_text(p)}


def lines(p: dict[str, Any]) -> list[str]:
    """The facts as ``mpifl.check`` prints them, one ``name  value`` line each."""
    m = p.get("mpifl") or {}
    g = p.get("gpu")
    out = [f"  code       mpifl {commit_text(p)}" + (f" (version {m['version']})" if m.get("version") else ""),
           f"  cpu        {p.get('cpu', UNKNOWN)}; torch kernels {p.get('cpu_capability', UNKNOWN)}; "
           f"BLAS {p.get('blas', UNKNOWN)}"]
    if g:
        out.append(f"  gpu        {g.get('name')} (driver {g.get('driver') or UNKNOWN}, CUDA {g.get('cuda')})")
    out.append(f"  hosts      {', '.join(p.get('hosts') or [UNKNOWN])}")
    if p.get("train"):
        out.append(f"  training   {train_text(p)}")
    s = p.get("sweep")
    if s:
        out.append(f"  sweep      {s['name']}, point {s['point']}")
    return out


def _counted(values: list[str]) -> str:
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return ", ".join(f"{v} ({n})" for v, n in counts.items())


TABLE_FACTS = (("commit", "commit", "commits"), ("cpu_capability", "CPU capability", "CPU capabilities"),
               ("device", "device", "devices"), ("train", "training", "trainings"))
# facts logs hold only since they were recorded: left out of a table none of whose runs has them
LATER_FACTS = ("train",)


def table_line(provs: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """What a table's runs are made of, one line (each fact's values with their
    numbers of runs), and a warning for each fact on which the runs differ (``<table>
    mixes`` + it): a
    table mixing commits, CPU kernels, devices or trainings (conv kernel, threads,
    path, compiler flags) compares float noise along with the methods. Facts of
    logs without provenance read ``unknown``."""
    briefs = [brief(p) for p in provs]
    parts, warnings = [], []
    for key, one, many in TABLE_FACTS:
        values = [b[key] for b in briefs]
        if key in LATER_FACTS and set(values) == {UNKNOWN}:
            continue
        parts.append(f"{one if len(set(values)) == 1 else many} {_counted(values)}")
        if len(set(values)) > 1:
            warnings.append(f"runs of {len(set(values))} {many} ({_counted(values)}): its differences hold "
                            f"the float differences between them along with the methods'")
    return f"provenance: {'; '.join(parts)} (runs in brackets)", warnings
