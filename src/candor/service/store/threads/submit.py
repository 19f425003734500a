"""Threads, their inbox entries and the start of runs (spec §5.1, §6 "Where a run starts", §8.5).

Every write here runs inside the caller's write transaction, after `lock_thread()` (thread → run → attempt is the
lock order of every writer, §7.3; on SQLite `BEGIN IMMEDIATE` already serializes writers). A unique index that
rejects a racing write (`uq_runs_live_thread`, `uq_inbox_entries_principal_id_request_key`, …) surfaces as
`RaceLost`: the transaction is then unusable and the caller rolls it back and answers again (S-1, §8.2).

`advance_thread()` starts the next run of an idle thread from its pending entries in position order (§8.5); the
worker calls it after a `completed`/`waiting` seal and the `advance_threads` sweep calls it periodically.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import bindparam, func, insert, literal, select, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from ...errors import RaceLost
from ...protocol.idempotency import canonical_json, sha256_hex
from ...protocol.new_run import NewRun
from ...runtime import Entropy, SystemEntropy
from ...settings import ServiceSettings
from ...telemetry.context import recorded_traceparent
from ..db.engine import nothing_to_commit
from ..db.statements import execute_together
from ..reads.views import EntryRow, RunRow, ThreadRow, get_entry, load_run, load_thread
from ..runs.outbox_staging import count_accepted, stage_run_transition
from ..schema.dialect import db_now, violated_constraint
from ..schema.tables import inbox_entries, runs, threads
from ..workspaces.auth import get_workspace, new_id, read_authority

__all__ = (
    "NewEntry",
    "NewRun",
    "InboxUsage",
    "StartPoint",
    "new_id",
    "options_digest",
    "payload_size",
    "frozen_authority",
    "lock_thread",
    "insert_thread",
    "find_entry_by_key",
    "find_run_by_source_entry",
    "inbox_usage",
    "append_entry",
    "pending_entries",
    "fail_entry",
    "touch_thread",
    "start_point",
    "start_run",
    "NEW_RUN_VALUES",
    "INSERT_RUN",
    "new_run_params",
    "race_lost",
    "advance_thread",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class NewEntry:
    """An inbox entry to append (`status = pending`, next position)."""

    workspace_id: str
    thread_id: str
    delivery: Literal["steer", "next_run"]
    payload: dict[str, Any]
    principal_id: str | None
    authority: dict[str, Any] | None
    kind: Literal["message", "child_result"] = "message"
    agent: str | None = None
    """Only when the request names an agent explicitly (S-68 compares it)."""
    options: dict[str, Any] | None = None
    """Only when the request gives options explicitly."""
    request_key: str | None = None
    request_digest: str | None = None
    request_kind: Literal["thread", "message", "fork"] | None = None
    child_run_id: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class InboxUsage:
    """Pending plus assigned entries of a thread (§8.5 inbox limits)."""

    count: int
    bytes: int


@dataclass(frozen=True, kw_only=True, slots=True)
class StartPoint:
    """Where the next run of a thread starts (§6) and what it inherits when the request names nothing."""

    start_checkpoint_id: str | None
    lineage: Literal["root", "continue"]
    parent_run_id: str | None
    agent: str
    options: dict[str, Any] = field(default_factory=dict)
    principal_id: str | None = None
    """The last run's principal: acts for entries without one (child results)."""


def options_digest(options: Mapping[str, Any]) -> str:
    """§5.1: SHA-256 of the canonical JSON of the options."""
    return sha256_hex(canonical_json(options))


def payload_size(payload: Any) -> int:
    """An entry's `size`: bytes of its canonical JSON."""
    return len(canonical_json(payload).encode("utf-8"))


def frozen_authority(principal_id: str, permissions: Collection[str]) -> dict[str, Any]:
    """§4.3: the immutable `authority` a run stores at acceptance."""
    return {"principal_id": principal_id, "permissions": sorted(permissions)}


def race_lost(exc: sa_exc.IntegrityError) -> RaceLost:
    return RaceLost(violated_constraint(exc))


# --- threads -----------------------------------------------------------------------------------------------------


async def lock_thread(conn: AsyncConnection, *, thread_id: str, workspace_id: str | None) -> ThreadRow | None:
    """Lock the thread row (`FOR UPDATE`; SQLite already holds the write lock) and read it with its state.

    `workspace_id = None` only for internal paths that hold a trusted id (worker, sweeps).
    """
    query = select(threads.c.id).where(threads.c.id == thread_id)
    if workspace_id is not None:
        query = query.where(threads.c.workspace_id == workspace_id)
    if await conn.scalar(query.with_for_update()) is None:
        return None
    return await load_thread(conn, thread_id=thread_id)


