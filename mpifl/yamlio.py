"""The one YAML reader: every file mpifl reads (configs, sweeps, table layouts,
the config stored in a run log) goes through :func:`parse_yaml` or :func:`read_yaml`.

Within limits, checked while the document is composed, before any Python object
is built: its size in bytes, its nesting depth, and the number of nodes it
expands to. The last one is what stops an alias bomb: ``a: &a [x, x]``, ``b: &b
[*a, *a]``, ... doubles at each line, so a file of a few hundred bytes would
stand for 10^9 values; every alias counts the whole subtree it repeats.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, SequenceNode

from mpifl.errors import ConfigError, shorten

MAX_BYTES = 1 << 20  # a config or sweep file; real ones are a few KiB
MAX_DEPTH = 16  # nesting of YAML values; a config needs 3 (section, key, list)
MAX_NODES = 100_000  # values a document may expand to, aliases counted in full; a config has ~200


class _TooBig(Exception):
    """Raised inside the loader; turned into a one-line ConfigError naming the file."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that measures each node as it is composed: (values it expands
    to, depth). An alias returns the node it names, already measured, so its
    cost is added to its parent without walking it again."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._measure: dict[int, tuple[int, int]] = {}

    def compose_node(self, parent: Any, index: Any) -> Any:
        alias = self.check_event(AliasEvent)
        node = super().compose_node(parent, index)
        if alias:  # the node its anchor named: measured there, unless it is still being composed
            if id(node) not in self._measure:
                raise _TooBig("refers to itself through an alias; that is not allowed")
            return node
        if isinstance(node, SequenceNode):
            children = node.value
        elif isinstance(node, MappingNode):
            children = [x for pair in node.value for x in pair]
        else:
            children = []
        size, depth = 1, 0
        for c in children:
            got = self._measure[id(c)]
            size += got[0]
            depth = max(depth, got[1])
        depth += 1
        if size > MAX_NODES:
            raise _TooBig(f"expands to more than {MAX_NODES} values (through aliases); that many are not allowed")
        if depth > MAX_DEPTH:
            raise _TooBig(f"nests values more than {MAX_DEPTH} levels deep; that many are not allowed")
        self._measure[id(node)] = (size, depth)
        return node


def parse_yaml(text: str, what: str, invalid_ok: bool = False) -> Any:
    """YAML text within the size, depth and expansion limits, or a one-line
    ConfigError naming ``what`` (e.g. "config file 'x.yaml'"); with ``invalid_ok``
    text that is not YAML comes back as it is (an override's value)."""
    if len(text) > MAX_BYTES:
        raise ConfigError(f"{what} is {len(text)} characters long; at most {MAX_BYTES} are allowed")
    if "*" not in text and FAST is not None:
        # without an alias (always spelled with "*") a document cannot expand past its
        # size: libyaml reads it, ten times faster (a sweep's hundred stored configs),
        # and the depth is measured on what it built; what it refuses as YAML is read
        # again below, for the bounded reader's message
        try:
            out = yaml.load(text, Loader=FAST)  # noqa: S506 - CSafeLoader: the safe loader, in C
        except ValueError as e:  # an integer past Python's digit limit (4300): its conversion refuses it
            raise ConfigError(f"{what} {_too_long(e)}") from None
        except yaml.YAMLError as e:
            if "nesting depth" in str(getattr(e, "problem", "")):  # libyaml's own limit (1000): seconds saved
                raise ConfigError(f"{what} nests values more than {MAX_DEPTH} levels deep; "
                                  f"that many are not allowed") from None
        except RecursionError:
            pass
        else:
            if _depth(out) > MAX_DEPTH:
                raise ConfigError(f"{what} nests values more than {MAX_DEPTH} levels deep; that many are not allowed")
            return out
    loader = None
    try:
        loader = _BoundedLoader(text)  # its reader refuses control characters here: a ReaderError too
        return loader.get_single_data()
    except _TooBig as e:
        raise ConfigError(f"{what} {e}") from None
    except ValueError as e:
        raise ConfigError(f"{what} {_too_long(e)}") from None
    except RecursionError:  # deeper than the composer's own recursion: far past MAX_DEPTH
        raise ConfigError(f"{what} nests values more than {MAX_DEPTH} levels deep; that many are not allowed") \
            from None
    except yaml.YAMLError as e:
        if invalid_ok:
            return text
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        where = f" (line {line + 1}{_tab_note(text, line)})" if line is not None else ""
        raise ConfigError(f"{what} is not valid YAML{where}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _tab_note(text: str, line: int) -> str:
    """``": a tab in column 3; YAML indents with spaces"`` where the refused line
    holds a tab (PyYAML's "found character that cannot start any token"), else ""."""
    lines = text.splitlines()
    col = lines[line].find("\t") if line < len(lines) else -1
    return f": a tab in column {col + 1}; YAML indents with spaces" if col >= 0 else ""


FAST = getattr(yaml, "CSafeLoader", None)  # PyYAML built without libyaml has none


def _too_long(e: ValueError) -> str:
    """What a ValueError of YAML's constructors says: an integer too long to convert."""
    if "integer string conversion" in str(e):
        return (f"holds an integer of more than {sys.get_int_max_str_digits()} digits; an integer must be at most "
                f"2**63 - 1 in size")
    return f"holds a value YAML cannot convert ({shorten(str(e))})"


def _depth(x: Any, limit: int = MAX_DEPTH + 1) -> int:
    """Nesting depth of plain YAML data (a scalar is 1), counted up to ``limit``."""
    if limit <= 0 or not isinstance(x, (dict, list)):
        return 1
    items = list(x.keys()) + list(x.values()) if isinstance(x, dict) else x
    return 1 + max((_depth(v, limit - 1) for v in items), default=0)


def read_yaml(path: str | Path, what: str) -> Any:
    """A YAML file within the limits of :func:`parse_yaml`."""
    path = Path(path)
    try:
        size = path.stat().st_size
        text = path.read_text() if size <= MAX_BYTES else ""
    except (UnicodeDecodeError, ValueError):
        raise ConfigError(f"{what} is not a YAML text file") from None
    except OSError as e:
        raise ConfigError(f"{what} cannot be read ({e.strerror})") from None
    if size > MAX_BYTES:
        raise ConfigError(f"{what} is {size} bytes; at most {MAX_BYTES} are allowed")
    return parse_yaml(text, what)
