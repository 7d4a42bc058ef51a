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


def parse(argv: list[str], prog: str, description: str, epilog: str = "",
          hint: Callable[[list[str]], str] = lambda unknown: "") -> tuple[str | None, list[str]]:
    """(config path or None, overrides). The first argument is the config when it
    is an existing file or does not look like ``section.key=value``: a sweep over
    lr makes paths like ``results/lr=0.1/config.yaml``. Unrecognized options are a
    usage error followed by ``hint(options)`` (:func:`mpifl.config.option_hint`)."""
    ap = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", help="YAML config (defaults apply when omitted)")
    ap.add_argument("overrides", nargs="*", help="section.key=value")
    a, unknown = ap.parse_known_args(argv)
    if unknown:
        ap.error(f"unrecognized arguments: {' '.join(unknown)}{hint(unknown)}")
    if a.config is not None and not os.path.isfile(a.config) and OVERRIDE.match(a.config):
        return None, [a.config, *a.overrides]  # only overrides were given
    return a.config, a.overrides


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
