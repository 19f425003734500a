"""Reads of the console's run inspector (docs/console.md): the workspace's threads, the answers a resume gave and
the tools a run's agent declares. Each is scoped to the caller's workspace and needs `read` (§4.2)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic_ai.toolsets import AbstractToolset

from ..core import Service
from ..errors import NotFound
from ..protocol.authority import Principal
from ..protocol.requests import checked_limit, require
from ..protocol.tool_declarations import ToolDeclaration, client_tool_declarations, declaration_of
from ..store.db import read_transaction
from ..store.reads import ThreadFilters, ThreadRow, list_workspace_threads
from .edited_arguments import walk_static_toolsets
from .reads import get_run

__all__ = (
    "RunAnswers",
    "RunTools",
    "ThreadFilters",
    "list_threads_page",
    "get_run_answers",
    "get_run_tools",
    "declared_tools",
)


async def list_threads_page(
    service: Service,
    principal: Principal,
    filters: ThreadFilters,
    *,
    limit: int = 50,
    before: tuple[float, str] | None = None,
) -> tuple[list[ThreadRow], bool]:
    """`GET /v1/threads`: one page of the workspace's threads, newest first, plus whether more follow."""
    require(principal, "read")
    limit = checked_limit(limit)
    async with read_transaction(service.engine) as conn:
        rows = await list_workspace_threads(
            conn, workspace_id=principal.workspace_id, filters=filters, limit=limit + 1, before=before
        )
    return rows[:limit], len(rows) > limit


@dataclass(frozen=True, slots=True, kw_only=True)
class RunAnswers:
    """The answers a resume gave to a waiting run, as the resuming client sent them (§8.6)."""

    run_id: str
    """The successor run the answers started."""
    answered_run_id: str
    """The waiting run they answered."""
    answered_by: str
    """The id of the API key that sent them."""
    answered_at: float
    """When the resume was accepted (the successor's creation)."""
    answers: Mapping[str, Any]
    """`{approvals, calls, input?}` as stored with the successor."""


async def get_run_answers(service: Service, principal: Principal, run_id: str) -> RunAnswers:
    """`GET /v1/runs/{id}/answers`: the answers that started the resume successor `run_id`; a run that no resume
    started answers 404 (kind `answers`)."""
    run = await get_run(service, principal, run_id)
    if run.trigger != "resume" or run.resume is None or run.resumed_by_id is None or run.parent_run_id is None:
        raise NotFound("answers", run_id)
    return RunAnswers(
        run_id=run.id,
        answered_run_id=run.parent_run_id,
        answered_by=run.resumed_by_id,
        answered_at=run.created_at,
        answers=run.resume,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunTools:
    tools: list[ToolDeclaration]
    complete: bool
    """False when the agent could not be built in this process: then only the client tools are listed."""


async def get_run_tools(service: Service, principal: Principal, run_id: str) -> RunTools:
    """`GET /v1/runs/{id}/tools`: the tools the run's agent declares, built with the run's options, as the edited-
    argument check of a resume does (commands/edited_arguments.py). Best effort: a factory that cannot run in this
    process (its code or its settings live only on the workers) gives `complete = False`, and a dynamic toolset's
    tools are not listed."""
    run = await get_run(service, principal, run_id)
    client = client_tool_declarations(run.options or {})
    try:
        harness = service.agents.build(run.agent, run.options or {})
    except Exception:  # noqa: BLE001 - the factory cannot run here: say so rather than guess
        return RunTools(tools=client, complete=False)
    return RunTools(tools=[*declared_tools(harness), *client], complete=True)


def declared_tools(harness: Any) -> list[ToolDeclaration]:
    """The tools the harness's agent declares statically, in toolset order, one per name."""
    found: dict[str, ToolDeclaration] = {}

    def visit(toolset: AbstractToolset[Any]) -> None:
        tools = getattr(toolset, "tools", None)
        if isinstance(tools, Mapping):  # a FunctionToolset: name -> Tool
            for name, tool in tools.items():
                if isinstance(name, str) and name not in found:
                    found[name] = declaration_of(
                        name,
                        getattr(tool, "metadata", None),
                        requires_approval=bool(getattr(tool, "requires_approval", False)),
                        external=False,
                        description=getattr(tool, "description", None),
                    )
        for tool_def in getattr(toolset, "tool_defs", None) or ():  # an ExternalToolset: ToolDefinitions
            name = getattr(tool_def, "name", None)
            if isinstance(name, str) and name not in found:
                found[name] = declaration_of(
                    name,
                    getattr(tool_def, "metadata", None),
                    requires_approval=False,
                    external=True,
                    description=getattr(tool_def, "description", None),
                )

    walk_static_toolsets(harness, visit)
    return list(found.values())
