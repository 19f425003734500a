"""Reads (§8.3): threads, runs, attempts, inbox entries and a run's messages, each scoped to the caller's workspace
(an id of another workspace answers 404 like an unknown one, S-126), and the bearer-secret lookup of the HTTP layer.

Paged reads return the page plus whether more items follow it, so the last page carries no cursor (S-98).
"""

from __future__ import annotations

from typing import Any

from candor.harness.recovery_basis import RECOVERY_BASIS_NAMESPACE, RECOVERY_BASIS_VERSION

from ..core import Service
from ..errors import CheckpointCorrupt, InvalidArgument, NotFound
from ..protocol.authority import Principal
from ..protocol.recovered import RecoveredCall, recovered_calls, with_basis
from ..protocol.requests import checked_limit, require
from ..protocol.transitions import ENTRY_STATUSES
from ..store import checkpoints
from ..store import reads as messages
from ..store import reads as views
from ..store import threads as inbox
from ..store import workspaces as auth
from ..store.db import read_transaction
from ..store.reads import AttemptRow, EntryRow, RunRow, ThreadRow

__all__ = (
    "authenticate",
    "get_thread",
    "get_run",
    "list_runs",
    "list_runs_page",
    "list_attempts",
    "get_entry",
    "list_entries_page",
    "list_run_messages_page",
    "get_run_with_recovery",
)


async def _thread_in_workspace(conn: Any, principal: Principal, thread_id: str) -> ThreadRow:
    thread = await views.get_thread(conn, workspace_id=principal.workspace_id, thread_id=thread_id)
    if thread is None:
        raise NotFound("thread", thread_id)
    return thread


async def authenticate(service: Service, secret: str) -> auth.Authenticated | None:
    """The principal holding a bearer `secret`, or `None` for a missing, unknown or disabled key (S-101)."""
    return await auth.authenticate_request(service.engine, secret)


async def get_thread(service: Service, principal: Principal, thread_id: str) -> ThreadRow:
    require(principal, "read")
    async with read_transaction(service.engine) as conn:
        return await _thread_in_workspace(conn, principal, thread_id)


async def get_run(service: Service, principal: Principal, run_id: str) -> RunRow:
    require(principal, "read")
    async with read_transaction(service.engine) as conn:
        run = await views.get_run(conn, workspace_id=principal.workspace_id, run_id=run_id)
    if run is None:
        raise NotFound("run", run_id)
    return run


_RECOVERY_PAGE = 100


async def get_run_with_recovery(
    service: Service, principal: Principal, run_id: str
) -> tuple[RunRow, list[RecoveredCall]]:
    """`GET /v1/runs/{id}`: the run and the calls its recoveries closed (replayed, reconciled, rerun, unknown).

    Read from the messages the run added, in the run's read transaction. A run that began from no checkpoint and
    has had one attempt cannot have recovered anything, so its messages are not read.
    """
    require(principal, "read")
    async with read_transaction(service.engine) as conn:
        run = await views.get_run(conn, workspace_id=principal.workspace_id, run_id=run_id)
        if run is None:
            raise NotFound("run", run_id)
        if run.attempts <= 1 and run.start_checkpoint_id is None:
            return run, []
        found: list[RecoveredCall] = []
        pages = messages.iter_added_messages(
            conn,
            checkpoint_id=run.checkpoint_id,
            start_checkpoint_id=run.start_checkpoint_id,
            page_size=_RECOVERY_PAGE,
        )
        async for page in pages:
            found.extend(recovered_calls(page))
        if found and run.checkpoint_id is not None:
            found = with_basis(found, await _recovery_basis(conn, run.checkpoint_id))
    return run, found


async def _recovery_basis(conn: Any, checkpoint_id: str) -> Any:
    """The `candor.recovery` data of the run's checkpoint (docs/mcp.md); None when absent or unreadable (the
    view then shows the calls without their basis rather than failing the read)."""
    try:
        envelope = await checkpoints.load_envelope(conn, checkpoint_id)
    except CheckpointCorrupt:
        return None
    namespace = envelope.capabilities.get(RECOVERY_BASIS_NAMESPACE)
    return namespace.data if namespace is not None and namespace.version == RECOVERY_BASIS_VERSION else None


