"""deployment object retention: objects_deleted_at

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import orchestrator.store.schema

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_TS = orchestrator.store.schema.UTCDateTime(timezone=True)
_KEPT = sa.text("objects_deleted_at IS NULL")


def upgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("objects_deleted_at", _TS, nullable=True))
        batch_op.create_index(
            "ix_deployments_objects_kept",
            ["completed_at"],
            unique=False,
            sqlite_where=_KEPT,
            postgresql_where=_KEPT,
        )


def downgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_index("ix_deployments_objects_kept", sqlite_where=_KEPT, postgresql_where=_KEPT)
        batch_op.drop_column("objects_deleted_at")
