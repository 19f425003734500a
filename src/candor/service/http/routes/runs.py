"""`/v1/runs`: read a run, its attempts and its messages, interrupt it, resume it, fork from it (§7.12, §8.3,
§8.6)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from ... import commands
from ..cursors import index_keyset, issue_cursor, read_cursor
from ..dependencies import IdempotencyKey
from ..schemas import (
    AcceptedView,
    AttemptList,
    AttemptView,
    EntryView,
    ErrorBody,
    ForkBody,
    MessagePage,
    ResumeBody,
    RunDetailView,
    RunView,
    ThreadView,
)
from ._common import ERRORS, Reader, Runner, created_or_replayed, with_etag

__all__ = ("router",)

router = APIRouter(prefix="/v1/runs", tags=["runs"], responses=ERRORS)

_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorBody, "description": "conflict (see `details.reason`)"},
}
_WRITE: dict[int | str, dict[str, Any]] = _CONFLICT | {
    422: {"model": ErrorBody, "description": "disabled: the workspace is archived"},
}


@router.get("/{run_id}", summary="Read a run")
async def get_run(run_id: str, caller: Reader, response: Response) -> RunDetailView:
    """The run, with `recovery`: the tool calls its attempts closed by recovery (replayed, reconciled, rerun,
    unknown), read from the messages it added."""
    run, recovered = await commands.get_run_with_recovery(caller.service, caller.principal, run_id)
    with_etag(response, run.id, run.version)
    return RunDetailView.detail(run, recovered)


@router.get("/{run_id}/attempts", summary="List a run's attempts")
async def list_attempts(run_id: str, caller: Reader) -> AttemptList:
    """Every attempt in number order (not paged)."""
    rows = await commands.list_attempts(caller.service, caller.principal, run_id)
    return AttemptList(items=[AttemptView.of(row) for row in rows])


@router.get("/{run_id}/messages", summary="List the messages a run added")
async def list_messages(
    run_id: str,
    caller: Reader,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page.")] = None,
) -> MessagePage:
    """The messages the run added to the history it started from, as pydantic-ai message JSON in history order,
    rebuilt from its latest checkpoint; empty until its first commit."""
    scope = {"workspace_id": caller.principal.workspace_id, "run_id": run_id}
    offset = 0 if cursor is None else index_keyset(read_cursor(cursor, "run_messages", scope=scope, filters={}))
    items, more = await commands.list_run_messages_page(
        caller.service, caller.principal, run_id, limit=limit, offset=offset
    )
    next_cursor = None
    if more:
        next_cursor = issue_cursor("run_messages", scope=scope, filters={}, position=[offset + len(items)])
    return MessagePage(items=items, next_cursor=next_cursor)


@router.post("/{run_id}/interrupt", summary="Interrupt a run", responses=_CONFLICT)
async def interrupt_run(run_id: str, caller: Runner, response: Response) -> RunView:
    """Accepted → cancelled at once; running → cancellation requested; cancelled → unchanged (§7.12)."""
    run = await commands.interrupt_run(caller.service, caller.principal, run_id)
    with_etag(response, run.id, run.version)
    return RunView.of(run)


@router.post(
    "/{run_id}/resume",
    status_code=201,
    summary="Resume a waiting run",
    responses=_WRITE | {200: {"model": RunView, "description": "A replay: the successor as it is now (S-81)."}},
)
async def resume_run(
    run_id: str, body: ResumeBody, caller: Runner, response: Response, idempotency_key: IdempotencyKey
) -> RunView:
    """Answer every pending item of the thread's last, waiting run; creates its successor run (§8.6)."""
    run, created = await commands.resume_run(
        caller.service, caller.principal, run_id, body.answers(), key=idempotency_key
    )
    created_or_replayed(response, created)
    with_etag(response, run.id, run.version)
    return RunView.of(run)


@router.post(
    "/{run_id}/fork",
    status_code=201,
    summary="Fork a thread from a sealed run",
    responses=_WRITE | {200: {"model": AcceptedView, "description": "A replay (§8.2)."}},
)
async def fork_run(
    run_id: str, body: ForkBody, caller: Runner, response: Response, idempotency_key: IdempotencyKey
) -> AcceptedView:
    """A new thread whose first run continues from the sealed origin run's checkpoint."""
    accepted = await commands.fork_run(
        caller.service, caller.principal, run_id, key=idempotency_key, **body.arguments()
    )
    created_or_replayed(response, accepted.created)
    return AcceptedView(
        thread=ThreadView.of(accepted.thread),
        entry=EntryView.of(accepted.entry),
        run=None if accepted.run is None else RunView.of(accepted.run),
    )
