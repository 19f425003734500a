"""What an agent declares about each of its tools that matters to recovery (pure: reads `Tool` objects only).

The run inspector shows, next to every recovered call, whether its tool was declared retry-safe
(`recovery_retryable`, H-52) or has a reconciler: together with the run's `tool_recovery` mode that is what decided
between a replay and the unknown-outcome result (docs/state-and-resume.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from candor.tools import RECONCILER_METADATA_KEY, RECOVERY_RETRY_SAFE_METADATA_KEY

__all__ = ("ToolDeclaration", "ToolKind", "declaration_of", "client_tool_declarations")

ToolKind = Literal["function", "approval", "external"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolDeclaration:
    name: str
    kind: ToolKind
    """`approval`: the tool needs a person's approval before it runs; `external`: the client or a person runs it."""
    retry_safe: bool
    """Only the boolean `True` under `candor.recovery_retry_safe` counts (H-50, H-51)."""
    reconciler: bool
    description: str | None


def declaration_of(
    name: str,
    metadata: Mapping[str, object] | None,
    *,
    requires_approval: bool,
    external: bool,
    description: str | None,
) -> ToolDeclaration:
    """One tool's declaration, from its name, metadata and kind."""
    found = metadata or {}
    kind: ToolKind = "external" if external else "approval" if requires_approval else "function"
    return ToolDeclaration(
        name=name,
        kind=kind,
        retry_safe=found.get(RECOVERY_RETRY_SAFE_METADATA_KEY) is True,
        reconciler=found.get(RECONCILER_METADATA_KEY) is not None,
        description=description,
    )


def client_tool_declarations(options: Mapping[str, object]) -> list[ToolDeclaration]:
    """The client tools of a run's `options` (§8.8): external, never retry-safe, no reconciler."""
    found = []
    tools = options.get("client_tools")
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, Mapping) and isinstance(tool.get("name"), str):
            description = tool.get("description")
            found.append(
                declaration_of(
                    tool["name"],
                    None,
                    requires_approval=False,
                    external=True,
                    description=description if isinstance(description, str) else None,
                )
            )
    return found
