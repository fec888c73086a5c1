"""Imports point one way, as the architecture page's "Source layout" says (docs/contributing/architecture.md):
its two tables are this test's data.

Every import of ``src/orchestrator`` (module level and inside functions, relative ones resolved; those
under ``if TYPE_CHECKING:`` never run and are free) is read from the source, and each one that the tables
do not allow fails the test with its file and line.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Final

from tests.support.imports import Import, imports, modules, reached

ROOT: Final = Path(__file__).resolve().parents[2]
ARCHITECTURE: Final = ROOT / "docs" / "contributing" / "architecture.md"
PACKAGE: Final = ROOT / "src" / "orchestrator"
TOP: Final = PACKAGE.name


@dataclass(frozen=True)
class Layers:
    """The architecture page's tables: what each package may import, and what ships without server code."""

    #: package (``api``, ``errors``) -> the packages it may import; None for "anything".
    may_import: dict[str, frozenset[str] | None]
    #: The summary line's chain, ``cli → server → api, gateway → ...``, as its groups.
    summary: list[list[str]]
    #: Modules (``runner``, ``cli.octl``) whose imports, at any depth, reach no server code.
    ships_apart: list[str]
    #: Packages of ours and libraries that are server code.
    server_code: frozenset[str]


def _names(cell: str) -> list[str]:
    """The backticked names of a table cell, without a trailing ``/`` or ``.py``."""
    return [re.sub(r"(/|\.py)$", "", name) for name in re.findall(r"`([^`]+)`", cell)]


def _tables(text: str) -> Iterator[list[list[str]]]:
    """Each Markdown table of ``text``: its rows (header first, the separator left out) as cells."""
    rows: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", cell) for cell in cells):
                rows.append(cells)
        elif rows:
            yield rows
            rows = []


@cache
def layers() -> Layers:
    text = ARCHITECTURE.read_text()
    start = text.index("Source layout (`src/orchestrator/`)")
    end = text.find("\n## ", start)
    section = text[start : end if end != -1 else len(text)]
    tables = {rows[0][0]: rows for rows in _tables(section)}
    may_import: dict[str, frozenset[str] | None] = {}
    for package, _holds, allowed in tables["package"][1:]:
        (name,) = _names(package)
        may_import[name] = None if allowed == "anything" else frozenset(_names(allowed))
    paragraph = " ".join(section.split("\n\n")[0].splitlines())
    (chain,) = [code for code in re.findall(r"`([^`]+)`", paragraph) if "→" in code]
    summary = [[name.strip() for name in group.split(",")] for group in chain.split("→")]
    ((ships, server),) = tables["ships without server code"][1:]
    return Layers(may_import, summary, _names(ships), frozenset(_names(server)))


@cache
def graph() -> tuple[Import, ...]:
    return tuple(imports(PACKAGE))


def package_of(module: str) -> str:
    """``orchestrator.api.context`` -> ``api``; a library's name stays as it is."""
    parts = module.split(".")
    return parts[1] if parts[0] == TOP and len(parts) > 1 else parts[0]


def where(edge: Import) -> str:
    return f"{edge.path.relative_to(ROOT)}:{edge.line}"


def test_layering__every_package_has_a_row_and_every_row_a_package() -> None:
    packages = {package_of(module) for module in modules(PACKAGE)} - {TOP}

    assert [] == sorted(packages - set(layers().may_import)), "packages without a row in the layering table"
    assert [] == sorted(set(layers().may_import) - packages), "rows of the layering table without a package"


def test_layering__the_table_points_one_way() -> None:
    """No cycle among the allowed imports, and the summary line follows the table."""
    allowed = layers().may_import
    done: set[str] = set()

    def visit(package: str, path: tuple[str, ...]) -> None:
        assert package not in path, f"the layering table allows a cycle: {' → '.join((*path, package))}"
        if package in done:
            return
        for below in sorted(allowed.get(package) or ()):
            visit(below, (*path, package))
        done.add(package)

    for package in sorted(allowed):
        visit(package, ())
    summary = layers().summary
    refused = [
        f"{upper} → {lower}"
        for uppers, lowers in itertools.pairwise(summary)
        for upper in uppers
        for lower in lowers
        if allowed[upper] is not None and lower not in (allowed[upper] or ())
    ]
    assert [] == refused, "the summary line says so, the layering table does not: " + ", ".join(refused)


