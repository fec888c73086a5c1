"""tf_states: what each state version is (serial, lineage, resources), how it was written (terraform or a
rollback, from which version) and by whom (issue 25)

Rows written before get their ``created_by`` from their deployment here; they keep NULL serial, lineage and
resources: the documents are sealed with the server key, which migrations do not hold, so the API reads
those values from the document when it answers such a row.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tf_states", schema=None) as batch_op:
        batch_op.add_column(sa.Column("serial", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("lineage", sa.String(length=100), nullable=True))
        batch_op.add_column(sa.Column("resources", sa.Integer(), nullable=True))
        batch_op.add_column(
            sa.Column("kind", sa.String(length=20), nullable=False, server_default="terraform")
        )
        batch_op.add_column(sa.Column("rolled_back_from", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("created_by", sa.String(length=100), nullable=True))
    # Who wrote the versions kept so far: the token that created their deployment (one statement).
    op.execute(
        "UPDATE tf_states SET created_by = (SELECT deployments.created_by FROM deployments"
        " WHERE deployments.id = tf_states.deployment_id) WHERE deployment_id IS NOT NULL"
    )


def downgrade() -> None:
    with op.batch_alter_table("tf_states", schema=None) as batch_op:
        batch_op.drop_column("created_by")
        batch_op.drop_column("rolled_back_from")
        batch_op.drop_column("kind")
        batch_op.drop_column("resources")
        batch_op.drop_column("lineage")
        batch_op.drop_column("serial")
