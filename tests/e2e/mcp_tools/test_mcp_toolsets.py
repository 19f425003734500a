"""MCP toolsets against the real tool server (`tool_server.py`): annotations become the retry-safe declaration, the
served tool list is recorded with the checkpoint, a changed declaration is reported, and a server that is down or
lost fails the run `tool_unavailable` (issue 36, docs/mcp.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from candor import BoundaryEvent, Harness, HarnessState
from candor.mcp import mcp_http, mcp_stdio
from candor.tools import UNKNOWN_OUTCOME_CONTENT

from mcp_support import CALL_ID, SERVER, SERVER_NAME, calling_agent, http_server, ledger, toolset

pytestmark = pytest.mark.slow  # each test starts a real server process; bounded to a handful of calls


def _returns(history: Any, call_id: str) -> list[ToolReturnPart]:
    return [
        part
        for message in history
        for part in getattr(message, "parts", ())
        if isinstance(part, ToolReturnPart) and part.tool_call_id == call_id
    ]


def _surface_agent(seen: list[dict[str, dict[str, Any]]], toolsets: list[Any]) -> Agent[Any, Any]:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append({tool.name: dict(tool.metadata or {}) for tool in info.function_tools})
        return ModelResponse(parts=[TextPart("done")])

    return Agent(FunctionModel(respond), toolsets=toolsets)


EXPECTED_SURFACE = {
    # tool → (candor.recovery_retry_safe, candor.retry_safe_source)
    "read_balance": (True, "annotation"),
    "set_limit": (True, "annotation"),
    "wipe_cache": (None, "none"),
    "charge": (None, "none"),
}


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_annotations_become_the_prepared_retry_safe_declaration(tmp_path: Path, transport: str) -> None:
    """H-50, H-53: the prepared definitions carry the retry-safe key exactly for readOnlyHint / idempotentHint tools
    without destructiveHint, with their source; the served list (names and annotations only) is recorded in
    `candor.mcp.<server>`, without the command, URL or headers."""
    seen: list[dict[str, dict[str, Any]]] = []
    if transport == "http":
        with http_server(tmp_path) as url:
            ts = toolset(tmp_path, url=url, headers={"Authorization": "Bearer SECRET-MARKER"})
            result = await Harness(_surface_agent(seen, [ts])).run("hi")
    else:
        result = await Harness(_surface_agent(seen, [toolset(tmp_path)])).run("hi")

    assert result.status == "completed"
    surface = seen[0]
    assert {
        name: (surface[name].get("candor.recovery_retry_safe"), surface[name]["candor.retry_safe_source"])
        for name in EXPECTED_SURFACE
    } == EXPECTED_SURFACE
    assert result.state is not None
    recorded = result.state.capabilities[f"candor.mcp.{SERVER_NAME}"]
    assert recorded.version == "1"
    assert recorded.data == {
        "tools": {
            "charge": {"readOnlyHint": False, "idempotentHint": False, "destructiveHint": False},
            "read_balance": {"readOnlyHint": True, "idempotentHint": False, "destructiveHint": False},
            "set_limit": {"readOnlyHint": False, "idempotentHint": True, "destructiveHint": False},
            "wipe_cache": {"readOnlyHint": False, "idempotentHint": True, "destructiveHint": True},
        }
    }
    dumped = result.state.model_dump_json()
    # No command line, URL or credential in the checkpoint (issue 36 item 2).
    assert str(SERVER) not in dumped and "127.0.0.1" not in dumped and "SECRET-MARKER" not in dumped


async def test_overrides_win_over_annotations(tmp_path: Path) -> None:
    """H-53: `retry_safe` marks an unannotated tool, `never_retry` unmarks an annotated one; both say `override`."""
    seen: list[dict[str, dict[str, Any]]] = []
    ts = toolset(tmp_path, retry_safe=["charge"], never_retry=["read_balance"])
    await Harness(_surface_agent(seen, [ts])).run("hi")
    assert seen[0]["charge"]["candor.recovery_retry_safe"] is True
    assert seen[0]["charge"]["candor.retry_safe_source"] == "override"
    assert "candor.recovery_retry_safe" not in seen[0]["read_balance"]
    assert seen[0]["read_balance"]["candor.retry_safe_source"] == "override"


async def _state_at_tool_boundary(workdir: Path, tool: str) -> HarnessState:
    """The checkpoint a host saves right after the model asked for `tool` (H-37): the call open, nothing ran."""
    agent, _ = calling_agent(tool, [toolset(workdir)])
    async with Harness(agent).stream("go") as stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent) and event.kind == "tool":
                return await stream.export_state()
    raise AssertionError("no tool boundary")


@pytest.mark.parametrize(
    ("tool", "rerun", "declared_by"),
    [("read_balance", True, "annotation"), ("charge", False, "none")],
)
async def test_a_recovery_judges_by_the_declaration_recorded_with_the_call(
    tmp_path: Path, tool: str, rerun: bool, declared_by: str
) -> None:
    """H-46, issue 36 item 2: the server is redeployed with `charge` and `read_balance` declared the other way round;
    the recovering run judges the open call by what was declared when it was made, and says the declaration
    changed."""
    state = await _state_at_tool_boundary(tmp_path, tool)
    assert ledger(tmp_path) == []  # H-36: nothing ran after the boundary
    agent, _ = calling_agent(tool, [toolset(tmp_path, CANDOR_MCP_FLIP="1")])
    result = await Harness(agent).run(previous_state=state, tool_recovery="declared")

    assert result.status == "completed"
    assert ledger(tmp_path) == ([f"{tool} acme"] if rerun else [])
    assert result.state is not None
    (answer,) = _returns(result.state.message_history, CALL_ID)
    assert (answer.content == UNKNOWN_OUTCOME_CONTENT) is not rerun
    recovery: Any = result.state.capabilities["candor.recovery"].data  # recorded JSON, read field by field
    basis = recovery["calls"][CALL_ID]
    assert basis["declared_by"] == declared_by and basis["declaration_changed"] is True
    # The record now holds what the redeployed server declares, for calls made from here on.
    record: Any = result.state.capabilities[f"candor.mcp.{SERVER_NAME}"].data
    now = record["tools"]
    assert now["charge"]["readOnlyHint"] is True and now["read_balance"]["readOnlyHint"] is False


def _answered_then_open() -> HarnessState:
    """A history with one answered call (an earlier response) and one open call of the last response."""
    answered = ToolCallPart("read_balance", {"account": "acme"}, tool_call_id="call_0")
    return HarnessState(
        schema_version="1",
        thread_id="thr_mcpdown",
        message_history=(
            ModelRequest.user_text_prompt("go"),
            ModelResponse(parts=[answered]),
            ModelRequest(parts=[ToolReturnPart("read_balance", "read_balance done for acme", tool_call_id="call_0")]),
            ModelResponse(parts=[ToolCallPart("charge", {"account": "acme"}, tool_call_id=CALL_ID)]),
        ),
    )


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_server_that_is_down_fails_the_run_tool_unavailable(tmp_path: Path, transport: str) -> None:
    """H-31, H-103, issue 36 item 3: a server that cannot be reached when the run starts (here: recovers) ends it
    `failed` with `tool_unavailable` and retry_hint `new_run`, naming the server, not the transport's error; the
    answered call keeps its return. (Per H-103 the failed state closes the open call; the service does not keep
    that state, it retries the attempt from its checkpoint.)"""
    if transport == "http":
        down = mcp_http("http://127.0.0.1:9/mcp", server=SERVER_NAME, timeout=5)  # discard port: nothing listens
    else:
        down = mcp_stdio(sys.executable, ["-c", "raise SystemExit(3)"], server=SERVER_NAME, timeout=5)
    agent, seen = calling_agent("charge", [down])
    state = _answered_then_open()
    result = await Harness(agent).run(previous_state=state, tool_recovery="declared")

    assert result.status == "failed" and seen == []  # no model request was sent
    assert result.failure is not None
    assert (result.failure.code, result.failure.retry_hint) == ("tool_unavailable", "new_run")
    assert result.failure.details == {"error_type": "ToolServerUnavailable", "server": SERVER_NAME, "stage": "connect"}
    assert result.state is not None
    history = result.state.message_history
    assert list(history[:4]) == list(state.message_history)
    assert _returns(history, "call_0")[0].content == "read_balance done for acme"
    assert ledger(tmp_path) == []


async def test_a_server_lost_mid_call_fails_the_run_instead_of_asking_the_model_to_retry(tmp_path: Path) -> None:
    """Issue 36 item 3: the stdio server dies during `charge` (after its effect). pydantic-ai would turn the closed
    connection into a retry prompt and the model would call again blindly; the run ends `tool_unavailable`
    instead, with the call's outcome unknown (H-103), and the charge ran once."""
    agent, seen = calling_agent("charge", [toolset(tmp_path, CANDOR_MCP_DIE="charge")])
    result = await Harness(agent).run("go")

    assert result.status == "failed" and result.failure is not None
    assert (result.failure.code, result.failure.details["stage"]) == ("tool_unavailable", "call_tool")
    assert ledger(tmp_path) == ["charge acme"]
    assert len(seen) == 1  # the model was not asked again
    assert result.state is not None
    (answer,) = _returns(result.state.message_history, CALL_ID)
    assert answer.content == UNKNOWN_OUTCOME_CONTENT