async def insert_thread(
    conn: AsyncConnection,
    *,
    thread_id: str,
    workspace_id: str,
    agent: str,
    origin: Literal["new", "fork", "child"] = "new",
    origin_thread_id: str | None = None,
    origin_run_id: str | None = None,
    origin_tool_call_id: str | None = None,
    base_checkpoint_id: str | None = None,
) -> None:
    await conn.execute(
        insert(threads).values(
            id=thread_id,
            workspace_id=workspace_id,
            origin=origin,
            origin_thread_id=origin_thread_id,
            origin_run_id=origin_run_id,
            origin_tool_call_id=origin_tool_call_id,
            agent=agent,
            base_checkpoint_id=base_checkpoint_id,
            version=1,
            created_at=db_now(),
            updated_at=db_now(),
        )
    )


async def touch_thread(conn: AsyncConnection, *, thread_id: str, inbox_changed: bool) -> None:
    """Set `updated_at`; an inbox change also increments `version` and so the ETag (S-75)."""
    values: dict[str, Any] = {"updated_at": db_now()}
    if inbox_changed:
        values["version"] = threads.c.version + 1
    await conn.execute(update(threads).where(threads.c.id == thread_id).values(**values))


# --- inbox entries -----------------------------------------------------------------------------------------------


async def find_entry_by_key(conn: AsyncConnection, *, principal_id: str, key: str) -> EntryRow | None:
    """§8.2: the entry this principal created with this idempotency key (keys never expire; S-92)."""
    query = select(inbox_entries).where(
        inbox_entries.c.principal_id == principal_id, inbox_entries.c.request_key == key
    )
    row = (await conn.execute(query)).mappings().first()
    return None if row is None else EntryRow.from_mapping(row)


async def find_run_by_source_entry(conn: AsyncConnection, entry: EntryRow) -> RunRow | None:
    """The run an entry started, if any: the run it is (or was last) assigned to, when that run is its own."""
    if entry.assigned_run_id is None:
        return None
    run = await load_run(conn, run_id=entry.assigned_run_id)
    return run if run is not None and run.source_entry_id == entry.id else None


async def inbox_usage(conn: AsyncConnection, *, thread_id: str) -> InboxUsage:
    query = select(func.count(), func.coalesce(func.sum(inbox_entries.c.size), 0)).where(
        inbox_entries.c.thread_id == thread_id, inbox_entries.c.status.in_(("pending", "assigned"))
    )
    count, size = (await conn.execute(query)).one()
    return InboxUsage(count=int(count), bytes=int(size))


async def append_entry(conn: AsyncConnection, entry: NewEntry, *, entropy: Entropy) -> EntryRow:
    """Insert a `pending` entry at the end of the thread's inbox (the thread is locked)."""
    entry_id = new_id("ent", entropy)
    last = await conn.scalar(
        select(func.coalesce(func.max(inbox_entries.c.position), 0)).where(inbox_entries.c.thread_id == entry.thread_id)
    )
    try:
        await conn.execute(
            insert(inbox_entries).values(
                id=entry_id,
                workspace_id=entry.workspace_id,
                thread_id=entry.thread_id,
                kind=entry.kind,
                delivery=entry.delivery,
                position=int(last or 0) + 1,
                principal_id=entry.principal_id,
                authority=entry.authority,
                payload=entry.payload,
                size=payload_size(entry.payload),
                agent=entry.agent,
                options=entry.options,
                options_digest=None if entry.options is None else options_digest(entry.options),
                child_run_id=entry.child_run_id,
                request_key=entry.request_key,
                request_digest=entry.request_digest,
                request_kind=entry.request_kind,
                status="pending",
                created_at=db_now(),
            )
        )
    except sa_exc.IntegrityError as exc:  # the same key raced (§8.2) or a position was taken
        raise race_lost(exc) from exc
    row = await get_entry(conn, workspace_id=entry.workspace_id, entry_id=entry_id)
    assert row is not None
    return row


async def pending_entries(conn: AsyncConnection, *, thread_id: str) -> list[EntryRow]:
    """The thread's `pending` entries in position order."""
    query = (
        select(inbox_entries)
        .where(inbox_entries.c.thread_id == thread_id, inbox_entries.c.status == "pending")
        .order_by(inbox_entries.c.position)
    )
    return [EntryRow.from_mapping(row) for row in (await conn.execute(query)).mappings()]


