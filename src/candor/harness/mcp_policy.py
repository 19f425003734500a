"""Pure decisions for MCP tools: is an unanswered call safe to run again, and where did that come from.

MCP servers annotate their tools (`readOnlyHint`, `idempotentHint`, `destructiveHint`, spec 2025-06-18). candor
reads them as a retry-safe declaration: a call is re-run under `tool_recovery="declared"` only when its tool was
annotated `readOnlyHint: true` or `idempotentHint: true`, and not `destructiveHint: true`. As for the decorator
(H-51), only the JSON boolean `true` counts; an absent hint is no declaration. An operator overrides per tool:
`never_retry` always wins, then `retry_safe`, then the decorator's metadata, then the annotations.

The decisions are pure; the record helpers at the end read and write the active run's in-memory capability
store (the checkpoint's `candor.mcp.<server>` namespace). `candor.mcp` applies both to the tool definitions it
prepares (docs/mcp.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .capability_store import _current_store
from .results import SafeFailure

__all__ = (
    "DeclarationSource",
    "ToolDeclaration",
    "RetrySafety",
    "ToolServerUnavailable",
    "judge_retry_safety",
    "declaration_from_annotations",
    "check_overrides",
    "RETRY_SAFE_SOURCE_METADATA_KEY",
    "DECLARATION_CHANGED_METADATA_KEY",
    "TOOL_UNAVAILABLE_CODE",
    "tool_unavailable_failure",
    "RECORDED_TOOLS_VERSION",
    "recorded_tools_namespace",
    "recorded_tools_data",
    "declarations_from_record",
    "read_recorded_tools",
    "record_tools",
)

DeclarationSource = Literal["annotation", "override", "decorator", "none"]
"""Where a tool's retry-safety came from: its MCP annotations, an operator override, `recovery_retryable` (or any
metadata that sets the key, H-53), or nowhere (not retry-safe)."""

RETRY_SAFE_SOURCE_METADATA_KEY = "candor.retry_safe_source"
"""Set by `candor.mcp` on the prepared definition of every tool it serves: a `DeclarationSource`."""
DECLARATION_CHANGED_METADATA_KEY = "candor.declaration_changed"
"""Set to `True` when the server now annotates the tool differently from what the checkpoint recorded."""
TOOL_UNAVAILABLE_CODE = "tool_unavailable"

_HINTS = ("readOnlyHint", "idempotentHint", "destructiveHint")


class ToolServerUnavailable(Exception):
    """A tool server could not be reached: at connection, while listing its tools, or when a call lost it.

    The harness ends the run `failed` with code `tool_unavailable` (retry_hint `new_run`); the service retries the
    attempt from its last checkpoint with backoff. The message names the server, never the transport's error text
    (it may quote a URL or a command line); the cause is chained for logs.
    """

    def __init__(self, server: str, stage: Literal["connect", "list_tools", "call_tool"]) -> None:
        super().__init__(f"tool server {server!r} is unavailable ({stage})")
        self.server = server
        self.stage = stage


def tool_unavailable_failure(exc: ToolServerUnavailable) -> SafeFailure:
    """The run's failure when a tool server could not be reached; `details` name the server, not the error."""
    return SafeFailure(
        code=TOOL_UNAVAILABLE_CODE,
        message="A tool server is unavailable; a new attempt may succeed.",
        details={"error_type": type(exc).__name__, "server": exc.server, "stage": exc.stage},
        retry_hint="new_run",
    )


@dataclass(frozen=True, slots=True)
class ToolDeclaration:
    """The retry-relevant MCP annotations of one tool; each field is `True` only for the JSON boolean `true`."""

    read_only: bool = False
    idempotent: bool = False
    destructive: bool = False

    def to_json(self) -> dict[str, bool]:
        """The wire spelling, as recorded in a checkpoint (finite JSON, no connection data)."""
        return {"readOnlyHint": self.read_only, "idempotentHint": self.idempotent, "destructiveHint": self.destructive}

    @property
    def retry_safe(self) -> bool:
        return (self.read_only or self.idempotent) and not self.destructive


