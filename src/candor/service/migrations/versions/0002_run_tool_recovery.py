"""Runs record their `tool_recovery` mode: `runs.tool_recovery`, "declared" for existing rows.

Revision ID: 0002
Revises: 0001

A plain ADD COLUMN with a server default works on SQLite and PostgreSQL alike and keeps the runs table (and its
guard triggers) in place; existing runs were all hosted with "declared", which the default records. The allowed
values are checked where runs are accepted (protocol/tool_recovery.py), not by a constraint, because a SQLite
CHECK would need the table rebuilt.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "runs", sa.Column("tool_recovery", sa.String(length=32), nullable=False, server_default="declared")
    )


def downgrade() -> None:
    op.drop_column("runs", "tool_recovery")
