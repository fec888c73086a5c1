"""agent commands, event inbox and presence

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import orchestrator.store.schema

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_TS = orchestrator.store.schema.UTCDateTime(timezone=True)
_OPEN = sa.text("state IN ('pending', 'leased')")


def upgrade() -> None:
    op.create_table(
        "agent_commands",
        sa.Column("id", sa.String(length=300), nullable=False),
        sa.Column("org_id", sa.String(length=50), nullable=False),
        sa.Column("runner_id", sa.String(length=64), nullable=False),
        sa.Column("deployment_id", sa.Uuid(), nullable=False),
        sa.Column("type", sa.String(length=50), nullable=False),
        sa.Column(
            "envelope",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("available_at", _TS, nullable=False),
        sa.Column("expires_at", _TS, nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
        sa.Column("completed_at", _TS, nullable=True),
        sa.Column("reason", sa.String(length=4096), nullable=True),
        sa.Column("job_id", sa.String(length=300), nullable=True),
        sa.Column("job_created_at", _TS, nullable=True),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name=op.f("fk_agent_commands_deployment_id_deployments"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["org_id"], ["orgs.id"], name=op.f("fk_agent_commands_org_id_orgs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agent_commands")),
    )
    with op.batch_alter_table("agent_commands", schema=None) as batch_op:
        batch_op.create_index(
            "ix_agent_commands_queue",
            ["org_id", "runner_id", "created_at"],
            unique=False,
            sqlite_where=_OPEN,
            postgresql_where=_OPEN,
        )
        batch_op.create_index("ix_agent_commands_state_available", ["state", "available_at"], unique=False)
        batch_op.create_index("ix_agent_commands_state_expires", ["state", "expires_at"], unique=False)
        batch_op.create_index("ix_agent_commands_deployment", ["deployment_id"], unique=False)

    op.create_table(
        "agent_event_inbox",
        sa.Column("org_id", sa.String(length=50), nullable=False),
        sa.Column("runner_id", sa.String(length=64), nullable=False),
        sa.Column("event_id", sa.String(length=300), nullable=False),
        sa.Column("type", sa.String(length=50), nullable=False),
        sa.Column("deployment_id", sa.Uuid(), nullable=False),
        sa.Column("received_at", _TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["org_id"], ["orgs.id"], name=op.f("fk_agent_event_inbox_org_id_orgs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("org_id", "runner_id", "event_id", name=op.f("pk_agent_event_inbox")),
    )
    op.create_table(
        "agent_presence",
        sa.Column("org_id", sa.String(length=50), nullable=False),
        sa.Column("runner_id", sa.String(length=64), nullable=False),
        sa.Column("last_seen_at", _TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["org_id", "runner_id"],
            ["runners.org_id", "runners.id"],
            name=op.f("fk_agent_presence_org_id_runner_id_runners"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("org_id", "runner_id", name=op.f("pk_agent_presence")),
    )


def downgrade() -> None:
    op.drop_table("agent_presence")
    op.drop_table("agent_event_inbox")
    with op.batch_alter_table("agent_commands", schema=None) as batch_op:
        batch_op.drop_index("ix_agent_commands_deployment")
        batch_op.drop_index("ix_agent_commands_state_expires")
        batch_op.drop_index("ix_agent_commands_state_available")
        batch_op.drop_index("ix_agent_commands_queue", sqlite_where=_OPEN, postgresql_where=_OPEN)
    op.drop_table("agent_commands")
