"""The only module that touches pydantic-ai internals-adjacent surfaces: hooks, nodes and the prepared tool surface.

Everything pydantic-ai-version-specific that the harness relies on is here, so an upgrade of the pinned
pydantic-ai-slim has one place to look at.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pydantic_ai import ApprovalRequired, CallDeferred, DeferredToolRequests, DeferredToolResults, ToolDenied
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import ModelAPIError, ModelConnectionError, ModelHTTPError, ModelRequestTimeout
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    SystemPromptPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models import Model
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.run import AgentRun
from pydantic_ai.tools import RunContext, ToolDefinition

from .mcp_policy import ToolServerUnavailable, tool_unavailable_failure
from .results import SafeFailure

__all__ = (
    "deferred_output_type",
    "prepared_surface",
    "output_tool_names",
    "model_streams",
    "classify_agent_exception",
    "HarnessCapability",
)

DENIED_UNSUPPORTED_MESSAGE = "This tool call needs a person or an outside system, which this run cannot wait for."


def deferred_output_type(agent: AbstractAgent[Any, Any]) -> Any:
    """The agent's own output type plus `DeferredToolRequests` (spec §3.5: the agent need not declare it)."""
    if getattr(agent, "_output_validators", None):
        # pydantic-ai refuses a run-level output type next to output validators: such an agent can suspend
        # only if it declares DeferredToolRequests in its own output type (docs/state-and-resume.md).
        return None
    output_type = agent.output_type
    members = list(output_type) if isinstance(output_type, (list, tuple)) else [output_type]
    if DeferredToolRequests not in members:
        members.append(DeferredToolRequests)
    return members


def prepared_surface(run: AgentRun[Any, Any]) -> dict[str, ToolDefinition]:
    """Tool name → definition as prepared for this run step (agent toolsets, run toolsets, capabilities)."""
    manager = run.ctx.deps.tool_manager
    tools = manager.tools or {}
    return {name: tool.tool_def for name, tool in tools.items() if tool.tool_def.kind != "output"}


def output_tool_names(run: AgentRun[Any, Any]) -> frozenset[str]:
    tools = run.ctx.deps.tool_manager.tools or {}
    return frozenset(name for name, tool in tools.items() if tool.tool_def.kind == "output")


def args_validator(run: AgentRun[Any, Any], tool_name: str) -> Any | None:
    """The pydantic validator of a tool's arguments in this run's surface (H-75)."""
    tools = run.ctx.deps.tool_manager.tools or {}
    tool = tools.get(tool_name)
    return None if tool is None else tool.args_validator


def tool_function(run: AgentRun[Any, Any], tool_name: str) -> Any | None:
    """The Python function behind a function tool of this run's surface, or `None` (reconcile.py's registry).

    pydantic-ai 2.68 keeps it as `FunctionToolsetTool.call_func`, the bound `FunctionSchema.call`; combined and
    wrapper toolsets put their own tool around it, reachable through `source_tool`.
    """
    tools = run.ctx.deps.tool_manager.tools or {}
    tool = tools.get(tool_name)
    for _ in range(16):  # wrappers nest a few levels at most; never loop on a cycle
        if tool is None or hasattr(tool, "call_func"):
            break
        tool = getattr(tool, "source_tool", None)
    call = getattr(tool, "call_func", None)
    return getattr(getattr(call, "__self__", None), "function", None)


def model_streams(agent: AbstractAgent[Any, Any], bound: Model | None = None) -> bool:
    """Whether model requests can be streamed: a `FunctionModel` without `stream_function` cannot. `bound` is the
    run's `RunBindings.model`, which replaces the agent's own."""
    model = bound if bound is not None else getattr(agent, "model", None)
    return not (isinstance(model, FunctionModel) and model.stream_function is None)


