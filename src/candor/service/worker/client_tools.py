"""Client tools in the worker (§8.8): the run's `options.client_tools` as an `ExternalToolset` of `RunBindings`.

A model call to one of these tools is deferred by pydantic-ai (no server code runs), so the run ends `waiting`
with the call in `pending.calls` (S-131); the client answers through resume (S-132). The tool list is part of the
run's frozen options, so successors that inherit the options offer the same tools.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import JsonValue
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, ExternalToolset

from candor import Harness

from ..protocol.client_tools import ClientTool, ClientToolsProblem, parameters_schema, validate_client_tools

__all__ = ("CLIENT_TOOL_CONFLICT", "client_tools_of", "client_toolsets", "agent_tool_names")

CLIENT_TOOL_CONFLICT = "client_tool_conflict"
"""Seal code of a run whose client tool is named like one of its agent's tools (when not caught at post time)."""


def client_tools_of(options: Mapping[str, JsonValue]) -> list[ClientTool] | ClientToolsProblem:
    return validate_client_tools(options.get("client_tools"))


def client_toolsets(tools: list[ClientTool]) -> list[AbstractToolset[object]]:
    """One `ExternalToolset` holding every client tool, or nothing when the run has none."""
    if not tools:
        return []
    definitions = [
        ToolDefinition(name=tool.name, description=tool.description, parameters_json_schema=parameters_schema(tool))
        for tool in tools
    ]
    return [ExternalToolset(definitions, id="candor_client_tools")]


def agent_tool_names(harness: Harness[object]) -> set[str]:
    """Best effort: the names of the tools an agent declares statically (function toolsets, external toolsets).

    Dynamic toolsets (MCP servers and the like) are only known during a run; a collision with one of those
    surfaces as the harness's own failure.
    """
    names: set[str] = set()
    agent = getattr(harness, "agent", None)
    toolsets = getattr(agent, "toolsets", ())
    if not isinstance(toolsets, (list, tuple)):
        try:
            toolsets = list(toolsets)
        except TypeError:
            return names

    def visit(toolset: AbstractToolset[object]) -> None:
        tools = getattr(toolset, "tools", None)
        if isinstance(tools, Mapping):
            names.update(name for name in tools if isinstance(name, str))
        for definition in getattr(toolset, "tool_defs", ()) or ():
            name = getattr(definition, "name", None)
            if isinstance(name, str):
                names.add(name)

    for toolset in toolsets:
        if isinstance(toolset, AbstractToolset):
            try:
                toolset.apply(visit)
            except Exception:  # noqa: BLE001 - a toolset that cannot be walked contributes no names
                continue
    return names
