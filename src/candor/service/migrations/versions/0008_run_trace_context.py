"""Runs record the trace context they were created in: `runs.trace_context`, NULL for old runs.

Revision ID: 0008
Revises: 0007

The W3C `traceparent` of the request that created or resumed the run (or of the attempt that started it), so that
the worker which claims the run, in any process, traces its attempts under it (docs/telemetry.md). A nullable ADD
COLUMN: no rewrite of the runs table on either database, and existing runs simply have no trace context.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("trace_context", sa.String(length=128), nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "trace_context")
