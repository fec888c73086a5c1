"""hardening: results digest (write-once results), agent token uses (JWT replay), sealed provider
configurations

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import orchestrator.store.schema

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_TS = orchestrator.store.schema.UTCDateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("results_digest", sa.String(length=64), nullable=True))
    op.create_table(
        "agent_token_uses",
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("replica", sa.String(length=64), nullable=False),
        sa.Column("first_used_at", _TS, nullable=False),
        sa.Column("expires_at", _TS, nullable=False),
        sa.Column("reusable_until", _TS, nullable=True),
        sa.PrimaryKeyConstraint("digest", name=op.f("pk_agent_token_uses")),
    )
    with op.batch_alter_table("agent_token_uses", schema=None) as batch_op:
        batch_op.create_index("ix_agent_token_uses_first_used", ["first_used_at"], unique=False)
        batch_op.create_index("ix_agent_token_uses_expires", ["expires_at"], unique=False)
    # Existing configurations are sealed by the server at start-up: a migration has no server key.
    with op.batch_alter_table("module_providers", schema=None) as batch_op:
        batch_op.add_column(sa.Column("configuration_sealed", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("module_providers", schema=None) as batch_op:
        batch_op.drop_column("configuration_sealed")
    op.drop_table("agent_token_uses")
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_column("results_digest")