def classify_agent_exception(exc: BaseException) -> SafeFailure:
    """H-31: a foreign exception that escaped the agent → a safe failure; the message is never copied."""
    details = {"error_type": type(exc).__name__}
    if isinstance(exc, ToolServerUnavailable):
        return tool_unavailable_failure(exc)
    transient = False
    if isinstance(exc, ModelHTTPError):
        transient = exc.status_code in (408, 429) or exc.status_code >= 500
    elif isinstance(exc, (ModelConnectionError, ModelRequestTimeout)):
        # Only the model client's own errors: a tool's TimeoutError is the tool's failure, not the model's.
        transient = True
    elif isinstance(exc, ModelAPIError) and type(exc).__name__ in {
        "ModelRateLimitError",
        "ModelUnavailableError",
        "ModelOverloadedError",
        "ModelServerError",
    }:
        transient = True
    if transient:
        return SafeFailure(
            code="model_unavailable",
            message="The model provider is unavailable; a new run may succeed.",
            details=details,
            retry_hint="new_run",
        )
    return SafeFailure(
        code="agent_run_failed",
        message="The agent run raised an error; fix the failing tool, model or output code.",
        details=details,
        retry_hint="dependency_change",
    )


def harness_capabilities(*, deferred_tools_supported: bool, refresh_system_prompt: bool) -> list[HarnessCapability]:
    """candor's own capability for a run, or none when the run needs none of its hooks.

    pydantic-ai calls every hook of every capability at every step, each with a copy of the run context, so a capability
    with nothing to do still costs CPU at every step. The hooks do something only for H-84 (a run that cannot suspend)
    and H-107 (a thread's stored system prompts replaced); the stamping of deferrals (§5) happens when the run suspends
    (`deferred.stamp_function_ids`).
    """
    if deferred_tools_supported and not refresh_system_prompt:
        return []
    capability = HarnessCapability(
        deferred_tools_supported=deferred_tools_supported, refresh_system_prompt=refresh_system_prompt
    )
    return [capability]


