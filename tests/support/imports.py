"""The import graph of a package, read from its source (nothing is imported): every ``import`` and
``from ... import``, at module level and inside functions, relative ones resolved, each with its file and
line. Imports under ``if TYPE_CHECKING:`` are left out: they never run.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Import:
    """``importer`` (a module of the package) imports ``target`` (a module of the package, or the top-level
    name of a library) at ``path``:``line``."""

    importer: str
    target: str
    path: Path
    line: int


def modules(package_dir: Path) -> dict[str, Path]:
    """Every module of the package in ``package_dir``, by dotted name (a package by its ``__init__``)."""
    found: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [package_dir.name, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements under ``node``, at any depth, except those of ``if TYPE_CHECKING:`` bodies."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _import_nodes(ast.Module(body=[other], type_ignores=[]))
        else:
            yield from _import_nodes(child)


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module ``from ... import`` reads from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports(package_dir: Path) -> list[Import]:
    """Every import of every module of the package, in file and line order.

    ``from a.b import c`` imports module ``a.b.c`` if the package has one, else ``a.b``; an import of a
    module of the package also imports the packages above it (their ``__init__`` runs), which
    :func:`reached` follows. A library is named by its top-level name (``sqlalchemy``).
    """
    known = modules(package_dir)
    top = package_dir.name
    found: list[Import] = []

    def named(name: str) -> str:
        return name if name == top or name.startswith(f"{top}.") else name.split(".")[0]

    for importer, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _import_nodes(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [named(alias.name) for alias in node.names]
            else:
                source = _resolve(importer, path.name == "__init__.py", node)
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    targets.append(sub if sub in known else named(source))
            found.extend(Import(importer, target, path, node.lineno) for target in dict.fromkeys(targets))
    return found


def _parents(module: str) -> Iterator[str]:
    parts = module.split(".")
    for end in range(len(parts) - 1, 0, -1):
        yield ".".join(parts[:end])


def reached(graph: Iterable[Import], roots: Iterable[str]) -> dict[str, list[Import]]:
    """Every module and library that importing ``roots`` loads, each with one shortest chain of imports
    from a root to it (empty for a root; a package reached as the parent of its module has the chain of
    that module)."""
    by_importer: dict[str, list[Import]] = {}
    for edge in graph:
        by_importer.setdefault(edge.importer, []).append(edge)
    chains: dict[str, list[Import]] = {}
    queue: deque[str] = deque()

    def visit(module: str, chain: list[Import]) -> None:
        for name in (module, *_parents(module)):
            if name not in chains:
                chains[name] = chain
                queue.append(name)

    for root in roots:
        visit(root, [])
    while queue:
        module = queue.popleft()
        for edge in by_importer.get(module, []):
            visit(edge.target, [*chains[module], edge])
    return chains
