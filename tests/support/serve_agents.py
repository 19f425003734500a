"""The scripted agent the end-to-end test configures in real `candor serve` processes (`serve_agents:factory`).

Its model is a `FunctionModel` that reads the history and answers:

1. first turn: calls the client tool `get_weather` (declared by the HTTP client, §8.8) and `delete_file`, which
   requires approval, in one response → the run ends `waiting` with both pending;
2. once both have answers: calls `slow_step`, a retry-safe tool whose *first* execution (across all processes:
   `slow.txt` in `options["workdir"]` is still empty) blocks for `options["block_seconds"]`, long enough for the test
   to SIGKILL that worker; a replay by the recovering attempt returns at once;
3. after `slow_step` returned: a final text built from the three tool results.

Every tool effect appends a line `<E2E_WORKER> <tool_call_id>` to `<workdir>/<tool>.txt` (fsynced), so the test
knows which worker process runs the slow step and that the approved tool ran exactly once.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, RunContext, Tool
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from candor import Harness
from candor.tools import recovery_retryable

__all__ = ("FACTORY", "WORKER_ENV", "factory", "latest_returns", "tool_lines")

FACTORY = f"{__name__}:factory"
WORKER_ENV = "E2E_WORKER"
"""Names the worker process in the tool effect lines."""


def tool_lines(workdir: Path, tool: str) -> list[str]:
    path = workdir / f"{tool}.txt"
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def _record(workdir: Path, tool: str, tool_call_id: str) -> int:
    """Append this execution's line; returns how many executions of `tool` were recorded before it."""
    before = len(tool_lines(workdir, tool))
    with open(workdir / f"{tool}.txt", "a", encoding="utf-8") as handle:
        handle.write(f"{os.environ.get(WORKER_ENV, 'unknown')} {tool_call_id}\n")
        handle.flush()
        os.fsync(handle.fileno())
    return before


def latest_returns(messages: list[ModelMessage]) -> dict[str, Any]:
    """Tool name → the content of its latest return in the history."""
    found: dict[str, Any] = {}
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, ToolReturnPart):
                    found[part.tool_name] = part.content
    return found


def _respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returns = latest_returns(messages)
    if "slow_step" in returns:
        weather = returns["get_weather"]
        return ModelResponse(parts=[TextPart(f"weather {weather}; {returns['delete_file']}; {returns['slow_step']}")])
    if "get_weather" in returns and "delete_file" in returns:
        return ModelResponse(parts=[ToolCallPart("slow_step", {}, tool_call_id="call_slow")])
    return ModelResponse(
        parts=[
            ToolCallPart("get_weather", {"city": "Paris"}, tool_call_id="call_weather"),
            ToolCallPart("delete_file", {"path": "a.txt"}, tool_call_id="call_delete"),
        ]
    )


def factory(options: dict[str, Any]) -> Harness[Any]:
    workdir = Path(options["workdir"])
    block_seconds = float(options.get("block_seconds", 30.0))

    async def delete_file(ctx: RunContext[Any], path: str) -> str:
        """Delete a file (needs the user's approval)."""
        assert ctx.tool_call_id is not None
        _record(workdir, "delete_file", ctx.tool_call_id)
        return f"deleted {path}"

    async def slow_step(ctx: RunContext[Any]) -> str:
        """Take one slow step (safe to repeat)."""
        assert ctx.tool_call_id is not None
        if _record(workdir, "slow_step", ctx.tool_call_id) == 0:
            await asyncio.sleep(block_seconds)  # the test kills this process meanwhile
        return "slow step done"

    agent = Agent(
        FunctionModel(_respond),
        tools=[Tool(delete_file, requires_approval=True), recovery_retryable(Tool(slow_step))],
    )
    return Harness(agent)
