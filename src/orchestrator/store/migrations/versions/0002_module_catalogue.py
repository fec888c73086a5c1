"""module catalogue: resource types, module providers, modules and their versions, module rules

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import orchestrator.store.schema

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "resource_types",
        sa.Column("org_id", sa.String(length=50), nullable=False),
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("description", sa.String(length=200), nullable=True),
        sa.Column(
            "output_schema",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("is_developer_accessible", sa.Boolean(), nullable=False),
        sa.Column("built_in", sa.Boolean(), nullable=False),
        sa.Column("created_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["org_id"], ["orgs.id"], name=op.f("fk_resource_types_org_id_orgs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("org_id", "id", name=op.f("pk_resource_types")),
    )
    op.create_table(
        "module_providers",
        sa.Column("org_id", sa.String(length=50), nullable=False),
        sa.Column("provider_type", sa.String(length=100), nullable=False),
        sa.Column("id", sa.String(length=100), nullable=False),
        sa.Column("description", sa.String(length=200), nullable=True),
        sa.Column("source", sa.String(length=100), nullable=False),
        sa.Column("version_constraint", sa.String(length=100), nullable=False),
        sa.Column(
            "configuration",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("created_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["org_id"], ["orgs.id"], name=op.f("fk_module_providers_org_id_orgs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("org_id", "provider_type", "id", name=op.f("pk_module_providers")),
    )
    op.create_table(
        "modules",
        sa.Column("org_id", sa.String(length=50), nullable=False),
        sa.Column("id", sa.String(length=100), nullable=False),
        sa.Column("uuid", sa.Uuid(), nullable=False),
        sa.Column("resource_type", sa.String(length=64), nullable=False),
        sa.Column("description", sa.String(length=200), nullable=True),
        sa.Column("module_source", sa.String(length=200), nullable=False),
        sa.Column("module_source_code", sa.Text(), nullable=True),
        sa.Column(
            "module_params",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "module_inputs",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "provider_mapping",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "dependencies",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "coprovisioned",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("version_id", sa.Uuid(), nullable=False),
        sa.Column("created_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["org_id", "resource_type"],
            ["resource_types.org_id", "resource_types.id"],
            name=op.f("fk_modules_org_id_resource_type_resource_types"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["org_id"], ["orgs.id"], name=op.f("fk_modules_org_id_orgs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("org_id", "id", name=op.f("pk_modules")),
        sa.UniqueConstraint("uuid", name=op.f("uq_modules_uuid")),
    )
    with op.batch_alter_table("modules", schema=None) as batch_op:
        batch_op.create_index("ix_modules_org_resource_type", ["org_id", "resource_type"], unique=False)

    op.create_table(
        "module_rules",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("org_id", sa.String(length=50), nullable=False),
        sa.Column("module_id", sa.String(length=100), nullable=False),
        sa.Column("resource_type", sa.String(length=64), nullable=False),
        sa.Column("resource_class", sa.String(length=63), nullable=False),
        sa.Column("resource_id", sa.String(length=63), nullable=True),
        sa.Column("project_id", sa.String(length=64), nullable=True),
        sa.Column("env_type_id", sa.String(length=64), nullable=True),
        sa.Column("env_id", sa.String(length=64), nullable=True),
        sa.Column("created_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "env_id IS NULL OR (project_id IS NOT NULL AND env_type_id IS NULL)",
            name="ck_module_rules_env_scope",
        ),
        sa.ForeignKeyConstraint(
            ["org_id", "env_type_id"],
            ["env_types.org_id", "env_types.id"],
            name=op.f("fk_module_rules_org_id_env_type_id_env_types"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["org_id", "module_id"],
            ["modules.org_id", "modules.id"],
            name=op.f("fk_module_rules_org_id_module_id_modules"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["org_id", "project_id", "env_id"],
            ["envs.org_id", "envs.project_id", "envs.id"],
            name=op.f("fk_module_rules_org_id_project_id_env_id_envs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["org_id", "project_id"],
            ["projects.org_id", "projects.id"],
            name=op.f("fk_module_rules_org_id_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_module_rules")),
    )
    with op.batch_alter_table("module_rules", schema=None) as batch_op:
        batch_op.create_index(
            "ix_module_rules_listing",
            ["org_id", "resource_type", "module_id", "resource_class", "id"],
            unique=False,
        )
        batch_op.create_index("ix_module_rules_org_module", ["org_id", "module_id"], unique=False)
    # At most one rule per match key of a resource type, NULLs included.
    op.create_index(
        "uq_module_rules_match",
        "module_rules",
        [
            "org_id",
            "resource_type",
            "resource_class",
            sa.text("coalesce(resource_id, '')"),
            sa.text("coalesce(project_id, '')"),
            sa.text("coalesce(env_type_id, '')"),
            sa.text("coalesce(env_id, '')"),
        ],
        unique=True,
    )

    op.create_table(
        "module_versions",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("org_id", sa.String(length=50), nullable=False),
        sa.Column("module_id", sa.String(length=100), nullable=False),
        sa.Column("resource_type", sa.String(length=64), nullable=False),
        sa.Column("description", sa.String(length=200), nullable=True),
        sa.Column("module_source", sa.String(length=200), nullable=False),
        sa.Column("module_source_code", sa.Text(), nullable=True),
        sa.Column(
            "module_params",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "module_inputs",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "provider_mapping",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "dependencies",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "coprovisioned",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("created_at", orchestrator.store.schema.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["org_id", "module_id"],
            ["modules.org_id", "modules.id"],
            name=op.f("fk_module_versions_org_id_module_id_modules"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_module_versions")),
    )
    with op.batch_alter_table("module_versions", schema=None) as batch_op:
        batch_op.create_index(
            "ix_module_versions_org_module_created", ["org_id", "module_id", "created_at", "id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("module_versions", schema=None) as batch_op:
        batch_op.drop_index("ix_module_versions_org_module_created")

    op.drop_table("module_versions")
    op.drop_index("uq_module_rules_match", table_name="module_rules")
    with op.batch_alter_table("module_rules", schema=None) as batch_op:
        batch_op.drop_index("ix_module_rules_org_module")
        batch_op.drop_index("ix_module_rules_listing")

    op.drop_table("module_rules")
    with op.batch_alter_table("modules", schema=None) as batch_op:
        batch_op.drop_index("ix_modules_org_resource_type")

    op.drop_table("modules")
    op.drop_table("module_providers")
    op.drop_table("resource_types")
