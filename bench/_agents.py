"""Scripted agents the service benchmarks host: no API key, no network, deterministic.

Not a benchmark itself (private module, skipped by `bench.run_all`). Worker processes import the factory by its
settings string, `CANDOR_AGENTS__<name>__FACTORY=bench._agents:factory` (the repository root is on `PYTHONPATH`).
The run's `options` choose the script:

* `{"script": "loop", "steps": N, "step_seconds": S, "model_seconds": M}` – the model (sleeping M seconds per
  response, default 0) asks for one `step` tool call per response, N times, then answers `finished N steps`;
  `step` sleeps S seconds (default 0) and returns 200 bytes. It counts
  the responses already in the history, so a continuation (after a crash or a handoff) carries on where the last
  checkpoint left off. `step` is declared retry-safe, so a continuation re-runs an interrupted call. With
  `"step_log": PATH`, an attempt that reaches the final answer appends one JSON line `{"intervals": [...]}` to
  PATH: the seconds between its consecutive model requests (bench/_step_clock.py, `bench.production_steps`).
* `{"script": "approval"}` – the model calls `approve_me`, which requires approval, so the run waits (§8.6); once
  approved it answers `approved`.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from pydantic_ai import Agent, Tool
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

from candor import Harness
from candor.tools import recovery_retryable

from ._step_clock import step_intervals

FACTORY = f"{__name__}:factory"
TOOL_RESULT = "r" * 200
APPROVAL_CALL_ID = "call_approve"
"""The tool call id of the approval script's pending call: the key of a resume body's `approvals` map."""


def _responses(messages: list[ModelMessage]) -> int:
    return sum(1 for message in messages if isinstance(message, ModelResponse))


def _append_intervals(step_log: str, request_times: list[float]) -> None:
    # One short append per run (O_APPEND): the worker's runs share the file without interleaving lines.
    with open(step_log, "a", encoding="utf-8") as log:
        log.write(json.dumps({"intervals": step_intervals(request_times)}) + "\n")


def loop_agent(
    steps: int, step_seconds: float, model_seconds: float = 0.0, step_log: str | None = None
) -> Agent[None, str]:
    """The loop script; with `step_log`, the agent (made per attempt by `factory`) times its model requests."""
    request_times: list[float] = []

    async def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        request_times.append(time.monotonic())
        if model_seconds > 0:
            await asyncio.sleep(model_seconds)
        done = _responses(messages)
        if done < steps:
            return ModelResponse(parts=[ToolCallPart("step", {"n": done}, tool_call_id=f"call_{done:06d}")])
        if step_log is not None:
            _append_intervals(step_log, request_times)
        return ModelResponse(parts=[TextPart(f"finished {steps} steps")])

    async def step(n: int) -> str:
        """One unit of work."""
        if step_seconds > 0:
            await asyncio.sleep(step_seconds)
        return TOOL_RESULT

    return Agent(FunctionModel(script, model_name="bench-loop"), tools=[recovery_retryable(Tool(step))])


def approval_agent() -> Agent[None, str]:
    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if _responses(messages) == 0:
            return ModelResponse(parts=[ToolCallPart("approve_me", {}, tool_call_id=APPROVAL_CALL_ID)])
        return ModelResponse(parts=[TextPart("approved")])

    def approve_me() -> str:
        """An action a human must approve."""
        return "done"

    return Agent(FunctionModel(script, model_name="bench-approval"), tools=[Tool(approve_me, requires_approval=True)])


def factory(options: dict[str, Any]) -> Harness[Any]:
    """`(options) -> Harness` (§3.2): a fresh harness per attempt; see the module docstring for the options."""
    script = options.get("script", "loop")
    if script == "loop":
        steps = int(options.get("steps", 5))
        # Room for every tool call plus the answer (pydantic-ai's default request_limit is 50).
        step_seconds, model_seconds = float(options.get("step_seconds", 0.0)), float(options.get("model_seconds", 0.0))
        limits = UsageLimits(request_limit=steps + 10)
        agent = loop_agent(steps, step_seconds, model_seconds, options.get("step_log"))
        return Harness(agent, usage_limits=limits)
    if script == "approval":
        return Harness(approval_agent())
    raise ValueError(f"unknown bench script {script!r}")
