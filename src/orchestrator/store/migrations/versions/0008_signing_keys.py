"""signing keys of the OIDC issuer (workload identity)

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import orchestrator.store.schema

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_TS = orchestrator.store.schema.UTCDateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "signing_keys",
        sa.Column("kid", sa.String(length=64), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("algorithm", sa.String(length=10), nullable=False),
        sa.Column("public_jwk", sa.Text(), nullable=False),
        sa.Column("private_key_sealed", sa.Text(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("signs_from", _TS, nullable=False),
        sa.PrimaryKeyConstraint("kid", name=op.f("pk_signing_keys")),
        sa.UniqueConstraint("generation", name=op.f("uq_signing_keys_generation")),
    )


def downgrade() -> None:
    op.drop_table("signing_keys")
