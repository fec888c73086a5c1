"""``mypy`` with no arguments (as scripts/check runs it) checks the tests, the benchmarks and the scripts
too, as the development page says (docs/contributing/development.md): pyproject's ``[tool.mypy] files``
names every folder of Python code."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]


def test_mypy__checks_every_folder_of_python_code() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    folders = [
        path.name
        for path in sorted(ROOT.iterdir())
        if path.is_dir() and not path.name.startswith(".") and next(path.rglob("*.py"), None)
    ]

    assert config["strict"] is True
    assert folders == ["bench", "scripts", "src", "tests"]
    assert sorted(config["files"]) == folders
    # No arguments: the configuration decides what is checked.
    assert re.search(r" mypy$", (ROOT / "scripts" / "check").read_text(), re.M)
