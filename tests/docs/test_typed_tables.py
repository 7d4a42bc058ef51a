"""A reproduction page's table is rendered from a record or says why it is typed
(``<!-- typed: WHY -->`` on the line before it): ``python -m mpifl.docs --check``
names every other one (mpifl/docs/typed.py)."""

from __future__ import annotations

from mpifl.docs import typed

PAGE = """# P

## Rendered

<!-- generated:record data/x.csv -->
| a | b |
|---|---|
| 1 | 2 |
<!-- /generated -->

## Declared

<!-- typed: a peer's figures -->
| a | b |
|---|---|

## Undeclared

<!-- typed: a reason for the paragraph below, not for the table -->
Some words.

| c | d |
|---|---|
| 3 | 4 |
"""


def test_only_tables_outside_generated_blocks_count_with_their_reasons():
    found = typed.tables(PAGE, "p.md")
    assert [(t.line, t.heading, t.why) for t in found] == [(14, "Declared", "a peer's figures"),
                                                           (22, "Undeclared", None)]


def test_check_names_the_undeclared_table_and_passes_once_it_is_declared(tmp_path):
    pages = tmp_path / typed.PAGES
    pages.mkdir(parents=True)
    (pages / "p.md").write_text(PAGE)
    [line] = typed.undeclared(tmp_path)
    assert line.startswith("docs/reproductions/p.md:22 (Undeclared): a table typed by hand")
    (pages / "p.md").write_text(PAGE.replace("Some words.\n\n| c", "Some words.\n\n<!-- typed: notes -->\n| c"))
    assert typed.undeclared(tmp_path) == []


def test_every_table_on_the_projects_pages_is_rendered_or_declared():
    assert typed.undeclared() == []
