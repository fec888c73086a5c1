from __future__ import annotations

from alembic import context

from orchestrator.store.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through `orchestrator migrate`")

context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
context.run_migrations()
