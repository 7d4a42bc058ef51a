"""Per-round TensorBoard events of a run, from the rows the HDF5 log holds:
live while it runs (``log.tensorboard: true``: rank 0 writes ``<run>/tb/``), or
for finished runs (``python -m mpifl.results tensorboard PATHS --out DIR``, one
TensorBoard run per mpifl run, a sweep's named by its swept values). Both write
the same events from the same rows (:func:`scalars`), step = the round from 1:

- ``train/loss``, ``val/loss``, ``val/acc``, ``test/loss``, ``test/acc``: means over clients;
- ``test/acc_clients``: the per-client test accuracies, as a histogram;
- ``traffic/bytes_sent``, ``traffic/bytes_recv``, ``traffic/models_recv``: sums over clients;
- ``<algorithm>/<name>``: each per-client scalar the algorithm logs, mean over clients.

TensorBoard is an optional dependency (``pip install -e '.[tb]'``); the events are
written with ``torch.utils.tensorboard.SummaryWriter`` and read back with
TensorBoard's own ``EventAccumulator`` in the tests.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import numpy as np

from mpifl.errors import ConfigError

MISSING = "needs TensorBoard, an optional dependency: pip install -e '.[tb]' (or pip install tensorboard)"
MEANS = {"metrics/train_loss": "train/loss", "metrics/val_loss": "val/loss", "metrics/val_acc": "val/acc",
         "metrics/test_loss": "test/loss", "metrics/test_acc": "test/acc"}
SUMS = {"comm/bytes_sent": "traffic/bytes_sent", "comm/bytes_recv": "traffic/bytes_recv",
        "comm/models_recv": "traffic/models_recv", "train/steps": "budget/steps", "train/samples": "budget/samples"}
HISTOGRAM = "test/acc_clients"
NOT_ALGORITHM = ("metrics/", "comm/", "train/", "rounds/", "clients/", "graph/")


def installed() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


def require(what: str = "log.tensorboard=true") -> None:
    """The one-line error (exit 2) when TensorBoard is asked for and not installed."""
    if not installed():
        raise ConfigError(f"{what} {MISSING}")


def check_folder(folder: Path, run_root: Path) -> None:
    """Refuse, before any round, a ``tb`` folder a run cannot write its events into
    as its own (the rules of its ``checkpoint`` folder): anything there but a
    directory (a regular file: SummaryWriter would fail after the rounds began), or
    a symbolic link leading out of the run directory (events written into another
    folder, which may be another run's)."""
    if folder.is_symlink():
        target = folder.resolve()
        if not target.is_relative_to(Path(run_root).resolve()):
            raise ConfigError(f"TensorBoard folder {str(folder)!r} is a symbolic link out of the run directory (to "
                              f"{str(target)[:120]!r}), refused (log.tensorboard): the events go into the run's own "
                              f"folder; remove the link, or set log.tensorboard=false")
        folder = target
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"TensorBoard folder {str(folder)!r} is not a directory (log.tensorboard): refused, mpifl "
                          f"writes only what it wrote; remove or move it, or use another run.name")


def _mean(v: np.ndarray) -> float | None:
    v = np.asarray(v, np.float64)
    return float(np.nanmean(v)) if v.size and not np.isnan(v).all() else None


def scalars(rows: dict[str, Any]) -> dict[str, float]:
    """A round's scalars from its per-client rows (``"metrics/test_acc"`` -> ``[N]``);
    a metric not evaluated that round (all nan) is left out."""
    out: dict[str, float] = {}
    for key, value in rows.items():
        if value is None:
            continue
        v = np.asarray(value)
        if key in MEANS or (not key.startswith(NOT_ALGORITHM) and v.ndim == 1 and v.dtype.kind in "fiub"):
            m = _mean(v)
            if m is not None:
                out[MEANS.get(key, key)] = m
        elif key in SUMS:
            out[SUMS[key]] = float(v.sum())
    return out


class Events:
    """A TensorBoard event folder, written round by round."""

    def __init__(self, folder: Path) -> None:
        require()
        from torch.utils.tensorboard import SummaryWriter  # imports TensorBoard: only when asked for

        self.writer = SummaryWriter(str(folder))

    def round(self, step: int, rows: dict[str, Any]) -> None:
        """One round's events (``step``: the round from 1)."""
        for tag, value in scalars(rows).items():
            self.writer.add_scalar(tag, value, step)
        acc = rows.get("metrics/test_acc")
        if acc is not None and np.isfinite(np.asarray(acc, np.float64)).any():
            a = np.asarray(acc, np.float64)
            self.writer.add_histogram(HISTOGRAM, a[np.isfinite(a)], step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def per_round_keys(run: Any) -> list[str]:
    """The log's per-client, per-round datasets (``[R, N]``): metrics, traffic, the algorithm's."""
    return [k for k, d in run.datasets.items() if d.per_round and len(d.shape) == 2 and not k.startswith("rounds/")
            and np.dtype(d.dtype).kind in "fiub"]


def from_log(run: Any, folder: Path) -> int:
    """The events of a logged run (an :class:`mpifl.logging.h5.Run`) into ``folder``;
    returns the rounds written."""
    keys = per_round_keys(run)
    with run.reading():
        data = {k: run.get(k) for k in keys}
        rounds = run.rounds
    events = Events(folder)
    try:
        for i, t in enumerate(rounds):
            events.round(int(t) + 1, {k: v[i] for k, v in data.items()})
    finally:
        events.close()
    return len(rounds)


def run_name(values: dict[str, Any] | None, fallback: str) -> str:
    """A TensorBoard run's folder name: a sweep point's swept values
    (``algorithm.name=local,run.seed=0``), else ``fallback``."""
    if not values:
        return fallback
    text = ",".join(f"{k}={'~' if v is None else (Path(str(v)).stem if k == 'base' else v)}"
                    for k, v in values.items())
    return re.sub(r"[^A-Za-z0-9_.,=+~-]", "_", text)