def declaration_from_annotations(annotations: Mapping[str, Any] | None) -> ToolDeclaration:
    """The declaration of an MCP `annotations` object (camelCase keys, as pydantic-ai stores them).

    Anything but the boolean `True` (absent, `None`, `1`, `"true"`) is no declaration, as for H-51.
    """
    if not isinstance(annotations, Mapping):
        return ToolDeclaration()
    read_only, idempotent, destructive = (annotations.get(hint) is True for hint in _HINTS)
    return ToolDeclaration(read_only=read_only, idempotent=idempotent, destructive=destructive)


@dataclass(frozen=True, slots=True)
class RetrySafety:
    retry_safe: bool
    source: DeclarationSource


def judge_retry_safety(
    tool_name: str,
    declaration: ToolDeclaration | None,
    *,
    retry_safe: frozenset[str] = frozenset(),
    never_retry: frozenset[str] = frozenset(),
    decorated: bool = False,
) -> RetrySafety:
    """Whether a call of `tool_name` may run again after a crash under `declared`, and why.

    `declaration` is what the server annotated (None: the tool is not an MCP tool); `decorated` says whether the
    prepared definition already carries the retry-safe key (H-50, H-53). An operator's `never_retry` wins over
    everything: it is the way to refuse a server's optimistic annotation.
    """
    if tool_name in never_retry:
        return RetrySafety(False, "override")
    if tool_name in retry_safe:
        return RetrySafety(True, "override")
    if decorated:
        return RetrySafety(True, "decorator")
    if declaration is not None and declaration.retry_safe:
        return RetrySafety(True, "annotation")
    return RetrySafety(False, "none")


def check_overrides(retry_safe: Iterable[str], never_retry: Iterable[str]) -> tuple[frozenset[str], frozenset[str]]:
    """Validated override sets: names must be non-empty and a tool cannot be in both lists (`ValueError`)."""
    safe, never = frozenset(retry_safe), frozenset(never_retry)
    if any(not isinstance(name, str) or not name for name in safe | never):
        raise ValueError("retry_safe and never_retry must list non-empty tool names")
    if both := sorted(safe & never):
        raise ValueError("tools listed in both retry_safe and never_retry: " + ", ".join(both))
    return safe, never


# -- the recorded tool list (a checkpoint's `candor.mcp.<server>` namespace) -------------------------------------

RECORDED_TOOLS_VERSION = "1"


def recorded_tools_namespace(server: str) -> str:
    """The capability namespace holding the tool list a server's toolset last served in a run."""
    return f"candor.mcp.{server}"


def recorded_tools_data(declarations: Mapping[str, ToolDeclaration]) -> dict[str, Any]:
    """The namespace data for a served tool list: names and annotations only (no command, URL or credential)."""
    return {"tools": {name: declarations[name].to_json() for name in sorted(declarations)}}


def declarations_from_record(data: Any) -> dict[str, ToolDeclaration]:
    """The declarations of recorded namespace data; empty for data in another shape (judged as unrecorded)."""
    tools = data.get("tools") if isinstance(data, Mapping) else None
    if not isinstance(tools, Mapping):
        return {}
    return {name: declaration_from_annotations(hints) for name, hints in tools.items() if isinstance(name, str)}


def read_recorded_tools(server: str) -> dict[str, ToolDeclaration]:
    """What the active run's restored checkpoint recorded for `server` (empty outside a run or without a record)."""
    store = _current_store.get()
    raw = store._raw(recorded_tools_namespace(server)) if store is not None else None
    if raw is None or raw[0] != RECORDED_TOOLS_VERSION:
        return {}
    return declarations_from_record(raw[1])


def record_tools(server: str, declarations: Mapping[str, ToolDeclaration]) -> None:
    """Record the tool list served to the active run (nothing outside a run: annotations still apply)."""
    store = _current_store.get()
    if store is not None:
        store._put(recorded_tools_namespace(server), RECORDED_TOOLS_VERSION, recorded_tools_data(declarations))
