"""Resume successors (spec §8.6): the replay lookup by key and the successor a waiting run gets (S-80–S-83).

The successor is inserted by `threads.start_run()`; the unique index `uq_runs_resume_request`
(`resumed_by_id, request_key`) and the live-run index decide between racing resumes (S-83).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, bindparam, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from .tables import runs
from .threads import NewRun
from .views import RunRow

__all__ = ("ResumeLookup", "find_resume_by_key", "find_resume_and_run", "split_resume_lookup", "successor_of")


@dataclass(frozen=True, kw_only=True, slots=True)
class ResumeLookup:
    """What one resume request needs to read before it locks anything."""

    replay: RunRow | None
    """The successor this principal already created with this key (§8.2), whatever has happened to it since."""
    target: RunRow | None
    """The run to resume, when it exists in the principal's workspace (S-126: otherwise it reads as unknown)."""


async def find_resume_by_key(conn: AsyncConnection, *, principal_id: str, key: str) -> RunRow | None:
    """§8.2: the successor this principal created with this resume key, whatever has happened to it since (S-81)."""
    query = select(runs).where(runs.c.resumed_by_id == principal_id, runs.c.request_key == key)
    row = (await conn.execute(query)).mappings().first()
    return None if row is None else RunRow.from_mapping(row)


_RESUME_AND_RUN = select(runs).where(
    or_(
        and_(runs.c.resumed_by_id == bindparam("lookup_principal_id"), runs.c.request_key == bindparam("lookup_key")),
        and_(runs.c.id == bindparam("lookup_run_id"), runs.c.workspace_id == bindparam("lookup_workspace_id")),
    )
)
"""Built once: every resume request runs it."""


async def find_resume_and_run(
    conn: AsyncConnection, *, principal_id: str, key: str, workspace_id: str, run_id: str
) -> ResumeLookup:
    """The replay lookup and the run to resume in one round trip (at most two rows: the key and the id are unique).

    Both are plain reads taken before the thread lock; the caller still looks for the replay again when a check
    after the lock refuses, since a racing twin may have committed meanwhile.
    """
    params = {"lookup_principal_id": principal_id, "lookup_key": key, "lookup_workspace_id": workspace_id,
              "lookup_run_id": run_id}  # fmt: skip
    found = [RunRow.from_mapping(row) for row in (await conn.execute(_RESUME_AND_RUN, params)).mappings()]
    return split_resume_lookup(found, principal_id=principal_id, key=key, workspace_id=workspace_id, run_id=run_id)


def split_resume_lookup(
    found: Iterable[RunRow], *, principal_id: str, key: str, workspace_id: str, run_id: str
) -> ResumeLookup:
    """Which of the rows is the replay and which the run to resume; one row may be both (a successor resumed
    again with the key that created it), and a row matching neither is ignored."""
    replay = target = None
    for run in found:
        if run.resumed_by_id == principal_id and run.request_key == key:
            replay = run
        if run.id == run_id and run.workspace_id == workspace_id:
            target = run
    return ResumeLookup(replay=replay, target=target)


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
        tool_recovery=waiting.tool_recovery,  # the same logical run continues: its recovery mode stays
        resume=body,
        resumed_by_id=resumed_by_id,
        request_key=key,
        request_digest=digest,
    )
