"""Every test module that compares results exactly says on what the equality holds.

A module whose text holds an exact comparison (``torch.equal``, ``array_equal``,
``.tobytes() ==``, ``assert_same_logs``, ``rtol=0, atol=0``, or the words bitwise,
identical, bit for bit) has a paragraph of its module docstring that starts with
``Bits:``. For floating-point results it names the processes, the CPU, the thread
count and the path (client by client, batched, the fused kernel) the equality holds
on, and whether it holds on AVX2 and AVX-512 CPUs alike; where only integers, bytes
or unchanged copies are compared exactly, it says so (docs/reliability.md, "Not
guaranteed", says which promises depend on the CPU).

Bits: this module compares no results of a computation; it reads the test files' text."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
EXACT = re.compile(r"torch\.equal|array_equal|\.tobytes\(\) ==|assert_same_logs|rtol=0,\s*atol=0"
                   r"|bitwise|identical|bit[ -]for[ -]bit", re.IGNORECASE)


def promise(text: str) -> str | None:
    """The ``Bits:`` paragraph of a module's docstring, or None where it has none."""
    doc = ast.get_docstring(ast.parse(text)) or ""
    for para in re.split(r"\n\s*\n", doc):
        if para.startswith("Bits:") and len(para.split()) > 3:
            return para
    return None


def missing(root: Path) -> list[str]:
    """The Python files under ``root`` with an exact comparison and no ``Bits:`` paragraph."""
    out = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        if EXACT.search(text) and promise(text) is None:
            out.append(str(path.relative_to(root)))
    return out


def test_every_module_with_an_exact_comparison_says_on_what_it_holds():
    assert len([p for p in TESTS.rglob("*.py") if EXACT.search(p.read_text())]) > 50  # the patterns still find them
    gone = missing(TESTS)
    assert gone == [], f"no 'Bits:' paragraph in the module docstring of {', '.join(gone)} (see this module's)"


@pytest.mark.parametrize(("doc", "found"), [
    ('"""Two runs compare."""\nassert torch.equal(a, b)\n', False),
    ('"""Two runs.\n\nBits:\n"""\nassert torch.equal(a, b)\n', False),  # an empty promise is none
    ('"""Two runs.\n\nBits: one process, one CPU, any x86 kind."""\nassert torch.equal(a, b)\n', True),
    ('"""No comparison at all."""\nassert a == b\n', True)])
def test_a_module_without_its_paragraph_is_named(tmp_path, doc, found):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "test_x.py").write_text(doc)
    assert missing(tmp_path) == ([] if found else ["sub/test_x.py"])