@dataclass
class HarnessCapability(AbstractCapability[Any]):
    """candor's own per-run capability: deferral stamping and the no-deferral policy (H-84)."""

    deferred_tools_supported: bool = True
    refresh_system_prompt: bool = False
    """H-107: when continuing a thread, send the current agent's system prompt instead of the stored ones."""

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None

    async def before_model_request(self, ctx: RunContext[Any], request_context: Any) -> Any:
        if not self.refresh_system_prompt or ctx.agent is None:
            return request_context
        messages = list(request_context.messages)
        # The one exception: a response the provider suspended is continued as it was (H-107).
        if any(isinstance(m, ModelResponse) and m.state == "suspended" for m in messages[-1:]):
            return request_context
        stripped = _without_system_prompts(messages)
        current = await ctx.agent.system_prompt_parts(  # the run's model: the agent may have none of its own
            deps=ctx.deps,
            model=ctx.model,  # type: ignore[arg-type]
            message_history=stripped,
            prompt=ctx.prompt,
            usage=ctx.usage,
        )
        # Only the copy sent to the model changes; stored messages are never rewritten (H-39).
        request_context.messages = _with_head(stripped, current)
        return request_context

    async def prepare_tools(self, ctx: RunContext[Any], tool_defs: list[ToolDefinition]) -> list[ToolDefinition]:
        if self.deferred_tools_supported:
            return tool_defs
        # H-84: external tools cannot be answered by a run that can never suspend.
        return [tool_def for tool_def in tool_defs if tool_def.kind != "external"]

    async def wrap_tool_execute(
        self, ctx: RunContext[Any], *, call: Any, tool_def: ToolDefinition, args: Any, handler: Any
    ) -> Any:
        try:
            return await handler(args)
        except (CallDeferred, ApprovalRequired):
            if self.deferred_tools_supported:
                raise
            # H-84: a deferral the tool raises is closed right here; pydantic-ai records a `ToolDenied` result as an
            # `outcome="denied"` return. Left to `handle_deferred_tool_calls`, a `CallDeferred` could only get a
            # `calls` answer, which pydantic-ai records as a success.
            return ToolDenied(DENIED_UNSUPPORTED_MESSAGE)

    async def handle_deferred_tool_calls(
        self, ctx: RunContext[Any], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        if self.deferred_tools_supported:
            return None
        # H-84: the deferrals no tool execution raised (approval-gated tools, an args validator's deferral) are
        # closed inside the run as denied; those a tool raises never get here (`wrap_tool_execute`).
        return DeferredToolResults(
            approvals={call.tool_call_id: ToolDenied(DENIED_UNSUPPORTED_MESSAGE) for call in requests.approvals},
            calls={
                call.tool_call_id: ToolDenied(DENIED_UNSUPPORTED_MESSAGE)
                for call in requests.calls
                # pydantic-ai passes a question's answer through the tool's result hooks, which turns a
                # `ToolDenied` into a denied return; an outside call's answer would be recorded as a success,
                # so that deferral is left to end the step (`deferred_tools_unsupported`).
                if requests.kind(call.tool_call_id) == "question"
            },
        )


def _without_system_prompts(messages: list[ModelMessage]) -> list[ModelMessage]:
    result: list[ModelMessage] = []
    for message in messages:
        if isinstance(message, ModelRequest) and any(isinstance(p, SystemPromptPart) for p in message.parts):
            parts = [p for p in message.parts if not isinstance(p, SystemPromptPart)]
            if not parts:
                continue
            message = dataclasses.replace(message, parts=parts)
        result.append(message)
    return result


def _with_head(messages: list[ModelMessage], head: list[SystemPromptPart]) -> list[ModelMessage]:
    if not head:
        return messages
    for index, message in enumerate(messages):
        if isinstance(message, ModelRequest):
            messages[index] = dataclasses.replace(message, parts=[*head, *message.parts])
            return messages
    return [ModelRequest(parts=list(head)), *messages]


async def restore_resumed_request(run: AgentRun[Any, Any], node: Any) -> None:
    """Undo pydantic-ai's pop of a trailing request and prepare this step's tools.

    When a history ends in a request (returns of some calls of the last response) and no prompt is given,
    pydantic-ai 2.68 pops that request to re-send it and prepares no tools. The harness must decide the
    remaining open calls first (it never hands pydantic-ai undecided calls), so it puts the request back
    and prepares the tool surface exactly as pydantic-ai does for a history ending in a response.
    """
    from pydantic_ai._agent_graph import build_run_context  # internal: pinned pydantic-ai-slim 2.68.0

    ctx = run.ctx
    ctx.state.message_history.append(node.request)
    run_context = dataclasses.replace(
        build_run_context(ctx),
        run_step=ctx.state.run_step + 1,
        retry=ctx.state.output_retries_used,
        max_retries=ctx.deps.tool_manager.default_max_retries,
    )
    ctx.deps.tool_manager = await ctx.deps.tool_manager.for_run_step(run_context)


def is_provider_continuation(node: Any) -> bool:
    """A request node that continues a provider-suspended response sends nothing new (H-59)."""
    return getattr(node, "_resume_suspended", None) is not None


def replace_final_request(run: AgentRun[Any, Any], parts: list[ModelRequestPart]) -> None:
    """Make `parts` the request that closes a run whose tool step just gave the final result.

    pydantic-ai 2.68 appends the step's tool returns as the last message and ends the run; the harness adds
    the results it made itself (H-44: one request, in call order), keeping pydantic-ai's request metadata.
    """
    messages = run.ctx.state.message_history
    if run.new_messages() and isinstance(messages[-1], ModelRequest):
        messages[-1] = dataclasses.replace(messages[-1], parts=list(parts))
    else:
        state = run.ctx.state
        messages.append(ModelRequest(parts=list(parts), run_id=state.run_id, conversation_id=state.conversation_id))


def skipped_after_final_result(call: ToolCallPart) -> ToolReturnPart:
    """The return pydantic-ai records for a call it does not run because the response's final result won."""
    from pydantic_ai._tool_execution import _TOOL_SKIPPED_FINAL_ALREADY_PROCESSED  # internal: pinned 2.68.0

    return ToolReturnPart(
        tool_name=call.tool_name, tool_call_id=call.tool_call_id, content=_TOOL_SKIPPED_FINAL_ALREADY_PROCESSED
    )


def replace_request(node: Any, request: Any) -> Any:
    """A copy of a `ModelRequestNode` that will send `request` instead."""
    return dataclasses.replace(node, request=request)
