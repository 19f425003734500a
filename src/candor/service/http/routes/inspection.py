"""The run inspector's reads (docs/console.md): the workspace's threads, a successor's answers, a run's tools."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from ...commands.inspection import ThreadFilters, get_run_answers, get_run_tools, list_threads_page
from ...protocol.thread_state import ThreadState
from ..cursors import issue_cursor, keyset, read_cursor
from ..inspection_schemas import RunAnswersView, RunToolsView, ThreadPage
from ..schemas import ThreadView
from ._common import ERRORS, Reader

__all__ = ("router", "ID_PREFIX_MAX")

router = APIRouter(tags=["inspection"], responses=ERRORS)

ID_PREFIX_MAX = 64
"""An id is at most 64 characters (`tables.ID`)."""


@router.get("/v1/threads", summary="List the workspace's threads, newest first")
async def list_threads(
    caller: Reader,
    agent: Annotated[str | None, Query(min_length=1, max_length=128, description="Only this agent's threads.")] = None,
    state: Annotated[ThreadState | None, Query(description="Only threads in this derived state (§5.6).")] = None,
    id_prefix: Annotated[
        str | None, Query(min_length=1, max_length=ID_PREFIX_MAX, description="Only ids that start with this.")
    ] = None,
    origin_thread_id: Annotated[
        str | None, Query(min_length=1, max_length=64, description="Only threads forked or spawned from this one.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page.")] = None,
) -> ThreadPage:
    """Every thread of the caller's workspace; the filters combine (all must hold)."""
    scope = {"workspace_id": caller.principal.workspace_id}
    wire = {"agent": agent, "state": state, "id_prefix": id_prefix, "origin_thread_id": origin_thread_id}
    before = None if cursor is None else keyset(read_cursor(cursor, "workspace_threads", scope=scope, filters=wire))
    filters = ThreadFilters(agent=agent, state=state, id_prefix=id_prefix, origin_thread_id=origin_thread_id)
    rows, more = await list_threads_page(caller.service, caller.principal, filters, limit=limit, before=before)
    next_cursor = None
    if more:
        position = [rows[-1].created_at, rows[-1].id]
        next_cursor = issue_cursor("workspace_threads", scope=scope, filters=wire, position=position)
    return ThreadPage(items=[ThreadView.of(row) for row in rows], next_cursor=next_cursor)


@router.get("/v1/runs/{run_id}/answers", summary="Read the answers that started a resume successor")
async def read_run_answers(run_id: str, caller: Reader) -> RunAnswersView:
    """The resume's approvals and answers, the key that sent them and when; 404 (kind `answers`) for a run that
    no resume started."""
    return RunAnswersView.of(await get_run_answers(caller.service, caller.principal, run_id))


@router.get("/v1/runs/{run_id}/tools", summary="List the tools a run's agent declares")
async def read_run_tools(run_id: str, caller: Reader) -> RunToolsView:
    """Each tool's kind and whether it is declared retry-safe or has a reconciler, from the run's agent built with
    the run's options (best effort: `complete` is `false` when the agent cannot be built in this process)."""
    return RunToolsView.of(await get_run_tools(caller.service, caller.principal, run_id))