async def fail_entry(conn: AsyncConnection, *, entry_id: str, code: str, message: str) -> None:
    """A pending entry that cannot start becomes `failed` with `{code, message}` (S-72)."""
    await conn.execute(
        update(inbox_entries)
        .where(inbox_entries.c.id == entry_id, inbox_entries.c.status == "pending")
        .values(status="failed", failure={"code": code, "message": message}, finished_at=db_now())
    )


# --- runs --------------------------------------------------------------------------------------------------------


async def start_point(conn: AsyncConnection, thread: ThreadRow) -> StartPoint:
    """§6: the first run starts from the imported history; later runs from the last sealed run's checkpoint,
    or that run's own start if it never committed. Agent and options are inherited from that run."""
    last = None if thread.last_run_id is None else await load_run(conn, run_id=thread.last_run_id)
    if last is None:
        return StartPoint(
            start_checkpoint_id=thread.base_checkpoint_id, lineage="root", parent_run_id=None, agent=thread.agent
        )
    return StartPoint(
        start_checkpoint_id=last.checkpoint_id or last.start_checkpoint_id,
        lineage="continue",
        parent_run_id=last.id,
        agent=thread.agent,
        options=dict(last.options),
        principal_id=last.principal_id,
    )


_RUN_VALUE_COLUMNS = (
    "id",
    "workspace_id",
    "thread_id",
    "agent",
    "principal_id",
    "authority",
    "options",
    "options_digest",
    "source_entry_id",
    "resume",
    "resumed_by_id",
    "request_key",
    "request_digest",
    "trigger",
    "lineage",
    "parent_run_id",
    "max_attempts",
    "tool_recovery",
    "start_checkpoint_id",
    "trace_context",
)
_ACCEPTED = {"status": "accepted", "attempts": 0, "checkpoint_seq": 0, "version": 1}
NEW_RUN_VALUES: Mapping[str, ColumnElement[Any]] = (
    {name: bindparam(f"new_{name}", type_=runs.c[name].type) for name in _RUN_VALUE_COLUMNS}
    | {name: literal(value, runs.c[name].type) for name, value in _ACCEPTED.items()}
    | {"available_at": db_now(), "created_at": db_now()}
)
"""What an accepted run is inserted with (`new_run_params` binds the `new_<column>` parameters): `INSERT_RUN`'s
values, and the columns the resume's guarded start selects (`store/threads/resume.py`)."""
INSERT_RUN = insert(runs).values(NEW_RUN_VALUES).returning(*runs.c)
"""Built once: every accepted run (a resume, a message, a child result) is inserted by it. It returns the new row
as stored, and nothing later in `start_run` changes the row, so there is no read-back."""


def new_run_params(run: NewRun, run_id: str) -> dict[str, Any]:
    """The `new_<column>` bind parameters of `NEW_RUN_VALUES` for `run`, inserted as `run_id`."""
    values = {
        "id": run_id,
        "workspace_id": run.workspace_id,
        "thread_id": run.thread_id,
        "agent": run.agent,
        "principal_id": run.principal_id,
        "authority": run.authority,
        "options": run.options,
        "options_digest": options_digest(run.options),
        "source_entry_id": run.source_entry_id,
        "resume": run.resume,
        "resumed_by_id": run.resumed_by_id,
        "request_key": run.request_key,
        "request_digest": run.request_digest,
        "trigger": run.trigger,
        "lineage": run.lineage,
        "parent_run_id": run.parent_run_id,
        "max_attempts": run.max_attempts,
        "tool_recovery": run.tool_recovery,
        "start_checkpoint_id": run.start_checkpoint_id,
        "trace_context": recorded_traceparent(),  # the request's (or attempt's) context: docs/telemetry.md
    }
    return {f"new_{name}": value for name, value in values.items()}


_START_ON_THREAD = (
    update(threads)
    .where(threads.c.id == bindparam("start_thread_id"))
    .values(current_run_id=bindparam("start_run_id"), agent=bindparam("start_agent"), updated_at=db_now())
)


