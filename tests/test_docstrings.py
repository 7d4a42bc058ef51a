"""What the docstrings tell a reader to run or open exists: every ``python -m``
module, every script, every repository file they name; a ``mpifl.main`` command
with a job file loads with its overrides."""

from __future__ import annotations

import ast
import importlib.util
import re

import pytest
from helpers import REPO

from mpifl import config
from mpifl.errors import ConfigError

MODULE = re.compile(r"python3? -m (mpifl[\w.]*)")
SCRIPT = re.compile(r"python3? ((?:bench|jobs|tests)/[\w./-]+\.py)")
FILE = re.compile(r"(?<![\w/<.-])((?:jobs|docs|bench|slurm|tests|mpifl)/[\w./-]*\w\.(?:yaml|md|py|sh|sbatch|txt))\b")
# a job run with overrides; a command with placeholders (CONFIG.yaml, [...]) is a form, not a command
RUN = re.compile(r"-m mpifl\.main ((?:jobs/)[\w./-]+\.yaml)((?: [\w.]+=[^\s`]+)*)")


def docstrings() -> list[tuple[str, str]]:
    """(where, text) of every module, class and function docstring of mpifl/, bench/, tests/."""
    out = []
    files = [*(REPO / "mpifl").rglob("*.py"), *(REPO / "bench").glob("*.py"), *(REPO / "tests").rglob("*.py")]
    for path in sorted(files):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc:
                    line = getattr(node, "lineno", 1)
                    out.append((f"{path.relative_to(REPO)}:{line}", doc))
    return out


@pytest.mark.slow
def test_every_module_script_and_file_a_docstring_names_exists():
    docs = docstrings()
    assert len(docs) > 200
    missing = []
    for where, text in docs:
        text = " ".join(text.split())  # a command may wrap
        for m in MODULE.finditer(text):
            if importlib.util.find_spec(m.group(1)) is None:
                missing.append(f"{where}: module {m.group(1)}")
        for m in [*SCRIPT.finditer(text), *FILE.finditer(text)]:
            if not (REPO / m.group(1)).exists():
                missing.append(f"{where}: file {m.group(1)}")
    assert not missing, "\n".join(missing)


@pytest.mark.slow
def test_every_docstring_run_command_loads():
    bad, seen = [], 0
    for where, text in docstrings():
        for m in RUN.finditer(" ".join(text.split())):
            seen += 1
            try:
                config.load(REPO / m.group(1), m.group(2).split())
            except ConfigError as e:
                bad.append(f"{where}: {m.group(0)}: {e}")
    assert seen > 20
    assert not bad, "\n".join(bad)
