"""A step commit locks no workspace row on PostgreSQL.

Revision ID: 0004
Revises: 0003

Every step commit inserts into `checkpoints`, `usage_records` and `stream_entries`, whose foreign keys to
`workspaces` made PostgreSQL lock the workspace's one row (`FOR KEY SHARE`) at every commit of every run in the
workspace; commits at the same time shared it only through a MultiXact each, which `VACUUM` must later freeze.
The three keys are dropped on PostgreSQL: each row's thread or run, which the commit locks anyway, references the
workspace by a key of its own (tables.py `_step_workspace`). SQLite keeps them (one writer, no row locks), so this
revision changes nothing there.
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

STEP_TABLES = ("checkpoints", "usage_records", "stream_entries")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in STEP_TABLES:
        op.drop_constraint(f"fk_{table}_workspace_id", table, type_="foreignkey")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in STEP_TABLES:
        op.create_foreign_key(f"fk_{table}_workspace_id", table, "workspaces", ["workspace_id"], ["id"])
