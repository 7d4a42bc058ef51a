"""Tables on the reproduction pages that no record stands behind.

A table on ``docs/reproductions/*.md`` is rendered from a per-seed record
(``<!-- generated:record FILE -->``, ``<!-- generated:versus FILE ... -->``:
:mod:`mpifl.analysis.record`) or declared typed on the line before it with
``<!-- typed: WHY -->`` (a peer's figures, a run that did not finish, a sweep whose
logs were lost and whose re-run is pending), so that a number typed by hand cannot
reach a page unannounced: ``python -m mpifl.docs --check`` names every undeclared
one (page, line, heading) and ``python -m mpifl.docs --typed`` lists the declared
ones with their reasons.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mpifl.paths import REPO

PAGES = "docs/reproductions"
_OPEN, _CLOSE = re.compile(r"<!-- generated:\w+"), "<!-- /generated -->"
_TYPED = re.compile(r"<!-- typed: (.+?) -->$")


@dataclass(frozen=True)
class Typed:
    page: str
    line: int  # 1-based line of the table's header row
    heading: str
    why: str | None  # the declared reason; None where undeclared


def tables(text: str, page: str) -> list[Typed]:
    """Every table of ``text`` outside a generated block, with its declared reason."""
    out, inside, heading, before = [], False, "", ""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if _OPEN.match(line):
            inside = True
        elif line.startswith(_CLOSE):
            inside = False
        elif line.startswith("#") and not inside:
            heading = line.lstrip("#").strip()
        if line.startswith("|") and not (i and lines[i - 1].startswith("|")) and not inside:
            m = _TYPED.match(before)
            out.append(Typed(page, i + 1, heading, m.group(1) if m else None))
        if line.strip():
            before = line.strip()
    return out


def typed(root: Path = REPO) -> list[Typed]:
    """The typed tables of every reproduction page, page by page."""
    return [t for p in sorted((root / PAGES).glob("*.md")) for t in tables(p.read_text(), f"{PAGES}/{p.name}")]


def undeclared(root: Path = REPO) -> list[str]:
    """One line per typed table without ``<!-- typed: WHY -->``: what ``--check`` prints."""
    return [f"{t.page}:{t.line} ({t.heading}): a table typed by hand; render it from a record "
            f"(<!-- generated:record FILE -->) or say why it is typed on the line before it "
            f"(<!-- typed: WHY -->)" for t in typed(root) if t.why is None]
