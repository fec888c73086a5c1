"""Every command, YAML, HCL, JSON and Dockerfile example of the docs site is run or applied by a test.

A block fenced with one of those languages carries a marker ``<!-- example: NAME -->``
(tests/support/docs.py; docs/contributing/docs.md), and a test asks for it by name with
``docs_example("NAME")``. This module fails when a page holds such a block without a marker or with a
name no test asks for, and when a test asks for a name no page has. Which test runs a block is found by
reading the tests' source (their ``docs_example("...")`` calls), so a block no test reads fails here
whether or not the suite runs the test that would read it.
Blocks of other languages (``text``: output as printed, diagrams) are not examples; a block without a
language is refused, so that each says which it is.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from tests.support.docs import CHECKED, DOCS, ROOT, UNCHECKED, blocks, examples, pages
from tests.support.docs import markers as page_markers

TESTS = ROOT / "tests"


@cache
def asked_for() -> dict[str, list[str]]:
    """Example name -> the test files whose source calls ``docs_example("name")``."""
    found: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("*.py")):
        if path.name == "docs.py" and path.parent.name == "support":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            function = node.func
            name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
            first = node.args[0]
            if name == "docs_example" and isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.setdefault(first.value, []).append(str(path.relative_to(ROOT)))
    return found


def test_pages__every_example_block_has_a_marker() -> None:
    unmarked = [
        f"{block.where()}: a {block.language} block without <!-- example: NAME --> before it"
        for page in pages()
        for block in blocks(page)
        if block.language in CHECKED and block.name is None
    ]
    assert [] == unmarked


def test_pages__every_block_says_its_language() -> None:
    unknown = [
        f"{block.where()}: fence language {block.language or '(none)'!r}: use one of "
        f"{sorted(CHECKED | UNCHECKED)}"
        for page in pages()
        for block in blocks(page)
        if block.language not in CHECKED | UNCHECKED
    ]
    assert [] == unknown


def test_pages__markers_name_example_blocks_only() -> None:
    misplaced = [
        f"{block.where()}: marker {block.name} on a {block.language} block"
        for page in pages()
        for block in blocks(page)
        if block.name is not None and block.language not in CHECKED
    ]
    assert [] == misplaced


def test_pages__every_marker_is_before_a_block() -> None:
    """A marker separated from its block by text names nothing (its block would be unmarked)."""
    marked = sum(1 for page in pages() for block in blocks(page) if block.name is not None)
    markers = sum(len(page_markers(page)) for page in pages())
    assert markers == marked


def test_examples__each_is_asked_for_by_a_test() -> None:
    named = examples()  # also fails on two blocks of one name
    unrun = [f"{block.where()}: {name}" for name, block in sorted(named.items()) if name not in asked_for()]
    assert [] == unrun, "examples no test runs (call docs_example(NAME) in the test that runs it)"


def test_tests__ask_only_for_examples_the_docs_have() -> None:
    missing = {name: files for name, files in asked_for().items() if name not in examples()}
    assert {} == missing


def test_docs__the_contributor_page_explains_the_markers() -> None:
    page = (DOCS / "contributing" / "docs.md").read_text(encoding="utf-8")
    assert "<!-- example: " in page and "docs_example(" in page


def test_blocks__are_read_as_the_site_shows_them(tmp_path: Path) -> None:
    """Indented fences (in a list item) lose their indentation; a marker is kept across one blank line
    and dropped by any text between it and the next block."""
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- example: a -->\n\n```sh\necho a\n```\n\n"
        "1. step\n\n   <!-- example: b -->\n   ```yaml\n   key: value\n   ```\n\n"
        "<!-- example: c -->\nsome text\n\n```json\n{}\n```\n\n```text\nout\n```\n"
    )

    found = blocks(page)

    assert [(b.name, b.language, b.text, b.line) for b in found] == [
        ("a", "sh", "echo a\n", 3),
        ("b", "yaml", "key: value\n", 10),
        (None, "json", "{}\n", 17),
        (None, "text", "out\n", 21),
    ]
