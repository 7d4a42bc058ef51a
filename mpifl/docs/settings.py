"""The settings a reproduction page states about its runs, rendered from the runs'
records and checked against them, so that a page cannot say a run was set one
way when it ran another.

A record (:mod:`mpifl.analysis.record`) holds, per run, the config keys that
differ from the defaults and the commit that ran it (``provenance``). A run's
*resolved* setting of a key is the record's value, else the default **as of the
run's commit**: the defaults of each config section and algorithm ``Params`` are
read from that commit's files (``git show COMMIT:mpifl/...``, field defaults
written as literals); where one differs from this checkout's, the run's commit
wins and the block says so. Where the commit is not recorded or not in the
clone, the block says its values are this checkout's defaults.

``<!-- generated:settings FILE[,FILE] [keys=K,K] [method=A,B] -->`` renders, per
method of the record(s), the resolved values of ``keys`` and of every key of the
method's own algorithm section (distinct values over its runs, comma-joined).

``python -m mpifl.docs --check`` also reads every section (``## ``) of a page
that renders a block from a record, and checks the settings its prose states
(outside generated blocks and code) against the resolved settings of those
records' runs: a dotted key with a value (```dpfl.tau_train=1```, ``train.lr
1e-3``), a field of a method's algorithm section with a number (``tau_train
1``, ``k 3``), and ``batch N``, ``N rounds``, ``N local epoch(s)``, ``lr X`` (or
``Adam X``, ``SGD X``). A stated value that no run of the section's records used is
one problem line. A paragraph
that states something else on purpose (a paper's setting, a plan) says so on
the line before it: ``<!-- typed: WHY -->``.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import math
import re
import subprocess
from pathlib import Path
from typing import Any

from mpifl.paths import REPO

NOT_LITERAL = object()


def _literal(node: ast.AST | None) -> Any:
    """The value a dataclass field's default is written as, or NOT_LITERAL:
    ``x: int = 3``, ``field(default=3)``, ``field(default_factory=lambda: [64])``,
    ``float("inf")``."""
    if node is None:
        return NOT_LITERAL
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "field":
            kw = {k.arg: k.value for k in node.keywords}
            if "default" in kw:
                return _literal(kw["default"])
            f = kw.get("default_factory")
            return _literal(f.body) if isinstance(f, ast.Lambda) else NOT_LITERAL
        if node.func.id == "float" and len(node.args) == 1:
            v = _literal(node.args[0])
            return float(v) if isinstance(v, str) else NOT_LITERAL
    try:
        return ast.literal_eval(node)
    except ValueError:
        return NOT_LITERAL


def class_defaults(source: str, name: str) -> dict[str, Any]:
    """Field -> default of dataclass ``name`` in ``source``, where written as a literal."""
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {n.target.id: v for n in node.body if isinstance(n, ast.AnnAssign)
                    and isinstance(n.target, ast.Name) and (v := _literal(n.value)) is not NOT_LITERAL}
    return {}


@functools.cache
def _sources() -> dict[str, tuple[str, str]]:
    """Config section -> (file relative to the repository, dataclass name)."""
    import inspect

    from mpifl import config

    cfg = config.from_dict({})
    out = {}
    for section in cfg.to_dict():
        cls = type(getattr(cfg, section))
        path = Path(inspect.getsourcefile(cls)).resolve()
        if path.is_relative_to(REPO):
            out[section] = (str(path.relative_to(REPO)), cls.__name__)
    return out


def _show(commit: str, path: str) -> str | None:
    try:
        p = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=REPO, capture_output=True, text=True,
                           timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


def _former(path: str) -> tuple[str, ...]:
    """Where a section's class was written before its file moved: the core sections
    in the config package's ``sections`` module before they became the leaf
    ``mpifl/schema.py``, an algorithm's ``Params`` in its own module before it had a
    ``<name>_params.py``."""
    if path == "mpifl/schema.py":
        return ("mpifl/config/sections.py",)
    if path.startswith("mpifl/algorithms/") and path.endswith("_params.py"):
        return (path.removesuffix("_params.py") + ".py",)
    return ()


def _show_section(commit: str, path: str) -> str | None:
    """The file a section's class was written in at ``commit``: ``path``, else its former place."""
    return next((src for p in (path, *_former(path)) if (src := _show(commit, p)) is not None), None)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b) or (math.isnan(float(a)) and math.isnan(float(b)))
    return a == b


