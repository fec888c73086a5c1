"""control plane

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import orchestrator.store.schema

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "orgs",
        sa.Column("id", sa.String(length=50), nullable=False),
        sa.Column("uuid", sa.Uuid(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("created_by", sa.String(length=100), nullable=False),
        sa.Column("created_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_orgs")),
        sa.UniqueConstraint("uuid", name=op.f("uq_orgs_uuid")),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("org_id", sa.String(length=50), nullable=True),
        sa.Column("role", sa.String(length=20), nullable=False),
        sa.Column("description", sa.String(length=200), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("created_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["org_id"], ["orgs.id"], name=op.f("fk_api_tokens_org_id_orgs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
    )
    op.create_table(
        "env_types",
        sa.Column("org_id", sa.String(length=50), nullable=False),
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("uuid", sa.Uuid(), nullable=False),
        sa.Column("display_name", sa.String(length=60), nullable=False),
        sa.Column("created_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["org_id"], ["orgs.id"], name=op.f("fk_env_types_org_id_orgs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("org_id", "id", name=op.f("pk_env_types")),
        sa.UniqueConstraint("uuid", name=op.f("uq_env_types_uuid")),
    )
    op.create_table(
        "projects",
        sa.Column("org_id", sa.String(length=50), nullable=False),
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("uuid", sa.Uuid(), nullable=False),
        sa.Column("display_name", sa.String(length=60), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("created_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["org_id"], ["orgs.id"], name=op.f("fk_projects_org_id_orgs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("org_id", "id", name=op.f("pk_projects")),
        sa.UniqueConstraint("uuid", name=op.f("uq_projects_uuid")),
    )
    op.create_table(
        "runners",
        sa.Column("org_id", sa.String(length=50), nullable=False),
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("description", sa.String(length=500), nullable=True),
        sa.Column("type", sa.String(length=40), nullable=False),
        sa.Column(
            "configuration",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("config_secret", sa.Text(), nullable=True),
        sa.Column("state_type", sa.String(length=40), nullable=False),
        sa.Column(
            "state_configuration",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("created_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["org_id"], ["orgs.id"], name=op.f("fk_runners_org_id_orgs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("org_id", "id", name=op.f("pk_runners")),
    )
    op.create_table(
        "envs",
        sa.Column("org_id", sa.String(length=50), nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("uuid", sa.Uuid(), nullable=False),
        sa.Column("env_type_id", sa.String(length=64), nullable=False),
        sa.Column("display_name", sa.String(length=60), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("status_message", sa.String(length=1000), nullable=True),
        sa.Column("runner_id", sa.String(length=64), nullable=True),
        sa.Column("created_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["org_id", "env_type_id"],
            ["env_types.org_id", "env_types.id"],
            name=op.f("fk_envs_org_id_env_type_id_env_types"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["org_id", "project_id"],
            ["projects.org_id", "projects.id"],
            name=op.f("fk_envs_org_id_project_id_projects"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["org_id", "runner_id"],
            ["runners.org_id", "runners.id"],
            name=op.f("fk_envs_org_id_runner_id_runners"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("org_id", "project_id", "id", name=op.f("pk_envs")),
        sa.UniqueConstraint("uuid", name=op.f("uq_envs_uuid")),
    )
    with op.batch_alter_table("envs", schema=None) as batch_op:
        batch_op.create_index("ix_envs_org_env_type", ["org_id", "env_type_id"], unique=False)
        batch_op.create_index("ix_envs_org_runner", ["org_id", "runner_id"], unique=False)

    op.create_table(
        "runner_rules",
        sa.Column("org_id", sa.String(length=50), nullable=False),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("runner_id", sa.String(length=64), nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=True),
        sa.Column("env_type_id", sa.String(length=64), nullable=True),
        sa.Column("created_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["org_id", "env_type_id"],
            ["env_types.org_id", "env_types.id"],
            name=op.f("fk_runner_rules_org_id_env_type_id_env_types"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["org_id", "project_id"],
            ["projects.org_id", "projects.id"],
            name=op.f("fk_runner_rules_org_id_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["org_id", "runner_id"],
            ["runners.org_id", "runners.id"],
            name=op.f("fk_runner_rules_org_id_runner_id_runners"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runner_rules")),
    )
    with op.batch_alter_table("runner_rules", schema=None) as batch_op:
        batch_op.create_index("ix_runner_rules_org_runner", ["org_id", "runner_id", "id"], unique=False)
    # At most one rule per (org, project_id, env_type_id), NULLs included.
    op.create_index(
        "uq_runner_rules_match",
        "runner_rules",
        ["org_id", sa.text("coalesce(project_id, '')"), sa.text("coalesce(env_type_id, '')")],
        unique=True,
    )


def downgrade() -> None:
    op.drop_index("uq_runner_rules_match", table_name="runner_rules")
    with op.batch_alter_table("runner_rules", schema=None) as batch_op:
        batch_op.drop_index("ix_runner_rules_org_runner")

    op.drop_table("runner_rules")
    with op.batch_alter_table("envs", schema=None) as batch_op:
        batch_op.drop_index("ix_envs_org_runner")
        batch_op.drop_index("ix_envs_org_env_type")

    op.drop_table("envs")
    op.drop_table("runners")
    op.drop_table("projects")
    op.drop_table("env_types")
    op.drop_table("api_tokens")
    op.drop_table("orgs")
