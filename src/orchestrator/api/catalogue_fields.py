"""Field types the module catalogue's bodies share (resource types, module providers, modules, module
rules), with upstream's patterns and lengths."""

from __future__ import annotations

from typing import Annotated

from pydantic import StringConstraints

from orchestrator.api import schemas

NAME = r"^[a-z][a-z0-9_-]+$"
KIND = r"^[A-Za-z0-9][A-Za-z0-9-]{0,61}[A-Za-z0-9]$"

TypeId = Annotated[str, StringConstraints(pattern=schemas.ID_PATTERN, min_length=2, max_length=63)]
ModuleId = Annotated[str, StringConstraints(pattern=schemas.ID_PATTERN, min_length=2, max_length=100)]
Description = Annotated[str, StringConstraints(max_length=200)]
ResourceClass = Annotated[str, StringConstraints(pattern=KIND)]
ResourceId = Annotated[
    str,
    StringConstraints(
        pattern=r"^[a-z0-9]+(?:-+[a-z0-9]+)*(?:\.[a-z0-9]+(?:-+[a-z0-9]+)*)*$", min_length=1, max_length=63
    ),
]