@functools.cache
def changed_since(commit: str) -> dict[str, tuple[Any, Any]] | None:
    """Key -> (its default at ``commit``, this checkout's) for every default that
    differs; None where git cannot show the commit's files."""
    from mpifl.analysis.summary import defaults

    now = defaults()
    out = {}
    for section, (path, cls) in _sources().items():
        src = _show_section(commit, path)
        if src is None:
            if section in ("run", "data", "model", "train", "algorithm", "log"):
                return None  # the commit itself is not here
            continue  # an algorithm added after the commit: its runs never read it
        for f, v in class_defaults(src, cls).items():
            key = f"{section}.{f}"
            if key in now and not _same(v, now[key]):
                out[key] = (v, now[key])
    return out


def commit_of(provenance: dict[str, Any]) -> str | None:
    return ((provenance or {}).get("mpifl") or {}).get("commit") or None


def resolve(config: dict[str, Any], commit: str | None) -> dict[str, Any]:
    """A record row's full config: its keys over the defaults as of ``commit``
    (this checkout's where the commit is unknown or not in the clone)."""
    from mpifl.analysis.summary import defaults

    base = dict(defaults())
    for key, (then, _) in (changed_since(commit) or {}).items() if commit else ():
        base[key] = then
    return {**base, **config}


def _fmt(v: Any) -> str:
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list):
        return "[" + ", ".join(map(_fmt, v)) + "]"
    return str(v)


def _sort(values: set[str]) -> list[str]:
    def key(s: str) -> tuple:
        try:
            return 0, float(s), s
        except ValueError:
            return 1, 0.0, s
    return sorted(values, key=key)


@dataclasses.dataclass
class Runs:
    """The runs of a record (one row per run), each method's and each run's resolved config."""

    methods: dict[str, list[dict[str, Any]]]  # method -> resolved configs of its runs
    commits: dict[str, set[str | None]]  # method -> commits of its runs
    changed: dict[str, tuple[Any, Any]]  # key -> (then, now) over the runs' commits
    unknown: bool  # some run's commit is unknown or not in this clone


def runs_of(paths: str, root: Path = REPO) -> Runs:
    from mpifl.analysis.record import read_joined

    seen: set[tuple] = set()
    methods: dict[str, list[dict[str, Any]]] = {}
    commits: dict[str, set[str | None]] = {}
    changed: dict[str, tuple[Any, Any]] = {}
    unknown = False
    for r in read_joined(paths, root):
        commit = commit_of(r.provenance)
        ident = (r.method, r.setting, r.seed, json.dumps(r.config, sort_keys=True), commit)
        if ident in seen:
            continue
        seen.add(ident)
        since = changed_since(commit) if commit else None
        unknown |= since is None
        changed.update(since or {})
        methods.setdefault(r.method, []).append(resolve(r.config, commit))
        commits.setdefault(r.method, set()).add(commit)
    return Runs(methods, commits, changed, unknown)


def _values(configs: list[dict[str, Any]], key: str) -> str:
    return ", ".join(_sort({_fmt(c.get(key, "–")) for c in configs}))


def own_keys(configs: list[dict[str, Any]]) -> list[str]:
    """The keys of the runs' own algorithm section(s)."""
    names = {str(c.get("algorithm.name")) for c in configs}
    names |= {n.rsplit("_", 1)[0] for n in names if n.endswith("_ft")}  # X_ft reads X's section too
    return [k for k in configs[0] if k.split(".", 1)[0] in names]


def render(root: Path, path: str, keys: list[str], methods: tuple[str, ...] = ()) -> str:
    """Per method of the record(s) ``path`` (``methods`` only, if given), the resolved
    settings of its runs: ``keys`` and its own algorithm section's."""
    got = runs_of(path, root)
    lines = ["| method | runs | commit | settings |", "|---|---|---|---|"]
    for m, configs in got.methods.items():
        if methods and m not in methods:
            continue
        shown = list(dict.fromkeys([*keys, *own_keys(configs)]))
        commits = ", ".join(sorted((c or "unknown")[:7] for c in got.commits[m]))
        cells = ", ".join(f"`{k}` {_values(configs, k)}" for k in shown)
        lines.append(f"| {m} | {len(configs)} | {commits} | {cells} |")
    note = "Each run's setting: its record's config over the defaults of the commit that ran it"
    if got.changed:
        note += "; defaults changed since: " + ", ".join(
            f"`{k}` {_fmt(a)} then, {_fmt(b)} now" for k, (a, b) in sorted(got.changed.items()))
    else:
        note += ", the same as this checkout's for every key"
    if got.unknown:
        note += ". Runs whose commit is unknown or not in this clone are resolved with this checkout's defaults"
    return "\n".join(lines) + "\n\n" + note + " (mpifl/docs/settings.py)."


