"""A sweep's files: every point's run directory and config.yaml (a stored config of
another experiment refused), ``runs.txt`` and the array script."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from mpifl.errors import ConfigError
from mpifl.paths import RunDir, atomic_write_text
from mpifl.sweep.slurm import array_script
from mpifl.sweep.spec import Sweep
from mpifl.sweep.status import is_complete
from mpifl.yamlio import read_yaml

if TYPE_CHECKING:  # building Config imports every algorithm: only when points are loaded
    from mpifl.config import Config

def stored_diff(path: Path, cfg: Config) -> str:
    """The experiment keys (:mod:`mpifl.config.identity`) in which the config file
    ``path`` differs from ``cfg``, as "k (a -> b), ..."; "" when it is the same
    experiment (its run.rounds, run.threads... may differ: the run continues)."""
    from mpifl.config.identity import config_diff

    try:
        old = read_yaml(path, f"config file {str(path)!r}")
    except ConfigError:
        old = None
    return config_diff(old, cfg.to_dict()) if isinstance(old, dict) else "unreadable"


def write(sweep: Sweep, workdir: Path, force: bool = False) -> None:
    """Configs, runs.txt and array.sbatch. A point's existing config of another
    experiment is an error; one that differs in keys that may change between a
    run and its continuation (run.rounds, run.threads, ...) is replaced, unless
    its run is complete (an extended run keeps its larger run.rounds)."""
    workdir = Path(workdir).resolve()  # the script cds there from wherever SLURM starts it
    for p in sweep.points:
        rd = RunDir(p.config.run_dir)
        text = p.config.to_yaml()
        if rd.config.exists() and rd.config.read_text() == text:
            continue
        if rd.config.exists() and not force:
            diff = stored_diff(rd.config, p.config)
            if diff:
                raise ConfigError(f"{rd.config} holds a different config than this sweep makes for point {p.name}: "
                                  f"{diff}; use another sweep name or out_dir, or --force to overwrite it")
            if is_complete(p.config):  # a run extended past this sweep's rounds keeps the config it ran
                continue
        atomic_write_text(rd.config, text)
    sweep.log_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(sweep.runs_file, "".join(f"{p.config.run_dir}\n" for p in sweep.points))
    atomic_write_text(sweep.root / "sweep.yaml", yaml.safe_dump({
        "name": sweep.name, "source": str(sweep.path), "base": str(sweep.base) if sweep.base else None,
        "set": sweep.set, "grid": sweep.grid, "slurm": sweep.slurm.__dict__,
        "points": [{"name": p.name, "values": p.values} for p in sweep.points],
    }, sort_keys=False))
    atomic_write_text(sweep.script, array_script(sweep, workdir))
    sweep.script.chmod(0o755)
