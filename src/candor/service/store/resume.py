"""Resume successors (spec §8.6): the replay lookup by key and the successor a waiting run gets (S-80–S-83).

The successor is inserted by `threads.start_run()`; the unique index `uq_runs_resume_request`
(`resumed_by_id, request_key`) and the live-run index decide between racing resumes (S-83).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from .tables import runs
from .threads import NewRun
from .views import RunRow

__all__ = ("find_resume_by_key", "successor_of")


async def find_resume_by_key(conn: AsyncConnection, *, principal_id: str, key: str) -> RunRow | None:
    """§8.2: the successor this principal created with this resume key, whatever has happened to it since (S-81)."""
    query = select(runs).where(runs.c.resumed_by_id == principal_id, runs.c.request_key == key)
    row = (await conn.execute(query)).mappings().first()
    return None if row is None else RunRow.from_mapping(row)


def successor_of(
    waiting: RunRow, *, body: dict[str, Any], resumed_by_id: str, key: str, digest: str, max_attempts: int
) -> NewRun:
    """S-80, §8.6 step 7: trigger `resume`, lineage `continue`, the waiting run's agent, options, principal and
    authority, starting from its final checkpoint; `max_attempts` is the setting at acceptance (S-10)."""
    return NewRun(
        workspace_id=waiting.workspace_id,
        thread_id=waiting.thread_id,
        agent=waiting.agent,
        principal_id=waiting.principal_id,
        authority=dict(waiting.authority),
        options=dict(waiting.options),
        trigger="resume",
        lineage="continue",
        parent_run_id=waiting.id,
        start_checkpoint_id=waiting.checkpoint_id,
        max_attempts=max_attempts,
        resume=body,
        resumed_by_id=resumed_by_id,
        request_key=key,
        request_digest=digest,
    )
