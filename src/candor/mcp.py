"""MCP toolsets whose tool annotations declare what recovery may run again (docs/mcp.md).

`RecoverableMCP` wraps a Pydantic AI `MCPToolset` (stdio or streamable HTTP: `mcp_stdio`, `mcp_http`). A tool the
server annotates `readOnlyHint` or `idempotentHint` (and not `destructiveHint`), or that the operator lists in
`retry_safe`, is declared retry-safe, so `declared` recovery re-runs it; `never_retry` wins over both
(`candor.harness.mcp_policy`; H-46, H-50, H-53). The tool list served (names and annotations only) is recorded in
the run's capability namespace `candor.mcp.<server>`, so recovery judges a call by what the model was offered and
flags `candor.declaration_changed` when the server now says otherwise. An unreachable server raises
`ToolServerUnavailable`: the run ends `failed` with `tool_unavailable`, never with a result the model could act on.
Needs the `mcp` extra (`pip install "candor[mcp]"`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.exceptions import ModelRetry, ToolFailed
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool, WrapperToolset

from .harness.mcp_policy import (
    DECLARATION_CHANGED_METADATA_KEY,
    RETRY_SAFE_SOURCE_METADATA_KEY,
    ToolDeclaration,
    ToolServerUnavailable,
    check_overrides,
    declaration_from_annotations,
    judge_retry_safety,
    read_recorded_tools,
    record_tools,
    recorded_tools_namespace,
)
from .harness.recovery_tools import RECOVERY_RETRY_SAFE_METADATA_KEY

__all__ = (
    "RecoverableMCP",
    "ToolServerUnavailable",
    "mcp_stdio",
    "mcp_http",
    "recorded_tools_namespace",
    "is_connection_failure",
)

_MCP_CONNECTION_CLOSED = -32000  # mcp.types.CONNECTION_CLOSED
_MCP_REQUEST_TIMEOUT = -32001  # mcp.types.REQUEST_TIMEOUT: the call's outcome is as unknown as after a crash
_ANYIO_STREAM_ERRORS = frozenset({"ClosedResourceError", "BrokenResourceError", "EndOfStream"})
_MAX_CAUSE_DEPTH = 16


@dataclass
class _RunMemo:
    """Per-run state: the declarations the restored checkpoint recorded (read once, at the run's first listing)."""

    call_time: dict[str, ToolDeclaration] | None = None


@dataclass
class RecoverableMCP(WrapperToolset[Any]):
    """An MCP toolset whose tools declare their retry-safety from annotations and operator overrides."""

    server: str = "mcp"
    """A stable name for the server (the capability namespace's suffix); keep it when the server moves."""
    retry_safe: frozenset[str] = frozenset()
    """Tools re-run after a crash whatever the server annotates (the operator's knowledge of the server)."""
    never_retry: frozenset[str] = frozenset()
    """Tools never re-run after a crash whatever the server annotates; wins over everything else."""
    _memo: _RunMemo = field(default_factory=_RunMemo, repr=False)

    def __post_init__(self) -> None:
        if not self.server or not isinstance(self.server, str):
            raise ValueError("server must be a non-empty name")
        self.retry_safe, self.never_retry = check_overrides(self.retry_safe, self.never_retry)

    async def for_run(self, ctx: RunContext[Any]) -> AbstractToolset[Any]:
        # A fresh memo per run: a toolset shared by concurrent runs judges each by its own checkpoint.
        return dataclasses.replace(self, wrapped=await self.wrapped.for_run(ctx), _memo=_RunMemo())

    async def __aenter__(self) -> RecoverableMCP:
        try:
            await self.wrapped.__aenter__()
        except Exception as exc:  # entering only connects: whatever fails here, the server is not usable
            raise ToolServerUnavailable(self.server, "connect") from exc
        return self

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        try:
            tools = await self.wrapped.get_tools(ctx)
        except Exception as exc:
            if is_connection_failure(exc):
                raise ToolServerUnavailable(self.server, "list_tools") from exc
            raise
        if self._memo.call_time is None:
            self._memo.call_time = read_recorded_tools(self.server)  # the restored checkpoint's record
        now = {name: declaration_from_annotations(_annotations(tool)) for name, tool in tools.items()}
        prepared = {name: self._prepared(name, tool, now[name]) for name, tool in tools.items()}
        record_tools(self.server, now)  # what the model is offered from here on, for the next checkpoint
        return prepared

    def _prepared(self, name: str, tool: ToolsetTool[Any], now: ToolDeclaration) -> ToolsetTool[Any]:
        recorded = (self._memo.call_time or {}).get(name)
        metadata = dict(tool.tool_def.metadata or {})
        safety = judge_retry_safety(
            name,
            recorded if recorded is not None else now,  # judged by what was declared when the call was made
            retry_safe=self.retry_safe,
            never_retry=self.never_retry,
            decorated=metadata.get(RECOVERY_RETRY_SAFE_METADATA_KEY) is True,
        )
        metadata.pop(RECOVERY_RETRY_SAFE_METADATA_KEY, None)
        if safety.retry_safe:
            metadata[RECOVERY_RETRY_SAFE_METADATA_KEY] = True
        metadata[RETRY_SAFE_SOURCE_METADATA_KEY] = safety.source
        if recorded is not None and recorded != now:
            metadata[DECLARATION_CHANGED_METADATA_KEY] = True
        tool_def = dataclasses.replace(tool.tool_def, metadata=metadata)
        return dataclasses.replace(tool, tool_def=tool_def)

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        try:
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        except (ModelRetry, ToolFailed) as exc:
            # pydantic-ai turns a lost connection into a retry prompt; the model would then call again blindly.
            if is_connection_failure(exc.__cause__):
                raise ToolServerUnavailable(self.server, "call_tool") from exc
            raise
        except Exception as exc:
            if is_connection_failure(exc):
                raise ToolServerUnavailable(self.server, "call_tool") from exc
            raise


def _annotations(tool: ToolsetTool[Any]) -> Mapping[str, Any] | None:
    annotations = (tool.tool_def.metadata or {}).get("annotations")  # pydantic-ai's MCPToolset puts them here
    return annotations if isinstance(annotations, Mapping) else None


def is_connection_failure(exc: BaseException | None) -> bool:
    """Whether `exc` (or its causes, or an exception group's members) says the server could not be reached, the
    connection was lost, or a request timed out: OS and transport errors, closed anyio streams, the MCP
    `CONNECTION_CLOSED` and `REQUEST_TIMEOUT` errors, the FastMCP client's connect failure. Tool errors the server
    answered are not."""
    pending: list[BaseException] = [exc] if exc is not None else []
    seen = 0
    while pending and seen < _MAX_CAUSE_DEPTH:
        current = pending.pop()
        seen += 1
        if _is_transport_error(current):
            return True
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                pending.append(linked)
    return False


def _is_transport_error(exc: BaseException) -> bool:
    if isinstance(exc, (OSError, TimeoutError)):
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    module = type(exc).__module__
    if module.startswith("anyio") and names & _ANYIO_STREAM_ERRORS:
        return True
    if module.startswith("httpx") and names & {"TransportError", "TimeoutException"}:
        return True
    if "MCPError" in names or "McpError" in names:
        return getattr(exc, "code", None) in (_MCP_CONNECTION_CLOSED, _MCP_REQUEST_TIMEOUT)
    return isinstance(exc, RuntimeError) and str(exc).startswith("Client failed to connect")


def mcp_stdio(
    command: str,
    args: Sequence[str] = (),
    *,
    server: str,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    retry_safe: Iterable[str] = (),
    never_retry: Iterable[str] = (),
    timeout: float | None = None,
) -> RecoverableMCP:
    """An MCP server started as a subprocess speaking stdio, wrapped for recovery."""
    from fastmcp.client.transports import StdioTransport
    from pydantic_ai.mcp import MCPToolset

    transport = StdioTransport(command=command, args=list(args), env=dict(env) if env else None, cwd=cwd)
    toolset = MCPToolset(transport, id=server, init_timeout=timeout, read_timeout=timeout)
    return RecoverableMCP(toolset, server=server, retry_safe=frozenset(retry_safe), never_retry=frozenset(never_retry))


def mcp_http(
    url: str,
    *,
    server: str,
    headers: Mapping[str, str] | None = None,
    retry_safe: Iterable[str] = (),
    never_retry: Iterable[str] = (),
    timeout: float | None = None,
) -> RecoverableMCP:
    """An MCP server reached over streamable HTTP, wrapped for recovery."""
    from pydantic_ai.mcp import MCPToolset

    toolset = MCPToolset(
        url, id=server, headers=dict(headers) if headers else None, init_timeout=timeout, read_timeout=timeout
    )
    return RecoverableMCP(toolset, server=server, retry_safe=frozenset(retry_safe), never_retry=frozenset(never_retry))
