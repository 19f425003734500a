"""`/v1/threads`: create a thread, read it, post to its inbox, list its runs, archive it (§8.3, §8.5)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from sse_starlette import EventSourceResponse

from ... import commands
from ..cursors import issue_cursor, keyset, read_cursor
from ..dependencies import IdempotencyKey, IfMatch, expected_version
from ..schemas import AcceptedView, CreateThreadBody, EntryView, ErrorBody, PostInputBody, RunPage, RunView, ThreadView
from ..stream import parse_last_event_id, thread_stream_response
from ._common import ERRORS, Reader, Runner, created_or_replayed, with_etag

__all__ = ("router",)

router = APIRouter(prefix="/v1/threads", tags=["threads"], responses=ERRORS)

_ACCEPTED: dict[int | str, dict[str, Any]] = {
    200: {"model": AcceptedView, "description": "A replay: the objects the first request created, as they are now."},
    409: {"model": ErrorBody, "description": "conflict (`idempotency_key_reused`, `archived`, …)"},
    422: {"model": ErrorBody, "description": "disabled: the workspace is archived"},
}


def _accepted(response: Response, accepted: commands.Accepted) -> AcceptedView:
    created_or_replayed(response, accepted.created)
    return AcceptedView(
        thread=ThreadView.of(accepted.thread),
        entry=EntryView.of(accepted.entry),
        run=None if accepted.run is None else RunView.of(accepted.run),
    )


@router.post("", status_code=201, responses=_ACCEPTED, summary="Create a thread")
async def create_thread(
    body: CreateThreadBody, caller: Runner, response: Response, idempotency_key: IdempotencyKey
) -> AcceptedView:
    """A thread, its first inbox entry and (the thread being idle) its first run (S-65)."""
    accepted = await commands.create_thread(caller.service, caller.principal, key=idempotency_key, **body.arguments())
    return _accepted(response, accepted)


@router.get("/{thread_id}", summary="Read a thread")
async def get_thread(thread_id: str, caller: Reader, response: Response) -> ThreadView:
    thread = await commands.get_thread(caller.service, caller.principal, thread_id)
    with_etag(response, thread.id, thread.version)
    return ThreadView.of(thread)


@router.post(
    "/{thread_id}/archive",
    summary="Archive a thread",
    responses={
        412: {"model": ErrorBody, "description": "precondition_failed (`details.current_etag`)"},
        428: {"model": ErrorBody, "description": "precondition_required"},
    },
)
async def archive_thread(thread_id: str, caller: Runner, response: Response, if_match: IfMatch = None) -> ThreadView:
    """Withdraws pending entries and interrupts the active run (S-64); archiving again answers 200."""
    version = expected_version(if_match, thread_id)
    thread = await commands.archive_thread(caller.service, caller.principal, thread_id, expected_version=version)
    with_etag(response, thread.id, thread.version)
    return ThreadView.of(thread)


@router.post(
    "/{thread_id}/inbox",
    status_code=201,
    summary="Post a message",
    responses=_ACCEPTED | {429: {"model": ErrorBody, "description": "rate_limited: the inbox is full"}},
)
async def post_input(
    thread_id: str, body: PostInputBody, caller: Runner, response: Response, idempotency_key: IdempotencyKey
) -> AcceptedView:
    """Idle or paused thread: a run starts (S-65); active: the entry waits; waiting: it queues (S-69)."""
    accepted = await commands.post_input(
        caller.service, caller.principal, thread_id, key=idempotency_key, **body.arguments()
    )
    return _accepted(response, accepted)


@router.get("/{thread_id}/runs", summary="List a thread's runs, newest first")
async def list_runs(
    thread_id: str,
    caller: Reader,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page.")] = None,
) -> RunPage:
    scope = {"workspace_id": caller.principal.workspace_id, "thread_id": thread_id}
    before = None if cursor is None else keyset(read_cursor(cursor, "thread_runs", scope=scope, filters={}))
    rows, more = await commands.list_runs_page(caller.service, caller.principal, thread_id, limit=limit, before=before)
    next_cursor = None
    if more:
        next_cursor = issue_cursor("thread_runs", scope=scope, filters={}, position=[rows[-1].created_at, rows[-1].id])
    return RunPage(items=[RunView.of(row) for row in rows], next_cursor=next_cursor)


@router.get(
    "/{thread_id}/stream",
    summary="Stream a thread's live output (SSE)",
    response_class=EventSourceResponse,
    responses={
        200: {
            "description": "Server-sent events `delta`, `boundary`, `changed`, `reset`, `gap` and keep-alive comments "
            "(§8.7). Provisional: the durable record is the run and its messages.",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        }
    },
)
async def stream_thread(
    thread_id: str,
    caller: Reader,
    request: Request,
    last_event_id: Annotated[
        str | None, Header(alias="Last-Event-ID", description="Resume after this entry id (§8.7).")
    ] = None,
) -> EventSourceResponse:
    """A reconnect with `Last-Event-ID` replays the retained entries after it, `gap` first when some were trimmed
    (S-104); `reset` precedes the first entry of a run's new attempt (S-103); a keep-alive comment at least every
    15 s (S-102). The stream ends when the caller's access ends."""
    after = parse_last_event_id(last_event_id)
    secret = request.headers.get("authorization", "").partition(" ")[2].strip()
    return await thread_stream_response(request, caller.principal, secret, thread_id, after)
