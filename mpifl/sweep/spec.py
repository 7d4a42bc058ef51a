"""What a sweep is, as loaded from its file: its points (one run config each),
its SLURM options and the checks that keep them safe to write into an sbatch
script. The parts of ``mpifl.sweep`` (its status, drivers and point selection)
name these types, so they live apart from the commands that use them."""

from __future__ import annotations

import copy
import itertools
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from mpifl import config as config_mod
from mpifl.errors import ConfigError, check, shorten
from mpifl.paths import beneath
from mpifl.yamlio import read_yaml

if TYPE_CHECKING:  # building Config imports every algorithm: only when points are loaded
    from mpifl.config import Config


@dataclass
class SlurmOptions:
    ntasks: int = 1  # MPI ranks per run (srun tasks)
    cpus_per_task: int = 1  # also OMP_NUM_THREADS and torch threads per rank
    gpus_per_task: int = 0  # 0: no GPU request (the run picks CPU)
    mpi: str = "pmi2"  # srun --mpi plugin that starts the MPI library's ranks
    time: str = "01:00:00"  # per run; requeued ahead of it (signal_s)
    signal_s: int = 300  # seconds before the time limit to requeue
    partition: str = ""
    account: str = ""
    mem: str = ""  # e.g. 16G; empty: the cluster's default
    max_parallel: int = 0  # array throttle (%N); 0 = no limit
    python: str = ""  # interpreter on the compute nodes; empty: this one
    sbatch: list[str] = field(default_factory=list)  # extra "#SBATCH" arguments, e.g. ["--qos=long"]
    srun: list[str] = field(default_factory=list)  # extra srun arguments
    setup: list[str] = field(default_factory=list)  # shell lines before the launch, e.g. module load
    allow_local_paths: bool = False  # a one-node cluster: workdir, python, out_dir may be under /tmp

    @classmethod
    def from_dict(cls, raw: Any, where: str = "slurm") -> SlurmOptions:
        """Options from a mapping, each value coerced as config keys are
        (``mpifl.config.build``), then the ranges and script-safety checks."""
        out = config_mod.build(cls, {} if raw is None else raw, where)
        for f in fields(cls):
            v = getattr(out, f.name)
            if isinstance(v, int) and not isinstance(v, bool):
                check(v >= 0, f"{where}.{f.name}", v, "must be an integer >= 0")
        check(out.ntasks >= 1, f"{where}.ntasks", out.ntasks, "must be >= 1")
        check(out.cpus_per_task >= 1, f"{where}.cpus_per_task", out.cpus_per_task, "must be >= 1")
        check(re.fullmatch(r"[A-Za-z0-9_.-]+", out.mpi) is not None, f"{where}.mpi", out.mpi,
              "an srun --mpi plugin name, e.g. pmi2, pmix")
        check_script_values(out, where)
        return out


# What may reach a #SBATCH line unquoted. SLURM's own formats, narrowed to
# characters with no meaning to sbatch's or bash's parsing.
SLURM_FORMATS = {
    "time": (r"(UNLIMITED|INFINITE|infinite|unlimited|([0-9]+-)?[0-9]+(:[0-9]+){0,2})",
             "a SLURM time limit such as 01:00:00, 2-00:00:00 or 90"),
    "partition": (r"[A-Za-z0-9_.,-]*", "partition names (letters, digits, _ . , -)"),
    "account": (r"[A-Za-z0-9_.-]*", "an account name (letters, digits, _ . -)"),
    "mem": (r"([0-9]+[KMGTkmgt]?)?", "an amount such as 16G or 4000M"),
}


def no_control(key: str, value: str) -> None:
    if config_mod.CONTROL.search(value):
        raise ConfigError(f"{key}={shorten(repr(value))} is not allowed; "
                          f"no newlines or other control characters (it goes into an sbatch script)")


def check_script_values(opts: SlurmOptions, where: str = "slurm") -> None:
    """Every option that reaches an sbatch script: no control character (a newline
    would start a shell line), and the values written unquoted on #SBATCH lines in
    SLURM's own formats. ``setup`` lines are shell the user wrote, run as written."""
    for f in fields(opts):
        v = getattr(opts, f.name)
        for i, x in enumerate(v if isinstance(v, list) else [v]):
            if isinstance(x, str):
                no_control(f"{where}.{f.name}" + (f"[{i}]" if isinstance(v, list) else ""), x)
        if f.name in SLURM_FORMATS and not re.fullmatch(SLURM_FORMATS[f.name][0], str(v)):
            raise ConfigError(f"{where}.{f.name}={shorten(repr(v))} is not allowed; "
                              f"{SLURM_FORMATS[f.name][1]}")


