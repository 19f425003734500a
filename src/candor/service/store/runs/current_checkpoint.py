"""A run's current checkpoint: its highest committed `seq` while it runs, written to `runs` at its transitions.

A plain step inserts its checkpoint row and nothing else (§7.8, S-37: no per-step update of `runs`), so while a run
is `running`, `runs.checkpoint_id`/`checkpoint_seq` may lag behind its checkpoints. The truth is the run's
checkpoint with the highest `seq` (seqs are contiguous and unique per run, S-39), found through the unique index on
`(run_id, seq)`. It is materialized on `runs` whenever the run leaves `running` (seal, handoff, recovery: the
transactions that finish the attempt, after taking its lock, so no commit of that attempt can land afterwards:
step_commit.py) and by the general commit path, and every read of a run shows the derived value (`run_columns`),
so views and HTTP answers show what they showed when every step moved the pointer.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Label, Select, Update, bindparam, case, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from ..schema.tables import checkpoints, runs

if TYPE_CHECKING:
    from .claims import Fenced

__all__ = ("latest_checkpoint", "materialize_current_checkpoint", "run_columns", "select_latest_checkpoint")


def _latest(column: str, run_id: Any) -> Any:
    """The `column` of the run's checkpoint with the highest seq, as a scalar subquery (one search of the unique
    index on `(run_id, seq)`)."""
    latest = checkpoints.alias("latest")
    return (
        select(latest.c[column])
        .where(latest.c.run_id == run_id)
        .order_by(latest.c.seq.desc())
        .limit(1)
        .scalar_subquery()
    )


@cache
def select_latest_checkpoint() -> Select[Any]:
    """The run's checkpoint with the highest seq, `(id, seq)`; binds `run_id`. No row before its first commit."""
    c = checkpoints.c
    return select(c.id, c.seq).where(c.run_id == bindparam("run_id")).order_by(c.seq.desc()).limit(1)


async def latest_checkpoint(conn: AsyncConnection, run_id: str) -> tuple[str, int] | None:
    """`(id, seq)` of the run's latest committed checkpoint, or None (read in the caller's transaction)."""
    row = (await conn.execute(select_latest_checkpoint(), {"run_id": run_id})).one_or_none()
    return None if row is None else (str(row.id), int(row.seq))


@cache
def _materialize() -> Update:
    r = runs.c
    return (
        update(runs)
        .where(r.id == bindparam("materialize_run"))
        .values(checkpoint_id=_latest("id", r.id), checkpoint_seq=_latest("seq", r.id))
    )


async def materialize_current_checkpoint(conn: AsyncConnection, fenced: Fenced) -> Fenced:
    """Write the run's latest checkpoint to `runs.checkpoint_id`/`checkpoint_seq` (a no-op when they already name
    it); returns `fenced` with them, for what the transaction writes next (seal, requeue, usage record, webhook
    payloads).

    Call it after the attempt's row is locked (`lock_fenced`, `lock_for_expiry`), in a statement of its own: on
    PostgreSQL it then reads every commit that locked the attempt row before this transaction did.
    """
    latest = await latest_checkpoint(conn, fenced.run.id)
    if latest is None or latest[1] <= fenced.run.checkpoint_seq:
        return fenced
    await conn.execute(_materialize(), {"materialize_run": fenced.run.id})
    return fenced.with_checkpoint(*latest)


def _derived(column: str) -> Label[Any]:
    r = runs.c
    latest: ColumnElement[Any] = _latest("seq" if column == "checkpoint_seq" else "id", r.id)
    return case((r.status == "running", func.coalesce(latest, r[column])), else_=r[column]).label(column)


@cache
def run_columns() -> tuple[Any, ...]:
    """The columns of `runs` as readers see them: `checkpoint_id` and `checkpoint_seq` of a running run derived
    from its checkpoints (the module docstring), every other column as stored."""
    return tuple(_derived(c.name) if c.name in ("checkpoint_id", "checkpoint_seq") else c for c in runs.c)
