"""Checkpoint cleanup finds the pointers to a page's checkpoints through indexes.

Revision ID: 0005
Revises: 0004

Every sealed run's `checkpoint_cleanup` row (§9.6, store/cleanup.py) asks which runs point at a page of its
checkpoints, which threads are based on them and which checkpoints extend them. Indexes on
`runs.start_checkpoint_id`, `threads.base_checkpoint_id` and `checkpoints.base_id` make each lookup a search instead
of a scan whose cost grows with every run stored. On PostgreSQL each `CREATE INDEX` blocks writes to its table while
it builds: on a large database, apply this revision while no worker runs, or expect steps to wait for the build.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_BASED = sa.text("base_checkpoint_id IS NOT NULL")


def upgrade() -> None:
    op.create_index("ix_checkpoints_base_id", "checkpoints", ["base_id"], unique=False)
    op.create_index("ix_runs_start_checkpoint_id", "runs", ["start_checkpoint_id"], unique=False)
    op.create_index(
        "ix_threads_base_checkpoint_id", "threads", ["base_checkpoint_id"], unique=False,
        sqlite_where=_BASED, postgresql_where=_BASED,
    )  # fmt: skip


def downgrade() -> None:
    op.drop_index("ix_threads_base_checkpoint_id", table_name="threads")
    op.drop_index("ix_runs_start_checkpoint_id", table_name="runs")
    op.drop_index("ix_checkpoints_base_id", table_name="checkpoints")
