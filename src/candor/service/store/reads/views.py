"""Row values of threads, inbox entries, runs and attempts, and the workspace-scoped reads that build them.

Every value is a frozen dataclass built from a result mapping (`from_mapping`); timestamps are float epoch seconds
from the database clock. Every read takes the caller's `workspace_id`: an id of another workspace reads exactly
like an unknown one (S-126). A thread's `state` is derived with `protocol.thread_state` (§5.6) from the thread row,
the status of its last sealed run and whether that run has a resume successor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from functools import cache
from typing import Any, Self

from sqlalchemy import Select, and_, exists, select
from sqlalchemy.ext.asyncio import AsyncConnection

from ...protocol.new_run import RunLineage, RunTrigger
from ...protocol.requests import Delivery
from ...protocol.thread_state import ThreadState, thread_state
from ...protocol.tool_recovery import ToolRecovery
from ..runs.current_checkpoint import run_columns
from ..schema.dialect import past_keyset
from ..schema.tables import inbox_entries, run_attempts, runs, threads

__all__ = (
    "ThreadRow",
    "EntryRow",
    "RunRow",
    "AttemptRow",
    "select_thread",
    "thread_row",
    "select_run",
    "select_entry",
    "select_runs",
    "select_attempts",
    "get_thread",
    "load_thread",
    "load_run",
    "get_run",
    "get_entry",
    "list_runs",
    "list_attempts",
)


class _Row:
    """`from_mapping`: the dataclass's fields taken by name from a result mapping (extra columns ignored)."""

    __slots__ = ()

    @classmethod
    def from_mapping(cls, row: Mapping[Any, Any]) -> Self:
        return cls(**{name: row[name] for name in _field_names(cls)})  # type: ignore[arg-type]


@cache
def _field_names(cls: type) -> tuple[str, ...]:
    """A row class's field names, read once: `dataclasses.fields` builds a new tuple at every call, and a resume
    builds several rows."""
    return tuple(f.name for f in fields(cls))


@dataclass(frozen=True, kw_only=True, slots=True)
class ThreadRow(_Row):
    """A thread (§5.1) with its derived state (§5.6)."""

    id: str
    workspace_id: str
    state: ThreadState
    origin: str
    origin_thread_id: str | None
    origin_run_id: str | None
    origin_tool_call_id: str | None
    agent: str
    base_checkpoint_id: str | None
    current_run_id: str | None
    last_run_id: str | None
    archived_at: float | None
    version: int
    created_at: float
    updated_at: float


@dataclass(frozen=True, kw_only=True, slots=True)
class EntryRow(_Row):
    """An inbox entry (§5.1, §5.4)."""

    id: str
    workspace_id: str
    thread_id: str
    kind: str
    delivery: Delivery
    position: int
    principal_id: str | None
    authority: dict[str, Any] | None
    payload: dict[str, Any]
    size: int
    agent: str | None
    """The agent the entry explicitly names, `None` when omitted."""
    options: dict[str, Any] | None
    """The options the entry explicitly gives, `None` when omitted."""
    options_digest: str | None
    child_run_id: str | None
    request_key: str | None
    request_digest: str | None
    request_kind: str | None
    status: str
    assigned_run_id: str | None
    incorporated_checkpoint_seq: int | None
    failure: dict[str, Any] | None
    created_at: float
    finished_at: float | None


@dataclass(frozen=True, kw_only=True, slots=True)
class RunRow(_Row):
    """A run (§5.1, §5.2)."""

    id: str
    workspace_id: str
    thread_id: str
    agent: str
    principal_id: str
    authority: dict[str, Any]
    options: dict[str, Any]
    options_digest: str
    source_entry_id: str | None
    resume: dict[str, Any] | None
    resumed_by_id: str | None
    request_key: str | None
    request_digest: str | None
    trigger: RunTrigger
    lineage: RunLineage
    parent_run_id: str | None
    status: str
    wait_reason: str | None
    pending: dict[str, Any] | None
    cancel_requested_at: float | None
    current_attempt_id: str | None
    available_at: float
    attempts: int
    max_attempts: int
    tool_recovery: ToolRecovery
    """The run's effective `tool_recovery` mode, fixed at acceptance (protocol/tool_recovery.py)."""
    start_checkpoint_id: str | None
    checkpoint_id: str | None
    checkpoint_seq: int
    output: Any
    failure: dict[str, Any] | None
    usage: dict[str, Any] | None
    created_at: float
    started_at: float | None
    sealed_at: float | None
    version: int


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptRow(_Row):
    """A run attempt (§5.3); the lease token hash is never read into a value."""

    id: str
    workspace_id: str
    run_id: str
    number: int
    status: str
    start_reason: str
    replaces_attempt_id: str | None
    worker_id: str
    worker_build: str | None
    harness_run_id: str | None
    lease_expires_at: float
    heartbeat_at: float
    yield_reason: str | None
    failure: dict[str, Any] | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    updated_at: float


# --- statements --------------------------------------------------------------------------------------------------

