"""deployments and state

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import orchestrator.store.schema

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "deployments",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("org_id", sa.String(length=50), nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("env_id", sa.String(length=64), nullable=False),
        sa.Column("env_uuid", sa.Uuid(), nullable=False),
        sa.Column("runner_id", sa.String(length=64), nullable=False),
        sa.Column("mode", sa.String(length=20), nullable=False),
        sa.Column("plan_only", sa.Boolean(), nullable=False),
        sa.Column("rollback_to_deployment_id", sa.Uuid(), nullable=True),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("status_message", sa.String(length=4000), nullable=False),
        sa.Column(
            "manifest",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("tf", sa.Text(), nullable=False),
        sa.Column(
            "graph",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("bundle_key", sa.String(length=300), nullable=False),
        sa.Column("encrypted_outputs_recipient", sa.String(length=200), nullable=True),
        sa.Column("encrypted_logs_recipient", sa.String(length=200), nullable=True),
        sa.Column("runner_log_level", sa.String(length=10), nullable=False),
        sa.Column("idempotency_key_digest", sa.String(length=64), nullable=True),
        sa.Column("request_digest", sa.String(length=64), nullable=False),
        sa.Column("created_by", sa.String(length=100), nullable=False),
        sa.Column("created_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.Column("completed_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=True),
        sa.Column("outputs", sa.Text(), nullable=True),
        sa.Column(
            "metrics",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "error",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("logs_key", sa.String(length=300), nullable=True),
        sa.Column("logs_size", sa.Integer(), nullable=True),
        sa.Column("dispatch_state", sa.String(length=20), nullable=False),
        sa.Column("dispatch_owner", sa.String(length=200), nullable=True),
        sa.Column(
            "dispatch_lease_until", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=True
        ),
        sa.Column("dispatch_attempts", sa.Integer(), nullable=False),
        sa.Column("handle", sa.String(length=500), nullable=True),
        sa.Column("launched_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=True),
        sa.Column("next_check_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=True),
        sa.Column("exited_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=True),
        sa.Column("timeout_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["org_id"], ["orgs.id"], name=op.f("fk_deployments_org_id_orgs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployments")),
    )
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.create_index("ix_deployments_dispatch", ["dispatch_state", "next_check_at"], unique=False)
        batch_op.create_index("ix_deployments_env_created", ["env_uuid", "created_at"], unique=False)
        batch_op.create_index("ix_deployments_org_created", ["org_id", "created_at"], unique=False)
        batch_op.create_index(
            "uq_deployments_executing",
            ["env_uuid"],
            unique=True,
            sqlite_where=sa.text("status = 'executing'"),
            postgresql_where=sa.text("status = 'executing'"),
        )
        batch_op.create_index("uq_deployments_idempotency", ["org_id", "idempotency_key_digest"], unique=True)

    op.create_table(
        "tf_state_locks",
        sa.Column("env_uuid", sa.Uuid(), nullable=False),
        sa.Column("org_id", sa.String(length=50), nullable=False),
        sa.Column("lock_id", sa.String(length=200), nullable=False),
        sa.Column(
            "info",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("deployment_id", sa.Uuid(), nullable=True),
        sa.Column("created_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["org_id"], ["orgs.id"], name=op.f("fk_tf_state_locks_org_id_orgs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("env_uuid", name=op.f("pk_tf_state_locks")),
    )
    op.create_table(
        "tf_states",
        sa.Column("env_uuid", sa.Uuid(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("org_id", sa.String(length=50), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("md5", sa.String(length=32), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("deployment_id", sa.Uuid(), nullable=True),
        sa.Column("created_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["org_id"], ["orgs.id"], name=op.f("fk_tf_states_org_id_orgs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("env_uuid", "version", name=op.f("pk_tf_states")),
    )


def downgrade() -> None:
    op.drop_table("tf_states")
    op.drop_table("tf_state_locks")
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_index("uq_deployments_idempotency")
        batch_op.drop_index(
            "uq_deployments_executing",
            sqlite_where=sa.text("status = 'executing'"),
            postgresql_where=sa.text("status = 'executing'"),
        )
        batch_op.drop_index("ix_deployments_org_created")
        batch_op.drop_index("ix_deployments_env_created")
        batch_op.drop_index("ix_deployments_dispatch")

    op.drop_table("deployments")
