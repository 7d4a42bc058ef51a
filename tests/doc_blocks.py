"""Code blocks of the Markdown docs (README.md, docs/**/*.md): fenced and
indented, each with the marker on the line before it, and the commands in them
(one per logical line: continuation backslashes and open quotes joined, comments
dropped). The conventions are in docs/README.md."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from helpers import REPO

from mpifl.docs.sync import documents

EXAMPLE = re.compile(r"<!--\s*example(?::[^>]*)?\s*-->")
PROGRAMS = {"python", "python3", "mpiexec", "mpirun", "srun", "sbatch", "bash", "sh", "pip", "h5dump", "scancel",
            "scontrol", "squeue", "sacct", "pytest"}


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the block's first line
    lang: str  # fenced: the info string; indented: ""
    text: str  # dedented
    marker: str  # the line before the block when it is an HTML comment, else ""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def example(self) -> bool:
        return bool(EXAMPLE.fullmatch(self.marker.strip()))

    def commands(self) -> list[str]:
        """The block's commands, when it is a shell block (a python block has none)."""
        if self.lang not in ("", "sh", "bash", "console", "shell"):
            return []
        out, pending = [], ""
        for raw in self.text.splitlines():
            line = pending + ("\n" if pending and not pending.endswith(" ") else "") + raw if pending else raw
            try:
                tokens = shlex.split(line.rstrip("\\"), comments=True)
            except ValueError:  # an open quote: the command goes on
                pending = line
                continue
            if line.rstrip().endswith("\\"):
                pending = line.rstrip()[:-1] + " "
                continue
            pending = ""
            if tokens and is_command(tokens):
                out.append(line.strip())
        return out


def is_command(tokens: list[str]) -> bool:
    words = [t for t in tokens if not re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", t)]  # leading VAR=value
    if not words:
        return False
    first = words[0]
    return first in PROGRAMS or Path(first).name in PROGRAMS or first.startswith((".ci/", "./"))


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0

    def marker_before(k: int) -> str:
        j = k - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        return lines[j] if j >= 0 and lines[j].lstrip().startswith("<!--") else ""

    prev_blank = True
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"^(\s*)(```+|~~~+)\s*([\w+-]*)", line)
        if fence:
            indent, ticks, lang = fence.groups()
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(ticks):
                j += 1
            body = [x[len(indent):] if x.startswith(indent) else x for x in lines[i + 1:j]]
            out.append(Block(path, i + 2, lang, "\n".join(body), marker_before(i)))
            i, prev_blank = j + 1, False
            continue
        if prev_blank and line.startswith("    ") and line.strip():
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            body = lines[i:j]
            while body and not body[-1].strip():
                body.pop()
            width = min(len(x) - len(x.lstrip()) for x in body if x.strip())
            out.append(Block(path, i + 1, "", "\n".join(x[width:] for x in body), marker_before(i)))
            i, prev_blank = j, True
            continue
        # a comment line ends there (an HTML block): a code block may follow it directly
        prev_blank = not line.strip() or bool(re.fullmatch(r"\s*<!--.*-->\s*", line))
        i += 1
    return out


def all_blocks() -> list[Block]:
    return [b for p in documents() for b in blocks(p)]
