"""Tests import their helpers from ``tests/support``, never from a test module or a conftest.

A helper in a test module is imported with that module's tests (and collected twice); one in a conftest
is a second copy of it, not the module pytest loaded. Every import of ``tests/`` (module level and inside
functions, relative ones resolved) of a module of ``tests`` must name ``tests.support`` or one of its
modules; each other one fails the test with its file and line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from tests.support.imports import imports

TESTS: Final = Path(__file__).resolve().parents[1]
SUPPORT: Final = "tests.support"


def foreign_imports(tests_dir: Path) -> list[str]:
    """``file:line: importer imports target`` for each import of a module of ``tests_dir`` (the package
    ``tests``) that is not ``tests.support`` or one of its modules."""
    root = tests_dir.parent
    return [
        f"{edge.path.relative_to(root)}:{edge.line}: {edge.importer} imports {edge.target}"
        for edge in imports(tests_dir)
        if edge.target.split(".")[0] == tests_dir.name
        and edge.target != SUPPORT
        and not edge.target.startswith(f"{SUPPORT}.")
    ]


def test_tests__import_helpers_only_from_tests_support() -> None:
    assert foreign_imports(TESTS) == []


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_foreign_imports__names_each_import_of_a_test_module_or_conftest(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    _write(tests / "__init__.py", "")
    _write(tests / "conftest.py", "from tests.support.orgs import Org\n")
    _write(tests / "support" / "__init__.py", "")
    _write(tests / "support" / "orgs.py", "class Org: ...\n")
    _write(tests / "support" / "stack.py", "from tests.conftest import Org\n")
    _write(tests / "unit" / "test_a.py", "from tests.support import orgs\nimport tests.support.orgs\n")
    _write(
        tests / "unit" / "test_b.py",
        "from tests.unit.test_a import orgs\n\n\ndef test_b() -> None:\n    import tests.conftest\n",
    )
    _write(tests / "acceptance" / "test_c.py", "from .conftest import stack\nfrom . import test_d\n")
    _write(tests / "acceptance" / "conftest.py", "def stack() -> None: ...\n")
    _write(tests / "acceptance" / "test_d.py", "")

    assert foreign_imports(tests) == [
        "tests/acceptance/test_c.py:1: tests.acceptance.test_c imports tests.acceptance.conftest",
        "tests/acceptance/test_c.py:2: tests.acceptance.test_c imports tests.acceptance.test_d",
        "tests/support/stack.py:1: tests.support.stack imports tests.conftest",
        "tests/unit/test_b.py:1: tests.unit.test_b imports tests.unit.test_a",
        "tests/unit/test_b.py:5: tests.unit.test_b imports tests.conftest",
    ]
