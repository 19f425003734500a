"""`GET /v1/runs` walks an index instead of sorting a workspace's runs.

Revision ID: 0003
Revises: 0002

The list pages a workspace's runs newest first on the keyset (`created_at`, `id`) (store/run_lists.py). With only
`ix_runs_workspace_id`, every page read all of the workspace's runs and sorted them. `ix_runs_workspace_created`
(`workspace_id`, `created_at`, `id`) replaces it: it serves every lookup by workspace the old index served, and a
page reads only its own rows. `ix_runs_workspace_waiting` holds only waiting runs, which the approvals console
lists; a run enters and leaves it once, so it costs the hot path nothing per step.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_WAITING = sa.text("status = 'waiting'")


def upgrade() -> None:
    op.create_index("ix_runs_workspace_created", "runs", ["workspace_id", "created_at", "id"], unique=False)
    op.create_index(
        "ix_runs_workspace_waiting", "runs", ["workspace_id", "created_at", "id"], unique=False,
        sqlite_where=_WAITING, postgresql_where=_WAITING,
    )  # fmt: skip
    op.drop_index("ix_runs_workspace_id", table_name="runs")


def downgrade() -> None:
    op.create_index("ix_runs_workspace_id", "runs", ["workspace_id"], unique=False)
    op.drop_index("ix_runs_workspace_waiting", table_name="runs")
    op.drop_index("ix_runs_workspace_created", table_name="runs")
