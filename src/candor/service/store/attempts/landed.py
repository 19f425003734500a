"""Reads that tell an attempt whether a write it lost the answer to had committed (protocol/store_retry.py).

A connection that breaks after a commit was sent leaves the worker not knowing whether it landed. Trying the
write again blindly would either write twice (a webhook staged twice) or fail its own compare-and-swap and look
like a lost lease. These reads find the attempt's own rows instead: the checkpoint of the next `seq` written by
this attempt number, the attempt row's ending, the entries assigned to the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from ..db.engine import read_transaction
from ..schema.tables import checkpoints, inbox_entries, run_attempts
from .seals import AssignedEntry

__all__ = ("OwnCheckpoint", "find_own_checkpoint", "read_attempt_end", "read_assigned_entries")


@dataclass(frozen=True, kw_only=True, slots=True)
class OwnCheckpoint:
    """The checkpoint row an attempt's commit wrote."""

    id: str
    seq: int
    kept: int
    count: int


async def find_own_checkpoint(engine: AsyncEngine, *, run_id: str, seq: int, attempt: int) -> OwnCheckpoint | None:
    """The run's checkpoint `seq` when attempt number `attempt` wrote it (S-39: each records its writer), else None.

    No other attempt can have written this `seq` with this number: numbers are unique per run (S-13)."""
    c = checkpoints.c
    query = select(c.id, c.seq, c.kept, c.count, c.attempt).where(c.run_id == run_id, c.seq == seq)
    async with read_transaction(engine) as conn:
        row = (await conn.execute(query)).mappings().first()
    if row is None or row["attempt"] != attempt:
        return None
    return OwnCheckpoint(id=row["id"], seq=row["seq"], kept=row["kept"], count=row["count"])


async def read_attempt_end(engine: AsyncEngine, attempt_id: str) -> Mapping[str, Any] | None:
    """The attempt row's `status`, `failure` and `yield_reason` (for `store_retry.own_end_landed`)."""
    a = run_attempts.c
    async with read_transaction(engine) as conn:
        row = (
            (await conn.execute(select(a.status, a.failure, a.yield_reason).where(a.id == attempt_id)))
            .mappings()
            .first()
        )
    return None if row is None else dict(row)


async def read_assigned_entries(engine: AsyncEngine, run_id: str) -> tuple[AssignedEntry, ...]:
    """The entries assigned to the run and not yet consumed, in position order (§7.8 step 4's assignment)."""
    e = inbox_entries.c
    query = (
        select(e.id, e.payload).where(e.assigned_run_id == run_id, e.status == "assigned").order_by(e.position, e.id)
    )
    async with read_transaction(engine) as conn:
        rows = (await conn.execute(query)).all()
    return tuple(AssignedEntry(id=row.id, payload=dict(row.payload or {})) for row in rows)
