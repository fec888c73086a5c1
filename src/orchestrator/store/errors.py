"""Translation of database errors into our error tree (the store is the edge that owns the database)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy.exc

from orchestrator.errors import ConflictError


@contextmanager
def conflict_on_integrity(message: str) -> Iterator[None]:
    try:
        yield
    except sqlalchemy.exc.IntegrityError as exc:
        raise ConflictError(message) from exc