@dataclass
class Point:
    index: int
    name: str  # the run name, also the directory under <sweep>/runs
    values: dict[str, Any]  # grid key -> value of this point
    config: Config


@dataclass
class Sweep:
    name: str
    path: Path  # the sweep file
    base: Path | None
    root: Path  # the sweep directory
    set: dict[str, Any]
    grid: dict[str, list] | list[dict[str, list]]  # one grid, or a list whose union is swept
    slurm: SlurmOptions
    points: list[Point]
    selected: list[Point] | None = None  # --only / --points (mpifl.sweep.select); None: every point

    runs_file = beneath("runs.txt")
    script = beneath("array.sbatch")
    log_dir = beneath("logs")

    def chosen(self) -> list[Point]:
        """The points this command acts on: the selection, else every point."""
        return self.points if self.selected is None else self.selected


# --------------------------------------------------------------------------- loading

RESERVED = ("run.name", "run.out_dir")  # the sweep owns where each point runs
BASE = "base"  # the grid key that varies the config file itself
_ABSENT = object()  # a key of another grid in a list of grids


def _mapping(raw: Any, key: str) -> dict:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{key} must be a mapping of section.key: value, got {raw!r}")
    return raw


def _slug(value: Any) -> str:
    if value is None:  # a grid's ~: the base's own value
        return "base"
    text = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
    text = text.strip("[]{}'\" ")  # a minus sign must survive: -1 is not 1
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text) or "-"


def _label_parts(key: str) -> list[str]:
    """``algorithm.name`` reads better as ``algorithm``."""
    parts = key.split(".")
    return parts[:-1] if parts[-1] == "name" and len(parts) > 1 else parts


def _point_names(keys: list[str], combos: list[tuple]) -> list[str]:
    """``007_budget-0.2N_seed-1``: the shortest key suffixes that stay distinct
    (``python -m mpifl.main`` tells a config path from an override by what it
    is, so a sweep or out_dir named ``lr=0.1`` works too)."""
    labels = []
    for key in keys:
        parts = _label_parts(key)
        for n in range(1, len(parts) + 1):
            label = ".".join(parts[-n:])
            if sum(_label_parts(k)[-n:] == parts[-n:] for k in keys) == 1:
                break
        labels.append(label)
    width = max(3, len(str(len(combos) - 1)))
    slug = [(lambda v: _slug(Path(str(v)).stem)) if k == BASE else _slug for k in keys]
    return [f"{i:0{width}d}" + "".join(f"_{lab}-{f(v)}" for lab, f, v in zip(labels, slug, combo) if v is not _ABSENT)
            for i, combo in enumerate(combos)]


def _read_base(sweep: Path, value: Any, where: str) -> tuple[Path, dict]:
    """A base config file (relative to the sweep file) and its sections."""
    base = (sweep.parent / str(value)).resolve()
    return base, _read_mapping(base, f"{where}={str(value)!r}", f"{where}={value!r} is not allowed; no such file "
                               f"{str(base)!r}", f"{where}={value!r} must hold a mapping of sections")


def _read_mapping(path: Path, what: str, missing: str, not_mapping: str) -> dict:
    """A YAML file's mapping (empty for an empty file); ``missing`` and ``not_mapping``: the errors."""
    if not path.is_file():
        raise ConfigError(missing)
    raw = read_yaml(path, what) or {}
    if not isinstance(raw, dict):
        raise ConfigError(not_mapping)
    return raw


