"""Every file name in a run directory, and atomic writes into it."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

# the checkout mpifl runs from: its slurm/ templates, jobs/ and docs/ (an installed copy has none of them)
REPO = Path(__file__).resolve().parents[1]


def beneath(name: str) -> property:
    """A property naming ``<self.root>/name``: a directory's file names, one line each."""
    return property(lambda self: self.root / name, doc=f"<root>/{name}")


@dataclass(frozen=True)
class RunDir:
    root: Path
    config = beneath("config.yaml")
    log = beneath("run.h5")
    checkpoint = beneath("checkpoint")
    tb = beneath("tb")  # TensorBoard events (log.tensorboard), written by rank 0
    lock = beneath("run.lock")  # held by the job writing here (mpifl.run.lock); gone when it ends
    export = beneath("export")  # python -m mpifl.results export's default folder (ExportDir)


@dataclass(frozen=True)
class ExportDir:
    """The files of ``python -m mpifl.results export`` (:mod:`mpifl.run.export`):
    one ``state_dict`` per model and ``index.json`` saying which is which."""

    root: Path
    index = beneath("index.json")

    def client(self, client: int, field: str = "") -> Path:
        """Client ``client``'s row (``clients/``), or its row of the algorithm's per-client ``field``."""
        return self.root / (field or "clients") / f"client-{client:04d}.pt"

    def shared(self, field: str, k: int | None = None) -> Path:
        """The algorithm's shared model ``field`` (``shared/model.pt``), or its ``k``-th (``shared/models-02.pt``)."""
        return self.root / "shared" / (f"{field}.pt" if k is None else f"{field}-{k:02d}.pt")


def probe_write(folder: Path) -> None:
    """Create and remove a temporary file in ``folder``: the OSError a write there
    would meet (read-only, no permission), found before any work."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".mpifl-probe.", suffix=".tmp")
    os.close(fd)
    os.unlink(tmp)


def atomic_write_text(path: Path, text: str) -> None:
    """Write through a temporary file and rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide results from the group
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:  # a refused write (ENOSPC) names no file: this one
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
