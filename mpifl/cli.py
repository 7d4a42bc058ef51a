"""``CONFIG [section.key=value ...]`` on the command line: the one reading that
``mpifl.main``, ``mpifl.config``, ``mpifl.check`` and ``mpifl.data`` share."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable

# section.key[.key...]=value; the value may hold anything, "=" included
OVERRIDE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+=")


def parse(argv: list[str], prog: str, description: str, epilog: str = "") -> tuple[str | None, list[str]]:
    """(config path or None, overrides). The first argument is the config when it
    is an existing file or does not look like ``section.key=value``: a sweep over
    lr makes paths like ``results/lr=0.1/config.yaml``."""
    ap = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", help="YAML config (defaults apply when omitted)")
    ap.add_argument("overrides", nargs="*", help="section.key=value")
    a, unknown = ap.parse_known_args(argv)
    if unknown:
        ap.error(f"unrecognized arguments: {' '.join(unknown)}{_as_override(unknown)}")
    if a.config is not None and not os.path.isfile(a.config) and OVERRIDE.match(a.config):
        return None, [a.config, *a.overrides]  # only overrides were given
    return a.config, a.overrides


def _as_override(unknown: list[str]) -> str:
    """The override an option-style argument (``--rounds 5``, ``--lr=0.1``) meant,
    as a hint: config keys are set as ``section.key=value``."""
    flag = next((u for u in unknown if u.startswith("--")), None)
    if flag is None:
        return ""
    import difflib

    from mpifl.config import all_keys

    name, _, value = flag[2:].replace("-", "_").partition("=")
    after = unknown[unknown.index(flag) + 1:]
    value = value or (after[0] if after and not after[0].startswith("-") else "VALUE")
    names = {k: k.rsplit(".", 1)[-1] for k in all_keys()}
    close = difflib.get_close_matches(name, sorted(set(names.values())), n=1, cutoff=0.6)
    keys = [k for k, n in names.items() if n in close]
    if not keys:
        return "; config keys are set as section.key=value (every key: python -m mpifl.config)"
    return f"; config keys are set as section.key=value (did you mean {' or '.join(f'{k}={value}' for k in keys[:3])}?)"


SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what a shell shows for a writer whose reader went away


def quiet_pipe(main: Callable[[], int]) -> int:
    """``main()``'s exit status; when the reader of stdout has gone (``| head``),
    the rest of the output is dropped without a traceback."""
    try:
        code = main()
        sys.stdout.flush()  # a pending write fails here, not in the interpreter's shutdown
        return code
    except BrokenPipeError:
        # later writes (and the final flush at exit) go nowhere instead of raising again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return SIGPIPE_EXIT
