"""deployments: when a cancel was asked for (the run is being stopped; it ends ``cancelled``)

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import orchestrator.store.schema

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_TS = orchestrator.store.schema.UTCDateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cancel_requested_at", _TS, nullable=True))
        batch_op.add_column(sa.Column("cancel_requested_by", sa.String(length=100), nullable=True))
        batch_op.add_column(sa.Column("cancel_sent_at", _TS, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_column("cancel_sent_at")
        batch_op.drop_column("cancel_requested_by")
        batch_op.drop_column("cancel_requested_at")
