"""The rules for resuming a run: which checkpoint a start continues from (per
``run.resume``), what a finished run started again does, the log a checkpoint
needs, and what the same command will do after a refused write."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mpifl.config import Config
from mpifl.errors import RERUN, ConfigError, shorten
from mpifl.logging.h5 import open_run
from mpifl.paths import RunDir
from mpifl.run import checkpoint


def find_checkpoint(cfg: Config) -> Path | None:
    """The checkpoint to resume from, per ``run.resume``; refuses another
    experiment's (:mod:`mpifl.config.identity`: the directory may have moved, and a
    larger ``run.rounds`` extends the run), a ``run.rounds`` below the rounds done,
    and a damaged checkpoint (never a silent start over)."""
    rd = RunDir(cfg.run_dir)
    checkpoint.check_dir(rd)
    if cfg.log.tensorboard:  # the events' folder follows the checkpoint folder's rules
        from mpifl.logging.tensorboard import check_folder

        check_folder(rd.tb, rd.root)
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


def last_evaluated(log: Path) -> tuple[int, float]:
    """(round, mean test_acc over clients) of the last evaluated round in a log;
    (-1, nan) when it holds none. Seeds the progress line of a resumed run."""
    run = open_run(log)
    acc = run.metric("test_acc")
    done = np.flatnonzero(~np.all(np.isnan(acc), axis=1)) if acc.size else []
    if len(done) == 0:
        return -1, float("nan")
    return int(run.rounds[done[-1]]), float(np.nanmean(acc[done[-1]]))


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
