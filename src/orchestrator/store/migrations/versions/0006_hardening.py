"""hardening: results digest (write-once results), sealed provider configurations

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("results_digest", sa.String(length=64), nullable=True))
    # Existing configurations are sealed by the server at start-up: a migration has no server key.
    with op.batch_alter_table("module_providers", schema=None) as batch_op:
        batch_op.add_column(sa.Column("configuration_sealed", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("module_providers", schema=None) as batch_op:
        batch_op.drop_column("configuration_sealed")
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_column("results_digest")