async def start_run(
    conn: AsyncConnection, run: NewRun, *, entropy: Entropy, workspace_has_subscriptions: bool | None = None
) -> RunRow:
    """Insert an `accepted` run due now, make it the thread's current run and assign its source entry to it.

    The thread is locked by the caller; the live-run index still decides if two starts race (S-1). The INSERT and
    the thread's UPDATE go in one round trip (`execute_together`). `workspace_has_subscriptions=False` (read by
    the caller in this transaction) skips the webhook subscription lookup of `run.accepted`.
    """
    run_id = new_id("run", entropy)
    params = new_run_params(run, run_id)
    params.update(start_thread_id=run.thread_id, start_run_id=run_id, start_agent=run.agent)
    try:
        (inserted,) = await execute_together(conn, (_START_ON_THREAD,), INSERT_RUN, params)
        started = RunRow.from_mapping(inserted)
    except sa_exc.IntegrityError as exc:  # uq_runs_live_thread (S-1) or uq_runs_resume_request (S-83)
        raise race_lost(exc) from exc
    if run.source_entry_id is not None:
        await conn.execute(
            update(inbox_entries)
            .where(inbox_entries.c.id == run.source_entry_id)
            .values(status="assigned", assigned_run_id=run_id)
        )
    # S-106: `run.accepted` in the creating transaction.
    await stage_run_transition(
        conn,
        run_id=run_id,
        run_status="accepted",
        workspace_id=run.workspace_id,
        has_subscriptions=workspace_has_subscriptions,
    )
    count_accepted(conn, trigger=run.trigger)
    return started


_DISABLED = ("disabled", "The workspace is archived")
_REVOKED = ("authority_revoked", "The submitter no longer holds the run permission")
_NO_AGENT = ("agent_unavailable", "The agent is not configured")


async def _start_problem(
    conn: AsyncConnection,
    *,
    workspace_archived: bool,
    principal_id: str | None,
    agent: str,
    agent_names: Collection[str],
) -> tuple[tuple[str, str] | None, frozenset[str]]:
    """Why a pending entry cannot start (S-72, S-128, S-61), and the permissions its run would freeze."""
    if workspace_archived:
        return _DISABLED, frozenset()
    facts = await read_authority(conn, principal_id) if principal_id is not None else None
    if facts is None or facts.verdict() != "allowed":
        return _REVOKED, frozenset()
    if agent not in agent_names:
        return _NO_AGENT, frozenset()
    return None, facts.permissions


async def advance_thread(
    conn: AsyncConnection,
    *,
    thread_id: str,
    settings: ServiceSettings,
    agent_names: Collection[str],
    entropy: Entropy | None = None,
    alone: bool = False,
) -> str | None:
    """§8.5: start the next run of an idle thread from its pending entries, in position order; the new run's id.

    `alone`: the caller's `write_transaction` does nothing else, so when nothing changes it ends in a rollback
    instead of an empty commit (`engine.nothing_to_commit`).

    Entries that cannot start become `failed` (`disabled`, `authority_revoked`, `agent_unavailable`) and the ones
    behind them still get their turn (S-72). Waiting, paused, active and archived threads start nothing (S-69,
    S-70). A database failure raises, so nothing changes and the sweep retries.
    """
    thread = await lock_thread(conn, thread_id=thread_id, workspace_id=None)
    if thread is None or thread.state != "idle":
        if alone:
            nothing_to_commit(conn)
        return None
    entropy = entropy if entropy is not None else SystemEntropy()
    point = await start_point(conn, thread)
    workspace = await get_workspace(conn, thread.workspace_id)
    workspace_archived = workspace is None or workspace.archived_at is not None
    started: RunRow | None = None
    changed = False
    for entry in await pending_entries(conn, thread_id=thread_id):
        principal_id = entry.principal_id or point.principal_id
        agent = entry.agent or point.agent
        problem, permissions = await _start_problem(
            conn,
            workspace_archived=workspace_archived,
            principal_id=principal_id,
            agent=agent,
            agent_names=agent_names,
        )
        changed = True
        if problem is not None:
            await fail_entry(conn, entry_id=entry.id, code=problem[0], message=problem[1])
            continue
        assert principal_id is not None
        options = entry.options if entry.options is not None else point.options
        started = await start_run(
            conn,
            NewRun(
                workspace_id=thread.workspace_id,
                thread_id=thread_id,
                agent=agent,
                principal_id=principal_id,
                authority=frozen_authority(principal_id, permissions),
                options=options,
                trigger="child_result" if entry.kind == "child_result" else "queued",
                lineage=point.lineage,
                parent_run_id=point.parent_run_id,
                start_checkpoint_id=point.start_checkpoint_id,
                max_attempts=settings.worker.max_attempts,
                tool_recovery=settings.tool_recovery_for(agent, options),
                source_entry_id=entry.id,
            ),
            entropy=entropy,
        )
        break
    if changed:
        await touch_thread(conn, thread_id=thread_id, inbox_changed=True)
    elif alone:
        nothing_to_commit(conn)
    return None if started is None else started.id
