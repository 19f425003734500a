"""`GET /v1/runs`: the workspace's runs across threads, newest first; `awaiting=resume` for the approvals queue."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from ...commands.run_lists import list_workspace_runs_page
from ..cursors import issue_cursor, keyset, read_cursor
from ..schemas import RunPage, RunView
from ._common import ERRORS, Reader

__all__ = ("router",)

router = APIRouter(prefix="/v1/runs", tags=["runs"], responses=ERRORS)

RunStatus = Literal["accepted", "running", "waiting", "completed", "failed", "cancelled"]


@router.get("", summary="List the workspace's runs, newest first")
async def list_workspace_runs(
    caller: Reader,
    status: Annotated[RunStatus | None, Query(description="Only runs in this status.")] = None,
    awaiting: Annotated[
        Literal["resume"] | None,
        Query(
            description="`resume`: only waiting runs a resume would accept now (the thread's last run, no "
            "successor yet, nothing running, thread not archived)."
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page.")] = None,
) -> RunPage:
    """Every thread of the caller's workspace. A resumed run keeps its `waiting` status for the record, so
    `status=waiting` lists it too; `awaiting=resume` lists only the runs that still wait for an answer."""
    scope = {"workspace_id": caller.principal.workspace_id}
    filters = {"status": status, "awaiting": awaiting}
    before = None if cursor is None else keyset(read_cursor(cursor, "workspace_runs", scope=scope, filters=filters))
    rows, more = await list_workspace_runs_page(
        caller.service,
        caller.principal,
        status=status,
        awaiting_resume=awaiting == "resume",
        limit=limit,
        before=before,
    )
    next_cursor = None
    if more:
        position = [rows[-1].created_at, rows[-1].id]
        next_cursor = issue_cursor("workspace_runs", scope=scope, filters=filters, position=position)
    return RunPage(items=[RunView.of(row) for row in rows], next_cursor=next_cursor)
