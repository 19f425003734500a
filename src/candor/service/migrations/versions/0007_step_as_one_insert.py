"""A plain step is one INSERT of its checkpoint row.

Revision ID: 0007
Revises: 0006

A step commit wrote a `checkpoints` row, one `checkpoint_messages` row per new message, a `usage_records` row and
an update of `runs` (its checkpoint pointer). Now the new messages are packed into the checkpoint's own row
(`checkpoints.messages`, store/packed_messages.py) and the step's usage rides on it (`checkpoints.usage`); the
run's current checkpoint is its highest `seq` while it runs and is written to `runs` at seal, handoff and failure.
Rows written before this revision keep their `checkpoint_messages` rows (`messages` stays NULL): both forms are
read, so existing data stays readable without being rewritten.

On PostgreSQL the hot insert also loses what it paid for at every step without needing it: the foreign keys of
`checkpoints.thread_id` and `checkpoints.run_id` (each check locked the thread's and the run's row `FOR KEY SHARE`;
the fenced insert reads both rows in the same statement, so they exist) and its CHECK constraints (the values are
checked by `step_commit.StepCommit` before any statement is sent). SQLite keeps them: one writer, no row locks, and
dropping a constraint there rebuilds the table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_FOREIGN_KEYS = (("fk_checkpoints_thread_id", "threads", "thread_id"), ("fk_checkpoints_run_id", "runs", "run_id"))
_CHECKS = (
    ("ck_checkpoints_kept", "kept >= 0 AND kept <= count"),
    ("ck_checkpoints_format", "format >= 1"),
    (
        "ck_checkpoints_seq",
        "(run_id IS NULL AND seq = 0 AND attempt IS NULL) OR (run_id IS NOT NULL AND seq >= 1 AND attempt >= 1)",
    ),
)


def _json() -> sa.types.TypeEngine[object]:
    from sqlalchemy.dialects import postgresql

    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column("checkpoints", sa.Column("messages", sa.Text(), nullable=True))
    op.add_column("checkpoints", sa.Column("usage", _json(), nullable=True))
    if op.get_bind().dialect.name != "postgresql":
        return
    for name, _table, _column in _FOREIGN_KEYS:
        op.drop_constraint(op.f(name), "checkpoints", type_="foreignkey")
    for name, _condition in _CHECKS:
        op.drop_constraint(op.f(name), "checkpoints", type_="check")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for name, condition in _CHECKS:
            op.create_check_constraint(op.f(name), "checkpoints", condition)
        for name, table, column in _FOREIGN_KEYS:
            op.create_foreign_key(op.f(name), "checkpoints", table, [column], ["id"])
    # Checkpoints written since keep their messages only in `messages`: downgrading loses them (0006 cannot read
    # them), so take a backup first, or downgrade only a database without such rows.
    op.drop_column("checkpoints", "usage")
    op.drop_column("checkpoints", "messages")
