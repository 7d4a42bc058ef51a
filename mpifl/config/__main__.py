"""``python -m mpifl.config``: the reference table of every key; with a config
file and/or overrides, the resolved config as commented YAML."""

from __future__ import annotations

import sys

from mpifl.cli import parse
from mpifl.config import annotated_yaml, load, option_hint, reference
from mpifl.errors import ConfigError

EPILOG = """\
every key (default, type, allowed values, meaning):  python -m mpifl.config
the resolved config of a file with overrides:  python -m mpifl.config CONFIG.yaml [section.key=value ...]
"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path, overrides = parse(args, prog="python -m mpifl.config", epilog=EPILOG,
                            description="Print every config key, or a config file resolved with its overrides.",
                            hint=option_hint)
    if not args:
        print(reference())
        return 0
    try:
        cfg = load(path, overrides)
    except ConfigError as e:
        print(f"mpifl.config: error: {e}", file=sys.stderr)
        return 2
    print(f"# resolved: {path or 'the defaults'}{''.join(' ' + o for o in overrides)}")
    print(annotated_yaml(cfg), end="")
    return 0


if __name__ == "__main__":
    from mpifl.cli import quiet_pipe

    raise SystemExit(quiet_pipe(main))
