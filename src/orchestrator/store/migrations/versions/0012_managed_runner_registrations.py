"""managed runner registration credentials: tags bound by the platform admin (issue 26)

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import orchestrator.store.schema

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_TS = orchestrator.store.schema.UTCDateTime(timezone=True)
_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "managed_runner_registrations",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("tags", _JSON, nullable=False),
        sa.Column("description", sa.String(length=200), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_managed_runner_registrations")),
        sa.UniqueConstraint("secret_hash", name=op.f("uq_managed_runner_registrations_secret_hash")),
    )


def downgrade() -> None:
    op.drop_table("managed_runner_registrations")
