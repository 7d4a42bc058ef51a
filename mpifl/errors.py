"""The user error every entry point reports in one line, and the helpers that
phrase it. A leaf module: everything may import it, it imports nothing of mpifl."""

from __future__ import annotations

import errno
from typing import Any

MAX_SHOWN = 200  # characters of a value echoed in an error message


class ConfigError(ValueError):
    """A user error in the configuration or inputs: reported in one line, exit 2.

    ``key``: the key the message opens with (``key=value ...``), when it is one.
    An algorithm's ``Params`` name their own keys bare (``mu``, a field's name),
    and the config's validation puts their section before them (``fedprox.mu``):
    the section is the module's name, which its own code need not repeat."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


def shorten(text: str, limit: int = MAX_SHOWN) -> str:
    """``text`` cut in the middle when longer than ``limit``, saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit // 2]}...({len(text)} characters)...{text[-limit // 4:]}"


def ranges(rs: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (ascending numbers: ranks, SLURM array indices)."""
    out, start = [], None
    for i, r in enumerate(rs):
        if start is None:
            start = r
        if i + 1 == len(rs) or rs[i + 1] != r + 1:
            out.append(f"{start}" if start == r else f"{start}-{r}")
            start = None
    return ",".join(out)


def did_you_mean(word: str, choices: Any) -> str:
    """`` (did you mean 'train.lr'?)`` when one of ``choices`` is close to ``word``, else ""."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise the one-line error ``key=value is not allowed; allowed`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed; {allowed}", key)


UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)  # a place the user cannot write: a user error
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EIO)  # a disk that cannot hold a write: not the user's path's fault
STORAGE_EXIT = 74  # EX_IOERR: the disk refused a write; free space (or fix the disk) and rerun the same command
RERUN = "free space and rerun the same command to resume"  # the way forward every refused write names


class StorageError(OSError):
    """The file system refused a write of the log or a checkpoint (ENOSPC, EDQUOT,
    EIO, EROFS): what was committed before it is kept, the run stops in one line
    with exit status :data:`STORAGE_EXIT`, and the same command resumes."""


def storage_error(what: str, path: Any, exc: OSError, kept: str) -> StorageError:
    """The one line of a refused write: ``what`` (``"the log"``) at ``path``, the
    system's reason, what survives (``kept``) and the way forward."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    return StorageError(f"cannot write {what} {str(path)!r} ({reason}); {kept}; "
                        f"{RERUN}")
