"""managed runners: their records, and the tags rules, environments and deployments require

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import orchestrator.store.schema

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_TS = orchestrator.store.schema.UTCDateTime(timezone=True)
_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    for table in ("runner_rules", "envs", "deployments"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("required_tags", _JSON, nullable=True))
    op.create_table(
        "managed_runners",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("tags", _JSON, nullable=False),
        sa.Column("registered_at", _TS, nullable=False),
        sa.Column("last_seen_at", _TS, nullable=False),
        sa.Column("claim_deployment_id", sa.Uuid(), nullable=True),
        sa.Column("claim_lease_until", _TS, nullable=True),
        sa.Column("claim_used_at", _TS, nullable=True),
        sa.ForeignKeyConstraint(
            ["claim_deployment_id"],
            ["deployments.id"],
            name=op.f("fk_managed_runners_claim_deployment_id_deployments"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_managed_runners")),
        sa.UniqueConstraint("claim_deployment_id", name=op.f("uq_managed_runners_claim_deployment_id")),
        sa.UniqueConstraint("name", name=op.f("uq_managed_runners_name")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_managed_runners_token_hash")),
    )
    op.create_index("ix_managed_runners_last_seen", "managed_runners", ["last_seen_at"], unique=False)
    op.create_index("ix_managed_runners_claim_lease", "managed_runners", ["claim_lease_until"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_managed_runners_claim_lease", table_name="managed_runners")
    op.drop_index("ix_managed_runners_last_seen", table_name="managed_runners")
    op.drop_table("managed_runners")
    for table in ("deployments", "envs", "runner_rules"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("required_tags")
