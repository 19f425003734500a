"""The console's thread list reads a page of a workspace's threads from an index.

Revision ID: 0006
Revises: 0005

`GET /v1/threads` (the run inspector of the console) lists a workspace's threads newest first. Without an index on
(`workspace_id`, `created_at`, `id`) each page would read and sort every thread of the workspace; with it a page is
an index range from its cursor (store/thread_lists.py), like `ix_runs_workspace_created` for runs (0003).

On PostgreSQL `CREATE INDEX` blocks writes to `threads` while it builds: on a large database, apply this revision
(`candor migrate`) while no new thread is created, or expect thread creation to wait for the build.
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_threads_workspace_created", "threads", ["workspace_id", "created_at", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_threads_workspace_created", table_name="threads")