def load(path: str | Path, out_dir: str | None = None, slurm_overrides: dict | None = None,
         n_ranks: int | None = None, overrides: list[str] = ()) -> Sweep:
    """Read a sweep file and resolve and validate every point (nothing is written).
    ``overrides``: ``section.key=value`` for every point (``--set``), after the
    file's ``set``."""
    path = Path(path)
    where = f"sweep file {str(path)!r}"
    spec = _read_mapping(path, where, f"{where} not found", f"{where} must hold a mapping")
    allowed = ("name", "base", "out_dir", "set", "grid", "slurm")
    unknown = sorted(set(spec) - set(allowed))
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} in sweep file {str(path)!r}; valid keys: {', '.join(allowed)}")
    name = spec.get("name", path.stem)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.+=-]+", name) or name in (".", ".."):
        raise ConfigError(f"name={name!r} is not allowed; a plain directory name (letters, digits, _ . + = -)")
    base = None
    raw: dict = {}
    if spec.get("base") is not None:
        base, raw = _read_base(path, spec["base"], "base")
    sets = _mapping(spec.get("set"), "set")
    # A list of grids is their union: a table whose rows vary different keys (pFedLIA's
    # p2p row beside the baselines) without the product of every key with every other.
    grids = spec.get("grid")
    grids = [_mapping(g, f"grid[{i}]") for i, g in enumerate(grids)] if isinstance(grids, list) \
        else [_mapping(grids, "grid")]
    if not grids:
        raise ConfigError("grid=[] is not allowed; a mapping of lists, or a list of such mappings")
    for grid in grids:
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise ConfigError(f"grid.{key}={values!r} is not allowed; must be a non-empty list of values")
    sets = {**sets, **command_line_set(overrides, grids)}
    for key in [*sets, *(k for g in grids for k in g)]:
        if key in RESERVED:
            raise ConfigError(f"{key} is not allowed in a sweep; the sweep sets it for every point")
    bases = {}
    base_values = [v for g in grids for v in g.get(BASE, [])]
    if base_values:
        if base is not None:
            raise ConfigError(f"grid.base and base={spec['base']!r} are not allowed together; keep one of them")
        if not all(BASE in g for g in grids):
            raise ConfigError("grid.base must be in every grid of the list, or in none")
        bases = {str(v): _read_base(path, v, "grid.base")[1] for v in base_values}
        raw = bases[str(base_values[0])]
    slurm_raw = dict(_mapping(spec.get("slurm"), "slurm"))
    slurm_raw.update(slurm_overrides or {})
    slurm = SlurmOptions.from_dict(slurm_raw)
    if out_dir is None:
        out_dir = spec.get("out_dir") or (raw.get("run") or {}).get("out_dir") or "results"
    root = (Path(str(out_dir)) / name).resolve()

    keys = list(dict.fromkeys(k for g in grids for k in g))
    combos = [tuple(dict(zip(g, c)).get(k, _ABSENT) for k in keys)
              for g in grids for c in itertools.product(*g.values())]
    points = []
    for i, (pname, combo) in enumerate(zip(_point_names(keys, combos), combos)):
        values = {k: v for k, v in zip(keys, combo) if v is not _ABSENT}
        point_raw = copy.deepcopy(bases[str(values[BASE])] if BASE in values else raw)
        for key, value in sets.items():
            config_mod.assign(point_raw, key, copy.deepcopy(value), "set")
        for key, value in values.items():
            if key != BASE and value is not None:
                config_mod.assign(point_raw, key, copy.deepcopy(value), "grid")
        config_mod.assign(point_raw, "run.name", pname, "sweep")
        config_mod.assign(point_raw, "run.out_dir", str(root / "runs"), "sweep")
        try:
            cfg = config_mod.from_dict(point_raw, n_ranks=n_ranks or slurm.ntasks)
        except ConfigError as e:
            raise ConfigError(f"point {pname}: {e}") from None
        points.append(Point(i, pname, values, cfg))
    return Sweep(name, path.resolve(), base, root, sets, grids[0] if len(grids) == 1 else grids, slurm, points)


def command_line_set(overrides: list[str], grids: list[dict]) -> dict[str, Any]:
    """``--set section.key=value`` items as a ``set:`` mapping. A key the grid varies
    is refused: it would make the points alike."""
    out: dict[str, Any] = {}
    for item in overrides:
        key, value = config_mod.override(item)
        if any(key in g for g in grids):
            raise ConfigError(f"--set {shorten(repr(item))} is not allowed; grid.{key} varies it between points "
                              f"(edit the sweep file, or copy it, to change the grid)")
        out[key] = value
    return out