def test_layering__every_import_is_allowed_by_readme() -> None:
    allowed = layers().may_import
    offending = []
    for edge in graph():
        if not (edge.target == TOP or edge.target.startswith(f"{TOP}.")):
            continue  # a library: the second table's business
        importer, imported = package_of(edge.importer), package_of(edge.target)
        if imported in (importer, TOP):
            continue
        rule = frozenset() if importer == TOP else allowed.get(importer, frozenset())
        if rule is None or imported in rule:
            continue
        may = ", ".join(sorted(rule)) or "nothing of ours"
        offending.append(f"{where(edge)}: {importer} imports {edge.target}; {importer} may import: {may}")

    assert [] == offending, "\n".join(["imports the 'Source layout' table does not allow:", *offending])


def test_layering__what_ships_apart_reaches_no_server_code() -> None:
    """The runner, the agent, ``octl`` and the launchers ship without the server: nothing they import, at
    any depth, is server code (the architecture page's second table). Each import that crosses into it is
    named once, with the chain of imports that leads there."""
    starts = layers().ships_apart
    roots = [
        module
        for module in modules(PACKAGE)
        for start in starts
        if module == f"{TOP}.{start}" or module.startswith(f"{TOP}.{start}.")
    ]
    server = layers().server_code
    crossings: dict[Import, list[Import]] = {}
    for chain in reached(graph(), roots).values():
        crossing = next((i for i, edge in enumerate(chain) if package_of(edge.target) in server), None)
        if crossing is not None:
            crossings.setdefault(chain[crossing], chain[: crossing + 1])
    offending = [
        f"{where(edge)}: {edge.importer} imports {edge.target}, server code, loaded by "
        + " → ".join([chain[0].importer, *(step.target for step in chain)])
        for edge, chain in sorted(crossings.items(), key=lambda item: where(item[0]))
    ]

    assert [] == [start for start in starts if not any(root.startswith(f"{TOP}.{start}") for root in roots)]
    assert [] == offending, "\n".join(["server code reached from what ships without it:", *offending])


def may_import_line(readme: Path) -> str:
    """The first sentence of a package README's paragraph that starts with ``May import:``."""
    paragraphs = [" ".join(p.split()) for p in readme.read_text().split("\n\n")]
    (paragraph,) = [p for p in paragraphs if p.startswith("May import:")]
    return re.split(r"\.(?:\s|$)", paragraph.removeprefix("May import:"), maxsplit=1)[0]


def test_layering__each_package_readme_says_what_its_row_says() -> None:
    """Every package folder has a README.md whose ``May import:`` sentence names exactly the packages of its
    row in the layering table (a library it names unquoted is not one of ours), or says "nothing"/"anything"
    as the row does."""
    differing = []
    for package, allowed in sorted(layers().may_import.items()):
        if not (PACKAGE / package).is_dir():
            continue
        readme = PACKAGE / package / "README.md"
        if not readme.is_file():
            differing.append(f"{readme.relative_to(ROOT)}: missing")
            continue
        line = may_import_line(readme)
        names = set(_names(line))
        if allowed is None:
            ok = not names and line.split()[:1] == ["anything"]
        elif not allowed:
            ok = not names and line.split()[:1] == ["nothing"]
        else:
            ok = names == allowed
        if not ok:
            row = "anything" if allowed is None else ", ".join(sorted(allowed)) or "nothing"
            differing.append(f"{readme.relative_to(ROOT)}: 'May import:{line}', the table's row: {row}")

    assert [] == differing, "\n".join(["package READMEs that disagree with the layering table:", *differing])