_last_run = runs.alias("last_run")
_successor = runs.alias("successor")


def select_thread(*, workspace_id: str | None, thread_id: str) -> Select[Any]:
    """The thread with `last_run_status` and `last_run_has_successor` (a resume successor of the last run).

    `workspace_id = None` reads unscoped: only for internal paths that already hold the id (worker, sweeps).
    """
    has_successor = exists().where(
        and_(_successor.c.parent_run_id == threads.c.last_run_id, _successor.c.trigger == "resume")
    )
    query = (
        select(
            threads,
            _last_run.c.status.label("last_run_status"),
            has_successor.label("last_run_has_successor"),
        )
        .select_from(threads.outerjoin(_last_run, _last_run.c.id == threads.c.last_run_id))
        .where(threads.c.id == thread_id)
    )
    return query if workspace_id is None else query.where(threads.c.workspace_id == workspace_id)


def select_run(*, workspace_id: str | None, run_id: str) -> Select[Any]:
    """The run; `workspace_id = None` reads unscoped (internal paths only)."""
    query = select(*run_columns()).where(runs.c.id == run_id)
    return query if workspace_id is None else query.where(runs.c.workspace_id == workspace_id)


def select_entry(*, workspace_id: str, entry_id: str) -> Select[Any]:
    return select(inbox_entries).where(inbox_entries.c.id == entry_id, inbox_entries.c.workspace_id == workspace_id)


def select_runs(
    *, workspace_id: str, thread_id: str, limit: int, before: tuple[float, str] | None = None
) -> Select[Any]:
    """A thread's runs, newest first (`created_at`, then `id`), optionally after the keyset `before`."""
    query = select(*run_columns()).where(runs.c.thread_id == thread_id, runs.c.workspace_id == workspace_id)
    if before is not None:
        query = query.where(past_keyset(runs.c.created_at, runs.c.id, before, newest_first=True))
    return query.order_by(runs.c.created_at.desc(), runs.c.id.desc()).limit(limit)


def select_attempts(*, workspace_id: str, run_id: str) -> Select[Any]:
    return (
        select(run_attempts)
        .where(run_attempts.c.run_id == run_id, run_attempts.c.workspace_id == workspace_id)
        .order_by(run_attempts.c.number)
    )


# --- reads -------------------------------------------------------------------------------------------------------


def thread_row(row: Mapping[Any, Any]) -> ThreadRow:
    """A `ThreadRow` from a row of `select_thread` (extra columns are ignored)."""
    archived_at = row["archived_at"]
    state = thread_state(
        archived_at=None if archived_at is None else datetime.fromtimestamp(archived_at, UTC),
        current_run_id=row["current_run_id"],
        last_run_status=row["last_run_status"],
        last_run_has_successor=bool(row["last_run_has_successor"]),
    )
    return ThreadRow.from_mapping({**row, "state": state})


async def get_thread(conn: AsyncConnection, *, workspace_id: str, thread_id: str) -> ThreadRow | None:
    row = (await conn.execute(select_thread(workspace_id=workspace_id, thread_id=thread_id))).mappings().first()
    return None if row is None else thread_row(row)


async def load_thread(conn: AsyncConnection, *, thread_id: str) -> ThreadRow | None:
    """Unscoped: for internal paths (worker, sweeps) that already hold a trusted id."""
    row = (await conn.execute(select_thread(workspace_id=None, thread_id=thread_id))).mappings().first()
    return None if row is None else thread_row(row)


async def get_run(conn: AsyncConnection, *, workspace_id: str, run_id: str) -> RunRow | None:
    row = (await conn.execute(select_run(workspace_id=workspace_id, run_id=run_id))).mappings().first()
    return None if row is None else RunRow.from_mapping(row)


async def load_run(conn: AsyncConnection, *, run_id: str) -> RunRow | None:
    """Unscoped: for internal paths (worker, sweeps) that already hold a trusted id."""
    row = (await conn.execute(select_run(workspace_id=None, run_id=run_id))).mappings().first()
    return None if row is None else RunRow.from_mapping(row)


async def get_entry(conn: AsyncConnection, *, workspace_id: str, entry_id: str) -> EntryRow | None:
    row = (await conn.execute(select_entry(workspace_id=workspace_id, entry_id=entry_id))).mappings().first()
    return None if row is None else EntryRow.from_mapping(row)


async def list_runs(
    conn: AsyncConnection,
    *,
    workspace_id: str,
    thread_id: str,
    limit: int = 50,
    before: tuple[float, str] | None = None,
) -> list[RunRow]:
    query = select_runs(workspace_id=workspace_id, thread_id=thread_id, limit=limit, before=before)
    return [RunRow.from_mapping(row) for row in (await conn.execute(query)).mappings()]


async def list_attempts(conn: AsyncConnection, *, workspace_id: str, run_id: str) -> list[AttemptRow]:
    query = select_attempts(workspace_id=workspace_id, run_id=run_id)
    return [AttemptRow.from_mapping(row) for row in (await conn.execute(query)).mappings()]
