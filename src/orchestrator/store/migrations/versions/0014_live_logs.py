"""deployment_log_chunks and deployment_phases: the live log's encrypted chunks and each deployment's phases
(issue 22)

The deployments kept so far get the phases their rows tell: ``queued`` when created, ``launching`` when
launched (if they were); their logs stay whole logs, without chunks.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import orchestrator.store.schema

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_TS = orchestrator.store.schema.UTCDateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "deployment_log_chunks",
        sa.Column("deployment_id", sa.Uuid(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("org_id", sa.String(length=50), nullable=False),
        sa.Column("phase", sa.String(length=20), nullable=False),
        sa.Column("received_at", _TS, nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name=op.f("fk_deployment_log_chunks_deployment_id_deployments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("deployment_id", "seq", name=op.f("pk_deployment_log_chunks")),
    )
    op.create_table(
        "deployment_phases",
        sa.Column("deployment_id", sa.Uuid(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("org_id", sa.String(length=50), nullable=False),
        sa.Column("phase", sa.String(length=20), nullable=False),
        sa.Column("started_at", _TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name=op.f("fk_deployment_phases_deployment_id_deployments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("deployment_id", "position", name=op.f("pk_deployment_phases")),
    )
    # The phases of the deployments kept so far, as their rows tell them (two statements).
    op.execute(
        "INSERT INTO deployment_phases (deployment_id, position, org_id, phase, started_at)"
        " SELECT id, 1, org_id, 'queued', created_at FROM deployments"
    )
    op.execute(
        "INSERT INTO deployment_phases (deployment_id, position, org_id, phase, started_at)"
        " SELECT id, 2, org_id, 'launching', launched_at FROM deployments WHERE launched_at IS NOT NULL"
    )


def downgrade() -> None:
    op.drop_table("deployment_phases")
    op.drop_table("deployment_log_chunks")
