"""`GET /v1/runs`: the caller's workspace's runs across threads, newest first (what an approvals console lists)."""

from __future__ import annotations

from ..core import Service
from ..protocol.authority import Principal
from ..protocol.requests import checked_limit, require
from ..store.db import read_transaction
from ..store.reads import RunRow, list_workspace_runs

__all__ = ("list_workspace_runs_page",)


async def list_workspace_runs_page(
    service: Service,
    principal: Principal,
    *,
    status: str | None = None,
    awaiting_resume: bool = False,
    limit: int = 50,
    before: tuple[float, str] | None = None,
) -> tuple[list[RunRow], bool]:
    """One page plus whether more follow; `awaiting_resume` keeps only runs a resume would accept now."""
    require(principal, "read")
    limit = checked_limit(limit)
    async with read_transaction(service.engine) as conn:
        rows = await list_workspace_runs(
            conn,
            workspace_id=principal.workspace_id,
            status=status,
            awaiting_resume=awaiting_resume,
            limit=limit + 1,
            before=before,
        )
    return rows[:limit], len(rows) > limit
