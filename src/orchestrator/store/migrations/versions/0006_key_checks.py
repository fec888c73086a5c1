"""key check value of the server key

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import orchestrator.store.schema

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_TS = orchestrator.store.schema.UTCDateTime(timezone=True)


def upgrade() -> None:
    # Empty after the upgrade: the first server to start records its key's check value.
    op.create_table(
        "key_checks",
        sa.Column("id", sa.String(length=20), nullable=False),
        sa.Column("check_value", sa.String(length=64), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_key_checks")),
    )


def downgrade() -> None:
    op.drop_table("key_checks")