async def list_runs_page(
    service: Service, principal: Principal, thread_id: str, *, limit: int = 50, before: tuple[float, str] | None = None
) -> tuple[list[RunRow], bool]:
    """A thread's runs, newest first, plus whether more follow; `before` is the `(created_at, id)` of the last run
    of the previous page."""
    require(principal, "read")
    limit = checked_limit(limit)
    async with read_transaction(service.engine) as conn:
        await _thread_in_workspace(conn, principal, thread_id)
        rows = await views.list_runs(
            conn, workspace_id=principal.workspace_id, thread_id=thread_id, limit=limit + 1, before=before
        )
    return rows[:limit], len(rows) > limit


async def list_runs(
    service: Service, principal: Principal, thread_id: str, *, limit: int = 50, before: tuple[float, str] | None = None
) -> list[RunRow]:
    """One page of `list_runs_page`, without the continuation flag."""
    rows, _ = await list_runs_page(service, principal, thread_id, limit=limit, before=before)
    return rows


async def list_attempts(service: Service, principal: Principal, run_id: str) -> list[AttemptRow]:
    require(principal, "read")
    async with read_transaction(service.engine) as conn:
        if await views.get_run(conn, workspace_id=principal.workspace_id, run_id=run_id) is None:
            raise NotFound("run", run_id)
        return await views.list_attempts(conn, workspace_id=principal.workspace_id, run_id=run_id)


async def get_entry(service: Service, principal: Principal, thread_id: str, entry_id: str) -> EntryRow:
    """`GET /v1/threads/{id}/inbox/{entry_id}`: an entry of that thread (any other → 404 `entry`)."""
    require(principal, "read")
    async with read_transaction(service.engine) as conn:
        await _thread_in_workspace(conn, principal, thread_id)
        entry = await views.get_entry(conn, workspace_id=principal.workspace_id, entry_id=entry_id)
    if entry is None or entry.thread_id != thread_id:
        raise NotFound("entry", entry_id)
    return entry


async def list_entries_page(
    service: Service,
    principal: Principal,
    thread_id: str,
    *,
    status: str | None = None,
    limit: int = 50,
    after: int | None = None,
) -> tuple[list[EntryRow], bool]:
    """`GET /v1/threads/{id}/inbox`: the thread's entries in position order (optionally of one status) after the
    position `after`, plus whether more follow."""
    require(principal, "read")
    limit = checked_limit(limit)
    if status is not None and status not in ENTRY_STATUSES:
        raise InvalidArgument(fields=[("status", "invalid")])
    async with read_transaction(service.engine) as conn:
        await _thread_in_workspace(conn, principal, thread_id)
        rows = await inbox.list_entries(
            conn,
            workspace_id=principal.workspace_id,
            thread_id=thread_id,
            status=status,
            limit=limit + 1,
            after=after,
        )
    return rows[:limit], len(rows) > limit


async def list_run_messages_page(
    service: Service, principal: Principal, run_id: str, *, limit: int = 50, offset: int = 0
) -> tuple[list[Any], bool]:
    """`GET /v1/runs/{id}/messages`: the messages the run added (pydantic-ai message JSON), rebuilt from its latest
    checkpoint, from the `offset`-th added message on, plus whether more follow. Empty until the run commits.

    Each message's `run_id` is candor's run id: pydantic-ai's own id is per process-local agent run (a new one
    per attempt), which no API of candor's knows."""
    require(principal, "read")
    limit = checked_limit(limit)
    if offset < 0:
        raise InvalidArgument(fields=[("cursor", "out_of_range")])
    async with read_transaction(service.engine) as conn:
        run = await views.get_run(conn, workspace_id=principal.workspace_id, run_id=run_id)
        if run is None:
            raise NotFound("run", run_id)
        page = await messages.read_added_messages(
            conn,
            checkpoint_id=run.checkpoint_id,
            start_checkpoint_id=run.start_checkpoint_id,
            offset=offset,
            limit=limit,
        )
    return [with_run_id(message, run_id) for message in page.messages], page.more


def with_run_id(message: Any, run_id: str) -> Any:
    """`message` (pydantic-ai message JSON) with its `run_id` replaced by candor's, where it has one."""
    if isinstance(message, dict) and "run_id" in message:
        return message | {"run_id": run_id}
    return message
