"""Counts and quoted results in the docs, checked against their sources, so that a
page cannot go on stating a number that has changed elsewhere. Part of
``python -m mpifl.docs --check`` (and filled in by ``--write`` where marked):

- every ``sweep NAME: N configs under ...`` line of a transcript names a sweep file
  of ``jobs/`` with N points (the product of its grid, summed over a list of grids);
- ``N<!-- points: FILE [FILE ...] -->``: N is the points of those sweep files together;
- ``<!-- quote: PAGE BLOCK ROW COLUMN -->TEXT<!-- /quote -->``: TEXT is that cell of
  the Markdown table in the ``docsync`` block BLOCK of PAGE (the row whose first
  cell is ROW), as mpifl.docs.sync made it there;
- ``<!-- count: fast-tests -->N<!-- /count -->``: N is the tests of the fast tier
  (``pytest --collect-only -m "not slow"``; only with ``tests=True``: it starts pytest);
- an ``mpifl.check`` transcript quoted in full (no ``...`` line) shows every line
  the check prints on every launch (:data:`CHECK_LINES`);
- every ``python`` code block of the README passes ``ruff check`` (only with
  ``tests=True``: it starts ruff, where installed).
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from mpifl.docs.sync import MARKER, documents

REPO = Path(__file__).resolve().parent.parent
SWEEP_LINE = re.compile(r"sweep ([A-Za-z0-9_.+=-]+): (\d+) configs under")
POINTS = re.compile(r"(\d+)<!-- points: ([^>]+?) -->")
QUOTE = re.compile(r"<!-- quote: (\S+) (\S+) ([^>`]+?) (\S+) -->([^<`]*)<!-- /quote -->")
COUNT = re.compile(r"(<!-- count: fast-tests -->)(\d+)(<!-- /count -->)")
# what `python -m mpifl.check` prints on every launch, in its order (mpifl/check.py)
CHECK_LINES = ("launch", "node", "layout", "placement", "memory", "device", "run dir", "versions", "import",
               "exchange", "data root")


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def sweep_points(path: Path) -> int:
    """Points of a sweep file, from its grid alone (nothing validated or loaded)."""
    grid = (yaml.safe_load(path.read_text()) or {}).get("grid") or {}
    grids = grid if isinstance(grid, list) else [grid]
    return sum(math.prod(len(v) for v in g.values()) for g in grids)


def sweep_files() -> dict[str, Path]:
    """Sweep name -> file, for every sweep file under jobs/."""
    out = {}
    for path in sorted(REPO.glob("jobs/**/*.yaml")):
        spec = yaml.safe_load(path.read_text())
        if isinstance(spec, dict) and "grid" in spec:
            out[str(spec.get("name", path.stem))] = path
    return out


def _table_cell(block: str, row: str, column: str) -> str | None:
    lines = [x for x in block.splitlines() if x.startswith("|")]
    if not lines:
        return None
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == row and column in head:
            return cells[head.index(column)]
    return None


def quoted(page: str, block: str, row: str, column: str) -> str | None:
    """The cell a quote marker names, as its page holds it now."""
    path = REPO / page
    if not path.is_file():
        return None
    for m in MARKER.finditer(path.read_text()):
        if m["name"] == block:
            return _table_cell(m["body"], row, column)
    return None


def _check_blocks(text: str) -> list[list[str]]:
    """The indented ``mpifl.check`` transcripts of a page, each as its lines."""
    out, cur = [], None
    for line in text.splitlines():
        if re.match(r"\s+\$ .*-m mpifl\.check\b", line):
            cur = []
            out.append(cur)
        elif cur is not None and line.startswith("    ") and not line.lstrip().startswith("$"):
            cur.append(line.strip())
        else:
            cur = None
    return out


def problems(tests: bool = False, pages: dict[Path, str] | None = None) -> list[str]:
    """One line per count or quote that does not hold, in the docs (or in ``pages``:
    path -> text)."""
    sweeps = sweep_files()
    out = []
    for path, text in (pages or {p: p.read_text() for p in documents()}).items():
        for m in SWEEP_LINE.finditer(text):
            name, n = m.group(1), int(m.group(2))
            if name in sweeps and sweep_points(sweeps[name]) != n:
                out.append(f"{_rel(path)}: sweep {name}: {n} configs, but {_rel(sweeps[name])} has "
                           f"{sweep_points(sweeps[name])} points")
        for m in POINTS.finditer(text):
            files = m.group(2).split()
            missing = [f for f in files if not (REPO / f).is_file()]
            total = sum(sweep_points(REPO / f) for f in files if (REPO / f).is_file())
            if missing or total != int(m.group(1)):
                out.append(f"{_rel(path)}: {m.group(1)} points of {' '.join(files)}, but they have {total}"
                           + (f" ({', '.join(missing)} missing)" if missing else ""))
        for m in QUOTE.finditer(text):
            now = quoted(*m.group(1, 2, 3, 4))
            if now != m.group(5):
                out.append(f"{_rel(path)}: quotes {m.group(5)!r} from {m.group(1)} ({m.group(2)}, {m.group(3)}, "
                           f"{m.group(4)}), which holds {now!r} there")
        for lines in _check_blocks(text):
            if lines and "..." not in lines and lines[-1].startswith("mpifl.check: ok"):
                have = [x.split("  ")[0].strip() for x in lines[1:-1]]
                lost = [k for k in CHECK_LINES if k not in have]
                if lost:
                    out.append(f"{_rel(path)}: an mpifl.check transcript lacks its {', '.join(lost)} line(s)")
        if tests:
            for m in COUNT.finditer(text):
                n = fast_tests()
                if int(m.group(2)) != n:
                    out.append(f"{_rel(path)}: states {m.group(2)} fast-tier tests, pytest collects {n}")
    if tests:
        out += readme_ruff()
    return out


def fill(text: str, tests: bool = False) -> str:
    """``text`` with its quotes (and, with ``tests``, its test counts) made again."""
    text = QUOTE.sub(lambda m: m.group(0).replace(f"-->{m.group(5)}<!--", f"-->{quoted(*m.group(1, 2, 3, 4))}<!--")
                     if quoted(*m.group(1, 2, 3, 4)) is not None else m.group(0), text)
    if tests:
        text = COUNT.sub(lambda m: f"{m.group(1)}{fast_tests()}{m.group(3)}", text)
    return text


def fast_tests() -> int:
    """The fast tier's tests, as pytest collects them."""
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not slow", "-p", "no:xdist",
                          "tests"], cwd=REPO, capture_output=True, text=True, check=False)
    m = re.search(r"(\d+)/\d+ tests collected", res.stdout) or re.search(r"(\d+) tests? collected", res.stdout)
    if not m:
        raise RuntimeError(f"pytest --collect-only said: {res.stdout[-300:]}{res.stderr[-300:]}")
    return int(m.group(1))


def readme_ruff(text: str | None = None) -> list[str]:
    """``ruff check`` on each python code block of the README (or ``text``); nothing
    where ruff is not installed."""
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        return []
    text = (REPO / "README.md").read_text() if text is None else text
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, m in enumerate(re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)):
            f = Path(tmp) / f"readme_block_{i}.py"
            f.write_text(m.group(1))
            res = subprocess.run([ruff, "check", "--no-cache", "--config", str(REPO / "pyproject.toml"), str(f)],
                                 capture_output=True, text=True, check=False)
            if res.returncode:
                line = text[:m.start()].count("\n") + 1
                why = next((x for x in res.stdout.splitlines() if ".py:" in x or x[:4].isupper()), "ruff failed")
                out.append(f"README.md:{line}: its python block fails ruff check ({why.strip()})")
    return out