_RECORD_BLOCK = re.compile(r"<!-- generated:(?:record|versus|means|rounds|settings) (\S+)")
_TYPED = re.compile(r"<!-- typed: .+? -->$")
# ``key=value`` (any value), or ``key`` / ``key:`` followed by a number
_DOTTED = re.compile(r"`?\b([a-z][a-z0-9_]*\.[a-z][a-z0-9_]*)`?(?:=`?([\w.+-]+)|:? `?(-?[0-9][0-9.e+-]*|inf)\b)")
# how the pages write the common training settings in words
_WORDS = ((re.compile(r"\bbatch (?:size )?([0-9]+)\b"), "train.batch_size"),
          (re.compile(r"(?<!last )(?<!first )\b([0-9]+) rounds\b"), "run.rounds"),
          (re.compile(r"\b([0-9]+) local epochs?\b"), "train.local_epochs"),
          (re.compile(r"\b(?:lr|Adam|SGD) ([0-9][0-9.e-]*[0-9])\b"), "train.lr"))


def _number(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


def _used(stated: str, values: set[str]) -> bool:
    n = _number(stated)
    return any(v.lower() == stated.lower() or (n is not None and _number(v) == n) for v in values)


def _prose(text: str) -> list[tuple[int, str]]:
    """(line number from 1, line) of the page's prose: outside generated blocks,
    code, comments and the paragraph right after a ``<!-- typed: WHY -->`` line."""
    out, inside, fence, typed = [], False, False, False
    for i, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s.startswith("<!-- generated:"):
            inside = True
        elif s.startswith("<!-- /generated -->"):
            inside = False
        elif s.startswith("```"):
            fence = not fence
        typed = bool(_TYPED.match(s)) or (typed and bool(s))
        if s and not (inside or fence or typed or line.startswith("    ") or s.startswith("<!--")):
            out.append((i, line))
    return out


def _sections(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each ``## `` section of a page (its start before the first)."""
    starts = [0] + [i for i, line in enumerate(text.splitlines()) if line.startswith("## ")]
    lines = text.splitlines()
    return [(a + 1, "\n".join(lines[a:b])) for a, b in zip(starts, [*starts[1:], len(lines)])]


def _statements(line: str, fields: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(key, stated value) of every setting ``line`` states; ``fields``: bare field
    name -> the dotted keys it may mean (the section's methods' algorithm keys)."""
    out = [(k, a or b) for k, a, b in _DOTTED.findall(line)]
    dotted = {k for k, _ in out}
    for bare, keys in fields.items():
        for v in re.findall(rf"(?<![.\w`]){re.escape(bare)}`? (?:= )?(-?[0-9][0-9.e+-]*|inf)\b", line):
            out += [(k, v) for k in keys if k not in dotted]
    for rx, key in _WORDS:
        out += [(key, v) for v in rx.findall(line)]
    return out


def page_problems(page: str, root: Path = REPO) -> list[str]:
    """One line per setting a page's prose states that no run of its section's records used."""
    text = (root / page).read_text()
    out = []
    for start, sec in _sections(text):
        files = list(dict.fromkeys(f for m in _RECORD_BLOCK.finditer(sec) for f in m.group(1).split(",")))
        if not files:
            continue
        configs = [c for f in files for cs in runs_of(f, root).methods.values() for c in cs]
        fields: dict[str, set[str]] = {}
        for c in configs:
            for k in own_keys([c]):
                fields.setdefault(k.split(".", 1)[1], set()).add(k)
        for i, line in _prose(sec):
            for key, value in _statements(line, fields):
                if value.isupper():  # a placeholder: run.seed=S, model.weights=PATH
                    continue
                applies = [c for c in configs if key in c and (key.split(".", 1)[0] not in _sections_of_algorithms()
                                                               or key in own_keys([c]))]
                if not applies:
                    continue
                values = {_fmt(c[key]) for c in applies}
                if not _used(value, values):
                    out.append(f"{page}:{start + i - 1}: states {key} {value}; the runs of "
                               f"{', '.join(files)} used {', '.join(_sort(values))} (resolved at their commit: "
                               f"mpifl/docs/settings.py); correct it, render it (<!-- generated:settings FILE -->) "
                               f"or say why on the line before its paragraph (<!-- typed: WHY -->)")
    return out


@functools.cache
def _sections_of_algorithms() -> frozenset[str]:
    from mpifl.algorithms import NAMES

    return frozenset(NAMES)


def problems(root: Path = REPO) -> list[str]:
    """:func:`page_problems` of every reproduction page: what ``--check`` prints."""
    return [p for page in sorted((root / "docs" / "reproductions").glob("*.md"))
            for p in page_problems(str(page.relative_to(root)), root)]
