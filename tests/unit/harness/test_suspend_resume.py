"""Run-level tests of suspension and a fresh resume (spec §3.9, §4.F, §5, §6), through the public API only.

Agents are scripted `FunctionModel`s; a `ScriptedModel` records what every model request saw, so "before any model
work" is checked as "the model was never called".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic_ai import (
    Agent,
    ApprovalRequired,
    CallDeferred,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    Tool,
    ToolApproved,
    ToolDenied,
)
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import ModelRetry, SkipToolExecution, ToolFailed
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ToolCallPart,
    ToolReturn,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.tools import ToolDefinition

from candor import CapabilityState, DeferredToolResume, Harness, HarnessState, RunBindings
from candor.errors import DefinitionError, RunError
from candor.tools import UNKNOWN_OUTCOME_CONTENT, recovery_retryable

from scripted import ScriptedModel, external, returns, text, tool_calls

FUNCTION_ID_KEY = "candor.deferred_function_id"


# ----------------------------------------------------------------------------------------------- helpers


def user_prompts(messages: Sequence[ModelMessage]) -> list[Any]:
    return [
        part.content
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart)
    ]


def state_of(*messages: ModelMessage, thread_id: str = "thr_host") -> HarnessState:
    return HarnessState(schema_version="1", thread_id=thread_id, message_history=list(messages))


@dataclass
class Gates:
    """Three deferrals in one response: an approval (c1), an external call (c2), and a plain sibling (c3)."""

    script: ScriptedModel
    agent: Agent[None, str]
    ran: list[Any] = field(default_factory=list)
    bindings: RunBindings = field(default_factory=lambda: RunBindings(toolsets=[external("ext")]))


def gates(*, sibling: bool = False, after: Sequence[ModelResponse] = (text("done"),)) -> Gates:
    first: list[tuple[str, str, dict[str, Any]]] = [("c1", "gated", {"n": 1}), ("c2", "ext", {"q": "x"})]
    if sibling:
        first.append(("c3", "plain", {}))
    script = ScriptedModel(tool_calls(*first), *after)
    agent: Agent[None, str] = Agent(FunctionModel(script))
    g = Gates(script=script, agent=agent)

    @agent.tool(requires_approval=True)
    def gated(ctx: RunContext[None], n: int) -> str:
        g.ran.append(("gated", n, ctx.tool_call_approved))
        return f"g{n}"

    @agent.tool_plain
    def plain() -> str:
        g.ran.append("plain")
        return "p"

    return g


async def suspended(g: Gates, prompt: str = "hi") -> Any:
    result = await Harness(g.agent).run(prompt, bindings=g.bindings)
    assert result.status == "suspended", result.failure
    return result


# ----------------------------------------------------------------------------------------------- H-63


async def test_deferral_suspends_with_state_and_sibling_returns() -> None:
    """H-63: approval and external deferrals suspend the run; the deferred calls do not run, the sibling does."""
    g = gates(sibling=True)
    result = await Harness(g.agent).run("hi", bindings=g.bindings)

    assert result.status == "suspended"
    assert result.suspend_reason == "deferred"
    assert result.output is None
    assert result.state is not None
    assert result.failure is None
    deferred = result.deferred
    assert deferred is not None
    assert [c.tool_call_id for c in deferred.approvals] == ["c1"]
    assert [c.tool_call_id for c in deferred.calls] == ["c2"]
    assert deferred.kind("c1") == "approval" and deferred.kind("c2") == "external"
    assert g.ran == ["plain"]  # the deferred approval did not run, the sibling ran once
    history = result.state.message_history
    assert [p.content for p in returns(history, "c3")] == ["p"]
    assert returns(history, "c1") == [] and returns(history, "c2") == []
    assert result.all_messages() == list(history)


async def test_function_tool_deferrals_are_categorised_and_stamped() -> None:
    """H-63, §5: CallDeferred of a local tool → external or question call stamped with candor.deferred_function_id;
    ApprovalRequired → an approval that carries its metadata."""
    script = ScriptedModel(tool_calls(("e1", "later", {}), ("q1", "ask", {}), ("a1", "guarded", {})))
    agent: Agent[None, str] = Agent(FunctionModel(script))

    @agent.tool_plain
    def later() -> str:
        raise CallDeferred({"job": "j-1"})

    @agent.tool_plain
    def ask() -> str:
        raise CallDeferred({"prompt": "colour?"}, kind="question")

    @agent.tool
    def guarded(ctx: RunContext[None]) -> str:
        if not ctx.tool_call_approved:
            raise ApprovalRequired({"reason": "spend"})
        return "ok"

    result = await Harness(agent).run("hi")

    assert result.status == "suspended"
    deferred = result.deferred
    assert deferred is not None
    assert {c.tool_call_id for c in deferred.calls} == {"e1", "q1"}
    assert [c.tool_call_id for c in deferred.approvals] == ["a1"]
    assert deferred.kind("e1") == "external" and deferred.kind("q1") == "question"
    assert deferred.metadata["e1"] == {"job": "j-1", FUNCTION_ID_KEY: "later"}
    assert deferred.metadata["q1"] == {"prompt": "colour?", FUNCTION_ID_KEY: "ask"}
    assert deferred.metadata["a1"]["reason"] == "spend"


async def test_resume_after_sibling_ran() -> None:
    """H-63, H-74: a state whose sibling calls already returned is resumed by a fresh batch like any other."""
    g = gates(sibling=True)
    first = await suspended(g)
    deferred = first.deferred
    batch = DeferredToolResume(deferred, deferred.build_results(approve_all=True, calls={"c2": "answer"}))

    result = await Harness(g.agent).run(previous_state=first.state, deferred_resume=batch, bindings=g.bindings)

    assert result.status == "completed"
    assert result.output == "done"
    assert g.ran == ["plain", ("gated", 1, True)]
    assert result.state is not None
    history = result.state.message_history
    for call_id, content in (("c1", "g1"), ("c2", "answer"), ("c3", "p")):
        assert [p.content for p in returns(history, call_id)] == [content]


# ----------------------------------------------------------------------------------------------- H-64, H-65..H-73


@pytest.mark.parametrize(
    ("options", "code"),
    [
        pytest.param({"deferred_resume": "batch"}, "deferred_resume_invalid", id="not-a-batch"),
        pytest.param(
            {"deferred_resume": "batch", "previous_state": "state"},
            "deferred_resume_invalid",
            id="not-a-batch-with-state",
        ),
        pytest.param({"deferred_resume": "valid"}, "deferred_state_required", id="no-previous-state"),
    ],
)
async def test_batch_argument_errors_are_synchronous(options: dict[str, Any], code: str) -> None:
    """H-64: batch argument problems are raised by stream() itself and by run(), before any model work."""
    g = gates()
    first = await suspended(g)
    calls_before = g.script.calls
    valid = DeferredToolResume(first.deferred, first.deferred.build_results(approve_all=True, calls={"c2": "v"}))
    kwargs: dict[str, Any] = {}
    for key, value in options.items():
        kwargs[key] = {"batch": {"approvals": True}, "valid": valid, "state": first.state}[value]

    with pytest.raises(RunError) as raised:
        Harness(g.agent).stream(**kwargs, bindings=g.bindings)  # no `async with`, no iteration
    assert raised.value.code == code

    with pytest.raises(RunError) as raised:
        await Harness(g.agent).run(**kwargs, bindings=g.bindings)
    assert raised.value.code == code
    assert g.script.calls == calls_before
    assert g.ran == []


def _requests(deferred: DeferredToolRequests, **changes: Any) -> DeferredToolRequests:
    fields: dict[str, Any] = {
        "calls": list(deferred.calls),
        "approvals": list(deferred.approvals),
        "metadata": dict(deferred.metadata),
    }
    fields.update(changes)
    return DeferredToolRequests(**fields)


# Each case: (requests, results) built from the suspended result's `deferred` (c1 approval of gated, c2 external).
PREFLIGHT_CASES: list[Any] = [
    pytest.param(lambda d: (d, DeferredToolResults()), "deferred_results_incomplete", id="H-65-empty-results"),
    pytest.param(
        lambda d: (d, DeferredToolResults(calls={"c1": True, "c2": "v"})),
        "deferred_results_incomplete",
        id="H-65-approval-in-calls",
    ),
    pytest.param(
        lambda d: (d, d.build_results(approve_all=True)), "deferred_results_incomplete", id="H-86-approve-all-only"
    ),
    pytest.param(
        lambda d: (_requests(d, calls=[], approvals=[]), DeferredToolResults()),
        "deferred_requests_empty",
        id="H-66-empty",
    ),
    pytest.param(
        lambda d: (
            _requests(d, calls=[d.calls[0], d.approvals[0]]),
            DeferredToolResults(calls={"c1": "v", "c2": "v"}, approvals={"c1": True}),
        ),
        "deferred_request_category_overlap",
        id="H-66-overlap",
    ),
    pytest.param(
        lambda d: (d, DeferredToolResults(approvals={"c1": "approved"}, calls={"c2": "v"})),  # type: ignore[dict-item]  # H-67: a string is no approval
        "deferred_approval_invalid",
        id="H-67-approval-string",
    ),
    pytest.param(
        lambda d: (d, DeferredToolResults(approvals={"c1": True}, calls={"c2": ModelRetry("again")})),
        "deferred_results_invalid",
        id="H-67-model-retry",
    ),
    pytest.param(
        lambda d: (d, DeferredToolResults(approvals={"c1": True}, calls={"c2": {"x": math.nan}})),
        "deferred_results_invalid",
        id="H-68-nan",
    ),
    pytest.param(
        lambda d: (
            d,
            DeferredToolResults(approvals={"c1": ToolApproved(override_args={"n": math.inf})}, calls={"c2": 1}),
        ),
        "deferred_results_invalid",
        id="H-68-override-inf",
    ),
    pytest.param(
        lambda d: (d, DeferredToolResults(approvals={"c1": True}, calls={"c2": 1}, metadata={"zz": {}})),
        "deferred_metadata_invalid",
        id="H-69-foreign-key",
    ),
    pytest.param(
        lambda d: (
            _requests(d, calls=[ToolCallPart("ext", {"q": "x"}, tool_call_id="nope")]),
            DeferredToolResults(approvals={"c1": True}, calls={"nope": 1}),
        ),
        "deferred_request_missing",
        id="H-70-unknown-id",
    ),
    pytest.param(
        lambda d: (
            _requests(d, approvals=[ToolCallPart("plain", {"n": 1}, tool_call_id="c1")]),
            DeferredToolResults(approvals={"c1": True}, calls={"c2": 1}),
        ),
        "deferred_request_mismatch",
        id="H-72-tool-name",
    ),
    pytest.param(
        lambda d: (
            _requests(d, approvals=[ToolCallPart("gated", {"n": 2}, tool_call_id="c1")]),
            DeferredToolResults(approvals={"c1": True}, calls={"c2": 1}),
        ),
        "deferred_request_mismatch",
        id="H-72-args",
    ),
    pytest.param(
        lambda d: (
            _requests(d, approvals=[ToolCallPart("gated", '{"n": ', tool_call_id="c1")]),
            DeferredToolResults(approvals={"c1": True}, calls={"c2": 1}),
        ),
        "deferred_request_invalid",
        id="H-72-unparsable",
    ),
]


@pytest.mark.parametrize(("build", "code"), PREFLIGHT_CASES)
async def test_preflight_errors_are_synchronous_and_leave_no_trace(
    build: Callable[[DeferredToolRequests], tuple[DeferredToolRequests, DeferredToolResults]], code: str
) -> None:
    """H-64..H-72, H-73, H-86: stream() raises the RunError at call time; the state is untouched and still resumable."""
    g = gates(sibling=False)
    first = await suspended(g)
    state = first.state
    before = state.model_dump_json()
    calls_before = g.script.calls
    requests, results = build(first.deferred)
    batch = DeferredToolResume(requests, results)
    batch_before = repr(batch)

    with pytest.raises(RunError) as raised:
        Harness(g.agent).stream(previous_state=state, deferred_resume=batch, bindings=g.bindings)
    assert raised.value.code == code
    assert type(raised.value) is RunError

    with pytest.raises(RunError) as raised:
        await Harness(g.agent).run(previous_state=state, deferred_resume=batch, bindings=g.bindings)
    assert raised.value.code == code

    assert state.model_dump_json() == before  # H-73: no trace in the state
    assert repr(batch) == batch_before
    assert g.script.calls == calls_before and g.ran == []
    # H-73: the same state is resumed normally afterwards.
    good = DeferredToolResume(first.deferred, first.deferred.build_results(approve_all=True, calls={"c2": "v"}))
    result = await Harness(g.agent).run(previous_state=state, deferred_resume=good, bindings=g.bindings)
    assert result.status == "completed"
    assert g.ran == [("gated", 1, True)]


async def test_completed_pending_id_is_refused_synchronously() -> None:
    """H-71, H-73: a pending id whose call already has a return (the sibling that ran) → deferred_request_completed,
    raised by stream() itself; the state is unchanged."""
    g = gates(sibling=True)
    first = await suspended(g)
    before = first.state.model_dump_json()
    d = first.deferred
    batch = DeferredToolResume(
        _requests(d, calls=[*d.calls, ToolCallPart("plain", {}, tool_call_id="c3")]),
        DeferredToolResults(approvals={"c1": True}, calls={"c2": 1, "c3": 1}),
    )

    with pytest.raises(RunError) as raised:
        Harness(g.agent).stream(previous_state=first.state, deferred_resume=batch, bindings=g.bindings)

    assert raised.value.code == "deferred_request_completed"
    assert raised.value.details["tool_call_ids"] == ["c3"]
    assert first.state.model_dump_json() == before
    assert g.ran == ["plain"]


# ----------------------------------------------------------------------------------------------- H-74


async def _expect_surface_mismatch(
    agent: Agent[None, str], state: HarnessState, batch: DeferredToolResume, *, bindings: RunBindings | None = None
) -> DefinitionError:
    before = state.model_dump_json()
    stream = Harness(agent).stream(previous_state=state, deferred_resume=batch, bindings=bindings)
    events: list[Any] = []
    with pytest.raises(DefinitionError) as raised:
        async with stream:
            async for event in stream:
                events.append(event)
    assert raised.value.code == "deferred_surface_mismatch"
    assert events == []  # nothing, not even a boundary, before the check
    assert stream.result is None and stream.outcome is None  # H-73: no state is produced
    assert state.model_dump_json() == before
    return raised.value


async def test_removed_approval_tool_is_a_surface_mismatch() -> None:
    """H-74, H-73: an approval whose tool left the surface fails at the first step, before any model or tool work."""
    g = gates()
    first = await suspended(g)
    batch = DeferredToolResume(first.deferred, first.deferred.build_results(approve_all=True, calls={"c2": "v"}))
    script = ScriptedModel(text("never"))
    replacement: Agent[None, str] = Agent(FunctionModel(script))
    ran: list[str] = []

    @replacement.tool_plain
    def plain() -> str:
        ran.append("plain")
        return "p"

    error = await _expect_surface_mismatch(replacement, first.state, batch, bindings=g.bindings)

    assert error.details == {"tool_call_id": "c1", "category": "approval", "reason": "no_approvable_tool"}
    assert script.calls == 0 and ran == [] and g.ran == []
    with pytest.raises(DefinitionError):
        await Harness(replacement).run(previous_state=first.state, deferred_resume=batch, bindings=g.bindings)


@pytest.mark.parametrize(
    ("answer", "accepted"),
    [
        pytest.param("value", False, id="plain-value"),
        pytest.param(ToolReturn("value"), False, id="tool-return"),
        pytest.param(ToolFailed("client tool is gone"), True, id="tool-failed"),
    ],
)
async def test_removed_external_tool_accepts_only_tool_failed(answer: Any, accepted: bool) -> None:
    """H-74, H-79: once an external tool is removed, only a ToolFailed answer is accepted for its call."""
    script = ScriptedModel(tool_calls(("c2", "ext", {"q": "x"})), text("done"))
    agent: Agent[None, str] = Agent(FunctionModel(script))
    first = await Harness(agent).run("hi", bindings=RunBindings(toolsets=[external("ext")]))
    assert first.status == "suspended"
    assert first.deferred is not None
    batch = DeferredToolResume(first.deferred, DeferredToolResults(calls={"c2": answer}))

    if not accepted:
        assert first.state is not None
        error = await _expect_surface_mismatch(agent, first.state, batch)  # no ExternalToolset this time
        assert error.details["reason"] == "external_tool_removed"
        return
    result = await Harness(agent).run(previous_state=first.state, deferred_resume=batch)
    assert result.status == "completed"
    assert result.state is not None
    [part] = returns(result.state.message_history, "c2")
    assert (part.outcome, part.content) == ("failed", "client tool is gone")


@pytest.mark.parametrize("answer", ["value", ToolFailed("gone")], ids=["value", "tool-failed"])
async def test_local_tool_sharing_removed_external_name_never_matches(answer: Any) -> None:
    """H-74: a local function tool named like the removed external tool does not match, not even for ToolFailed."""
    script = ScriptedModel(tool_calls(("c2", "ext", {"q": "x"})), text("done"))
    agent: Agent[None, str] = Agent(FunctionModel(script))
    first = await Harness(agent).run("hi", bindings=RunBindings(toolsets=[external("ext")]))
    assert first.deferred is not None
    batch = DeferredToolResume(first.deferred, DeferredToolResults(calls={"c2": answer}))
    ran: list[str] = []
    impostor: Agent[None, str] = Agent(FunctionModel(ScriptedModel(text("never"))))

    @impostor.tool_plain
    def ext(q: str) -> str:
        ran.append(q)
        return "local"

    assert first.state is not None
    error = await _expect_surface_mismatch(impostor, first.state, batch)
    assert error.details["reason"] == "not_an_external_tool"
    assert ran == []


@pytest.mark.parametrize(
    ("metadata", "fits"),
    [
        pytest.param(None, True, id="same-name-no-metadata"),
        pytest.param({FUNCTION_ID_KEY: "ask"}, True, id="same-declared-id"),
        pytest.param({FUNCTION_ID_KEY: "other"}, False, id="other-declared-id"),
    ],
)
async def test_local_deferral_needs_the_same_function_id(metadata: dict[str, Any] | None, fits: bool) -> None:
    """H-74, §5: a question raised by a local tool needs a function tool with the same candor.deferred_function_id."""
    script = ScriptedModel(tool_calls(("q1", "ask", {})), text("done"))
    agent: Agent[None, str] = Agent(FunctionModel(script))

    @agent.tool_plain
    def ask() -> str:
        raise CallDeferred({"prompt": "?"}, kind="question")

    first = await Harness(agent).run("hi")
    assert first.deferred is not None
    assert first.deferred.metadata["q1"][FUNCTION_ID_KEY] == "ask"
    batch = DeferredToolResume(first.deferred, DeferredToolResults(calls={"q1": "blue"}))
    later = ScriptedModel(text("thanks"))
    current: Agent[None, str] = Agent(
        FunctionModel(later), tools=[Tool(lambda: "unused", name="ask", metadata=metadata)]
    )

    if not fits:
        assert first.state is not None
        error = await _expect_surface_mismatch(current, first.state, batch)
        assert error.details == {"tool_call_id": "q1", "category": "question", "reason": "no_matching_function_tool"}
        return
    result = await Harness(current).run(previous_state=first.state, deferred_resume=batch)
    assert result.status == "completed" and result.output == "thanks"
    assert result.state is not None
    assert [p.content for p in returns(result.state.message_history, "q1")] == ["blue"]


async def test_a_deferral_in_a_continued_thread_carries_its_function_id_too() -> None:
    """§5, H-74, H-107: a run continuing a thread (history given, so candor's capability refreshes the system
    prompt) stamps a local tool's deferral exactly as a thread's first run does."""
    first = await Harness(Agent(FunctionModel(ScriptedModel(text("hello"))))).run("hi")
    script = ScriptedModel(tool_calls(("q1", "ask", {})), text("done"))
    agent: Agent[None, str] = Agent(FunctionModel(script), system_prompt="Be brief.")

    @agent.tool_plain(metadata={FUNCTION_ID_KEY: "ask-v2"})
    def ask() -> str:
        raise CallDeferred({"prompt": "?"}, kind="question")

    second = await Harness(agent).run("again", previous_state=first.state)
    assert second.status == "suspended"
    assert second.deferred is not None
    assert second.deferred.metadata["q1"] == {"prompt": "?", FUNCTION_ID_KEY: "ask-v2"}


# ----------------------------------------------------------------------------------------------- H-75, H-76


@dataclass
class Policy(AbstractCapability[Any]):
    """A current-run capability that records what tool hooks see and can block calls by id."""

    seen: list[tuple[str, dict[str, Any], bool]] = field(default_factory=list)
    block: frozenset[str] = frozenset()

    async def before_tool_execute(
        self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition, args: Any
    ) -> Any:
        self.seen.append((call.tool_call_id, dict(args), ctx.tool_call_approved))
        if call.tool_call_id in self.block:
            raise SkipToolExecution("blocked by current policy")
        return args


async def test_override_args_are_coerced_and_hooks_see_them() -> None:
    """H-75: ToolApproved(override_args={"n": "4"}) runs the tool with 4; hooks see the overridden values; the
    stored call keeps its original arguments (§7)."""
    g = gates()
    first = await suspended(g)
    policy = Policy()
    batch = DeferredToolResume(
        first.deferred,
        first.deferred.build_results(approvals={"c1": ToolApproved(override_args={"n": "4"})}, calls={"c2": "v"}),
    )
    bindings = RunBindings(toolsets=[external("ext")], capabilities=[policy])

    result = await Harness(g.agent).run(previous_state=first.state, deferred_resume=batch, bindings=bindings)

    assert result.status == "completed"
    assert g.ran == [("gated", 4, True)]
    assert policy.seen == [("c1", {"n": 4}, True)]
    assert result.state is not None
    assert [p.content for p in returns(result.state.message_history, "c1")] == ["g4"]
    [call] = [
        p
        for m in result.state.message_history
        if isinstance(m, ModelResponse)
        for p in m.parts
        if isinstance(p, ToolCallPart) and p.tool_call_id == "c1"
    ]
    assert call.args == {"n": 1}


async def test_invalid_override_fails_before_any_tool_runs() -> None:
    """H-75, H-73: override_args that fail the current schema → deferred_override_invalid at the first step,
    before the model or any tool (not even another approved call of the batch) runs."""
    script = ScriptedModel(tool_calls(("a", "gated", {"n": 1}), ("b", "gated", {"n": 2})), text("never"))
    agent: Agent[None, str] = Agent(FunctionModel(script))
    ran: list[int] = []

    @agent.tool_plain(requires_approval=True)
    def gated(n: int) -> str:
        ran.append(n)
        return "g"

    first = await Harness(agent).run("hi")
    assert first.state is not None
    before = first.state.model_dump_json()
    assert first.deferred is not None
    batch = DeferredToolResume(
        first.deferred,
        first.deferred.build_results(approvals={"a": True, "b": ToolApproved(override_args={"n": "not a number"})}),
    )
    stream = Harness(agent).stream(previous_state=first.state, deferred_resume=batch)
    events: list[Any] = []

    with pytest.raises(RunError) as raised:
        async with stream:
            async for event in stream:
                events.append(event)

    assert raised.value.code == "deferred_override_invalid"
    assert raised.value.details["tool_call_id"] == "b"
    assert events == [] and ran == [] and script.calls == 1
    assert stream.outcome is None
    assert first.state.model_dump_json() == before


async def test_current_hook_blocks_an_approved_call() -> None:
    """H-76: the current run's hooks evaluate approved calls like fresh ones; a blocking hook prevents the call."""
    g = gates()
    first = await suspended(g)
    policy = Policy(block=frozenset({"c1"}))
    batch = DeferredToolResume(first.deferred, first.deferred.build_results(approve_all=True, calls={"c2": "v"}))

    result = await Harness(g.agent).run(
        previous_state=first.state,
        deferred_resume=batch,
        bindings=RunBindings(toolsets=[external("ext")], capabilities=[policy]),
    )

    assert result.status == "completed"
    assert g.ran == []  # approved, yet blocked by current policy
    assert [c[0] for c in policy.seen] == ["c1"]
    assert result.state is not None
    assert [p.content for p in returns(result.state.message_history, "c1")] == ["blocked by current policy"]


async def test_approval_required_tool_runs_once_approved() -> None:
    """H-76, H-55: a tool raising ApprovalRequired unless ctx.tool_call_approved is satisfied by the batch's approval."""
    script = ScriptedModel(tool_calls(("a1", "guarded", {"amount": 5})), text("paid"))
    agent: Agent[None, str] = Agent(FunctionModel(script))
    seen: list[tuple[int, bool]] = []

    @agent.tool
    def guarded(ctx: RunContext[None], amount: int) -> str:
        seen.append((amount, ctx.tool_call_approved))
        if not ctx.tool_call_approved:
            raise ApprovalRequired({"amount": amount})
        return "charged"

    first = await Harness(agent).run("pay")
    assert first.deferred is not None
    assert first.status == "suspended" and [c.tool_call_id for c in first.deferred.approvals] == ["a1"]
    assert first.deferred is not None
    batch = DeferredToolResume(first.deferred, DeferredToolResults(approvals={"a1": True}))

    result = await Harness(agent).run(previous_state=first.state, deferred_resume=batch)

    assert result.status == "completed" and result.output == "paid"
    assert seen == [(5, False), (5, True)]
    assert result.state is not None
    assert [p.content for p in returns(result.state.message_history, "a1")] == ["charged"]


# ----------------------------------------------------------------------------------------------- H-77, H-78, H-79


@pytest.mark.parametrize(
    "answer", [True, ToolApproved(), ToolApproved(override_args={"n": 7})], ids=["true", "approved", "override"]
)
async def test_host_built_history_and_native_answers(answer: Any) -> None:
    """H-77: a host builds the history and native answers itself, without candor metadata; stale metadata in
    history is ignored and the current implementation of the tool runs."""
    call = ToolCallPart("gated", {"n": 3}, tool_call_id="h1", provider_details={"stale": True})
    history: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart("import")]),
        ModelResponse(parts=[ToolCallPart("gated", {"n": 0}, tool_call_id="h0")]),
        ModelRequest(
            parts=[
                ToolReturnPart(
                    "gated", "old", tool_call_id="h0", metadata={"candor.deferred_function_id": "stale", "old": 1}
                )
            ]
        ),
        ModelResponse(parts=[call]),
    ]
    state = state_of(*history)
    script = ScriptedModel(text("imported"))
    agent: Agent[None, str] = Agent(FunctionModel(script))
    ran: list[int] = []

    @agent.tool_plain(requires_approval=True)
    def gated(n: int) -> str:
        ran.append(n)
        return f"current-{n}"

    batch = DeferredToolResume(DeferredToolRequests(approvals=[call]), DeferredToolResults(approvals={"h1": answer}))
    result = await Harness(agent).run(previous_state=state, deferred_resume=batch)

    expected = 7 if isinstance(answer, ToolApproved) and answer.override_args else 3
    assert result.status == "completed" and result.output == "imported"
    assert ran == [expected]
    assert result.state is not None
    assert [p.content for p in returns(result.state.message_history, "h1")] == [f"current-{expected}"]
    assert [p.content for p in returns(result.state.message_history, "h0")] == ["old"]


@pytest.mark.parametrize(
    ("answer", "content"),
    [
        pytest.param(False, ToolDenied().message, id="false"),
        pytest.param(ToolDenied("not today"), "not today", id="tool-denied"),
    ],
)
async def test_denials_record_denied_returns(answer: Any, content: str) -> None:
    """H-78: False or ToolDenied(message) → the tool does not run; history gets an outcome="denied" return."""
    g = gates()
    first = await suspended(g)
    batch = DeferredToolResume(first.deferred, DeferredToolResults(approvals={"c1": answer}, calls={"c2": "v"}))

    result = await Harness(g.agent).run(previous_state=first.state, deferred_resume=batch, bindings=g.bindings)

    assert result.status == "completed"
    assert g.ran == []
    assert result.state is not None
    [part] = returns(result.state.message_history, "c1")
    assert (part.outcome, part.content) == ("denied", content)


@pytest.mark.parametrize(
    ("answer", "outcome", "content"),
    [
        pytest.param(ToolFailed("timed out"), "failed", "timed out", id="tool-failed"),
        pytest.param({"rows": [1, 2], "ok": True}, "success", {"rows": [1, 2], "ok": True}, id="json-object"),
        pytest.param("plain text", "success", "plain text", id="json-string"),
        pytest.param(None, "success", None, id="json-null"),
    ],
)
async def test_external_answers_become_returns(answer: Any, outcome: str, content: Any) -> None:
    """H-79: ToolFailed → outcome failed with the message; a plain JSON value → outcome success with that content."""
    g = gates()
    first = await suspended(g)
    batch = DeferredToolResume(first.deferred, DeferredToolResults(approvals={"c1": False}, calls={"c2": answer}))

    result = await Harness(g.agent).run(previous_state=first.state, deferred_resume=batch, bindings=g.bindings)

    assert result.status == "completed"
    assert result.state is not None
    [part] = returns(result.state.message_history, "c2")
    assert (part.outcome, part.content) == (outcome, content)


async def test_tool_return_answer_keeps_value_metadata_and_adds_content_once() -> None:
    """H-79, H-83: ToolReturn(value, content, metadata) → value as return content, metadata kept, content appended a
    single time as user-prompt content, after the returns and before the new input."""
    g = gates()
    first = await suspended(g)
    answer = ToolReturn({"id": 9}, content="see the attached summary", metadata={"source": "crm"})
    batch = DeferredToolResume(first.deferred, DeferredToolResults(approvals={"c1": True}, calls={"c2": answer}))

    result = await Harness(g.agent).run(
        "and now?", previous_state=first.state, deferred_resume=batch, bindings=g.bindings
    )

    assert result.status == "completed"
    assert result.state is not None
    history = result.state.message_history
    [part] = returns(history, "c2")
    assert (part.outcome, part.content, part.metadata) == ("success", {"id": 9}, {"source": "crm"})
    assert user_prompts(history).count("see the attached summary") == 1
    sent = g.script.seen[-1]
    assert user_prompts(sent).count("see the attached summary") == 1
    request = result.new_messages()[0]
    assert isinstance(request, ModelRequest)
    kinds = [(type(p).__name__, getattr(p, "tool_call_id", None) or getattr(p, "content", None)) for p in request.parts]
    assert [k for k, _ in kinds] == ["ToolReturnPart", "ToolReturnPart", "UserPromptPart", "UserPromptPart"]
    assert [v for _, v in kinds][2:] == ["see the attached summary", "and now?"]


# ----------------------------------------------------------------------------------------------- H-80 .. H-83


@pytest.mark.parametrize("mode", ["never", "always", "declared"])
async def test_fresh_batch_switches_tool_recovery_off(mode: str) -> None:
    """H-80: a fresh batch alone decides: its approval runs even under "never", and an open call outside the batch
    is closed with an unknown outcome even if it is retry-safe and the mode is "always"."""
    response = tool_calls(("c1", "gated", {"n": 1}), ("c2", "safe", {}))
    state = state_of(ModelRequest(parts=[UserPromptPart("hi")]), response)
    script = ScriptedModel(text("done"))
    ran: list[str] = []

    def gated(n: int) -> str:
        ran.append("gated")
        return "g"

    def safe() -> str:
        ran.append("safe")
        return "s"

    agent: Agent[None, str] = Agent(
        FunctionModel(script), tools=[Tool(gated, requires_approval=True), recovery_retryable(safe)]
    )
    approval = response.parts[0]
    assert isinstance(approval, ToolCallPart)
    batch = DeferredToolResume(DeferredToolRequests(approvals=[approval]), DeferredToolResults(approvals={"c1": True}))

    result = await Harness(agent).run(previous_state=state, deferred_resume=batch, tool_recovery=mode)

    assert result.status == "completed"
    assert ran == ["gated"]
    assert result.state is not None
    history = result.state.message_history
    assert [p.content for p in returns(history, "c1")] == ["g"]
    [unknown] = returns(history, "c2")
    assert (unknown.outcome, unknown.content) == ("interrupted", UNKNOWN_OUTCOME_CONTENT)


async def test_reused_call_ids_are_handled_per_cycle() -> None:
    """H-81: a later response reuses a call id; each suspend/resume cycle is handled on its own."""
    script = ScriptedModel(tool_calls(("x", "gated", {"n": 1})), tool_calls(("x", "gated", {"n": 2})), text("done"))
    agent: Agent[None, str] = Agent(FunctionModel(script))
    ran: list[int] = []

    @agent.tool_plain(requires_approval=True)
    def gated(n: int) -> str:
        ran.append(n)
        return f"g{n}"

    harness = Harness(agent)
    first = await harness.run("hi")
    assert first.deferred is not None
    assert first.deferred.approvals[0].args == {"n": 1}
    second = await harness.run(
        previous_state=first.state,
        deferred_resume=DeferredToolResume(first.deferred, DeferredToolResults(approvals={"x": True})),
    )
    assert second.status == "suspended"
    assert second.deferred is not None
    assert [c.tool_call_id for c in second.deferred.approvals] == ["x"]
    assert second.deferred is not None
    assert second.deferred.approvals[0].args == {"n": 2}
    # The first cycle's batch no longer fits: its arguments differ from the new call with the same id.
    with pytest.raises(RunError) as raised:
        harness.stream(
            previous_state=second.state,
            deferred_resume=DeferredToolResume(first.deferred, DeferredToolResults(approvals={"x": True})),
        )
    assert raised.value.code == "deferred_request_mismatch"
    third = await harness.run(
        previous_state=second.state,
        deferred_resume=DeferredToolResume(
            second.deferred, DeferredToolResults(approvals={"x": ToolDenied("no more")})
        ),
    )

    assert third.status == "completed" and third.output == "done"
    assert ran == [1]
    assert third.state is not None
    x_returns = returns(third.state.message_history, "x")
    assert [(p.outcome, p.content) for p in x_returns] == [("success", "g1"), ("denied", "no more")]


async def test_tool_leaving_after_its_approval_was_consumed_does_not_fail() -> None:
    """H-82: the surface is checked against pending items only at the first step."""
    script = ScriptedModel(text("done"))
    consumed: list[bool] = []

    async def only_until_used(ctx: RunContext[None], tool_def: ToolDefinition) -> ToolDefinition | None:
        return None if consumed else tool_def

    def once(n: int) -> str:
        consumed.append(True)
        return "used"

    agent: Agent[None, str] = Agent(
        FunctionModel(script), tools=[Tool(once, requires_approval=True, prepare=only_until_used)]
    )
    call = ToolCallPart("once", {"n": 1}, tool_call_id="o1")
    state = state_of(ModelRequest(parts=[UserPromptPart("hi")]), ModelResponse(parts=[call]))
    batch = DeferredToolResume(DeferredToolRequests(approvals=[call]), DeferredToolResults(approvals={"o1": True}))

    result = await Harness(agent).run(previous_state=state, deferred_resume=batch)

    assert result.status == "completed" and result.output == "done"
    assert consumed == [True]
    assert script.tool_names == [[]]  # the tool had left the surface by the next model request


async def test_new_input_follows_the_batch_returns() -> None:
    """H-83, H-62: input given with a batch is added after the returns produced from the batch, in one request."""
    g = gates()
    first = await suspended(g)
    batch = DeferredToolResume(first.deferred, DeferredToolResults(approvals={"c1": True}, calls={"c2": "v"}))

    result = await Harness(g.agent).run(
        "what next?", previous_state=first.state, deferred_resume=batch, bindings=g.bindings
    )

    assert result.status == "completed"
    [request, response] = result.new_messages()
    assert isinstance(request, ModelRequest) and isinstance(response, ModelResponse)
    assert [getattr(p, "tool_call_id", None) for p in request.parts] == ["c1", "c2", None]
    assert isinstance(request.parts[-1], UserPromptPart) and request.parts[-1].content == "what next?"
    assert g.script.seen[-1][-1].parts == request.parts


# ----------------------------------------------------------------------------------------------- H-84


async def test_no_deferral_policy_leaves_external_tools_out_and_denies_deferrals() -> None:
    """H-84: with deferred_tools_supported=False external tools are not offered, and approvals and local deferrals
    are closed inside the run as denied; the run completes."""
    script = ScriptedModel(tool_calls(("c1", "gated", {"n": 1}), ("q1", "ask", {})), text("done"))
    agent: Agent[None, str] = Agent(FunctionModel(script))
    ran: list[Any] = []

    @agent.tool_plain(requires_approval=True)
    def gated(n: int) -> str:
        ran.append(n)
        return "g"

    @agent.tool_plain
    def ask() -> str:
        ran.append("ask")
        raise CallDeferred(kind="question")

    result = await Harness(agent).run(
        "hi", bindings=RunBindings(deferred_tools_supported=False, toolsets=[external("ext")])
    )

    assert result.status == "completed" and result.output == "done"
    assert all("ext" not in names for names in script.tool_names)
    assert script.tool_names[0] == ["ask", "gated"]
    assert ran == ["ask"]
    assert result.state is not None
    history = result.state.message_history
    for call_id in ("c1", "q1"):
        [part] = returns(history, call_id)
        assert part.outcome == "denied"


async def test_no_deferral_policy_never_suspends_from_recovery() -> None:
    """H-84, H-55: a deferral that reaches the end of a step ends the run failed (deferred_tools_unsupported, with a
    state) — here the fresh approval request recovery would make for a retry-safe, approval-gated call."""
    ran: list[int] = []

    def gated(n: int) -> str:
        ran.append(n)
        return "g"

    agent: Agent[None, str] = Agent(
        FunctionModel(ScriptedModel(text("done"))), tools=[recovery_retryable(Tool(gated, requires_approval=True))]
    )
    state = state_of(ModelRequest(parts=[UserPromptPart("hi")]), tool_calls(("c1", "gated", {"n": 1})))

    result = await Harness(agent).run(previous_state=state, bindings=RunBindings(deferred_tools_supported=False))

    assert ran == []
    assert result.status != "suspended"
    if result.status == "failed":
        assert result.failure is not None
        assert result.failure.code == "deferred_tools_unsupported"
        assert result.state is not None
    else:  # closed in-run as denied is the other acceptable reading of H-84
        assert result.state is not None
        [part] = returns(result.state.message_history, "c1")
        assert part.outcome == "denied"


async def test_no_deferral_policy_denies_a_deferral_raised_after_approval() -> None:
    """H-84: a deferral raised during the run — here by a call approved in a fresh batch — is closed as denied."""
    script = ScriptedModel(tool_calls(("c1", "later", {})), text("done"))
    agent: Agent[None, str] = Agent(FunctionModel(script))

    @agent.tool_plain(requires_approval=True)
    def later() -> str:
        raise CallDeferred()

    first = await Harness(agent).run("hi")
    assert first.deferred is not None
    batch = DeferredToolResume(first.deferred, DeferredToolResults(approvals={"c1": True}))

    result = await Harness(agent).run(
        previous_state=first.state, deferred_resume=batch, bindings=RunBindings(deferred_tools_supported=False)
    )

    assert result.status == "completed"
    assert result.state is not None
    [part] = returns(result.state.message_history, "c1")
    assert part.outcome == "denied"
    assert isinstance(part.content, str)


@pytest.mark.parametrize(
    "deferral",
    [CallDeferred, lambda: CallDeferred(kind="question"), ApprovalRequired],
    ids=["outside_call", "question", "approval"],
)
async def test_no_deferral_policy_denies_a_deferral_a_tool_raises(deferral: Callable[[], Exception]) -> None:
    """H-84: a deferral a function tool raises during a normal run — an outside call, a question or an approval
    request — is closed inside the run as a denied return whose content is the message, and the run goes on."""
    script = ScriptedModel(tool_calls(("c1", "later", {})), text("done"))
    agent: Agent[None, str] = Agent(FunctionModel(script))
    ran: list[bool] = []

    @agent.tool
    def later(ctx: RunContext[None]) -> str:
        ran.append(ctx.tool_call_approved)
        raise deferral()

    result = await Harness(agent).run("hi", bindings=RunBindings(deferred_tools_supported=False))

    assert result.status == "completed" and result.output == "done"
    assert ran == [False]
    assert result.state is not None
    [part] = returns(result.state.message_history, "c1")
    assert part.outcome == "denied"
    assert isinstance(part.content, str) and part.content
    assert script.seen[-1][-1].parts == [part]


@pytest.mark.parametrize("kind", ["external", "question"])
async def test_no_deferral_policy_for_a_deferral_raised_by_an_args_validator(kind: str) -> None:
    """H-84: an args validator's question is closed as denied; its outside-call deferral cannot be denied in-run
    (pydantic-ai would record any answer to it as a success), so it ends the run failed with a state."""
    script = ScriptedModel(tool_calls(("c1", "checked", {})), text("done"))
    ran: list[str] = []

    def deferring_validator(ctx: RunContext[None]) -> None:
        raise CallDeferred(kind=kind)  # type: ignore[arg-type]

    def checked() -> str:
        ran.append("checked")
        return "ran"

    agent: Agent[None, str] = Agent(FunctionModel(script), tools=[Tool(checked, args_validator=deferring_validator)])

    result = await Harness(agent).run("hi", bindings=RunBindings(deferred_tools_supported=False))

    assert ran == []
    assert result.state is not None
    [part] = returns(result.state.message_history, "c1")
    assert part.outcome != "success"
    if kind == "question":
        assert result.status == "completed" and part.outcome == "denied" and isinstance(part.content, str)
    else:
        assert result.failure is not None
        assert result.status == "failed" and result.failure.code == "deferred_tools_unsupported"


async def test_no_deferral_policy_denies_an_approval_asked_again_after_approval() -> None:
    """H-84, H-55: a call approved in a fresh batch that asks for approval again is closed as denied, not suspended."""
    script = ScriptedModel(tool_calls(("c1", "again", {})), text("done"))
    agent: Agent[None, str] = Agent(FunctionModel(script))
    approvals: list[bool] = []

    @agent.tool(requires_approval=True)
    def again(ctx: RunContext[None]) -> str:
        approvals.append(ctx.tool_call_approved)
        raise ApprovalRequired()

    first = await Harness(agent).run("hi")
    assert first.deferred is not None
    batch = DeferredToolResume(first.deferred, DeferredToolResults(approvals={"c1": True}))

    result = await Harness(agent).run(
        previous_state=first.state, deferred_resume=batch, bindings=RunBindings(deferred_tools_supported=False)
    )

    assert result.status == "completed" and result.output == "done"
    assert approvals == [True]
    assert result.state is not None
    [part] = returns(result.state.message_history, "c1")
    assert part.outcome == "denied" and isinstance(part.content, str)


async def test_deferrals_still_suspend_when_the_run_can_suspend() -> None:
    """H-63, H-84: the denial applies only under deferred_tools_supported=False; otherwise a raised deferral
    suspends the run with the call listed."""
    script = ScriptedModel(tool_calls(("c1", "later", {})), text("done"))
    agent: Agent[None, str] = Agent(FunctionModel(script))

    @agent.tool_plain
    def later() -> str:
        raise CallDeferred()

    result = await Harness(agent).run("hi")

    assert result.status == "suspended"
    assert result.deferred is not None
    assert [c.tool_call_id for c in result.deferred.calls] == ["c1"]
    assert result.state is not None
    assert returns(result.state.message_history, "c1") == []


# ----------------------------------------------------------------------------------------------- H-85, H-86


async def test_resume_restores_the_steering_namespace_as_stored() -> None:
    """H-85: steering recorded before the run suspended is restored exactly as stored by the resumed run."""
    g = gates()
    stream = Harness(g.agent).stream("hi", bindings=g.bindings)
    async with stream:
        async for event in stream:
            if getattr(event, "kind", None) == "tool":
                await stream.steer("also check the invoice", key="k1")
    first = stream.outcome
    assert first is not None
    assert first.status == "suspended"
    assert first.state is not None
    stored = first.state.capabilities["candor.steering"]
    assert first.deferred is not None
    batch = DeferredToolResume(first.deferred, first.deferred.build_results(approve_all=True, calls={"c2": "v"}))

    resumed = Harness(g.agent).stream(previous_state=first.state, deferred_resume=batch, bindings=g.bindings)
    exported: list[CapabilityState] = []
    async with resumed:
        async for event in resumed:
            if getattr(event, "event_kind", None) == "candor_boundary":
                exported.append((await resumed.export_state()).capabilities["candor.steering"])

    assert resumed.outcome is not None
    assert resumed.outcome.status == "completed"
    assert exported and all(s == stored for s in exported)
    assert resumed.outcome.state is not None
    assert resumed.outcome.state.capabilities["candor.steering"] == stored
    assert resumed.outcome.state.capabilities["candor.steering"].model_dump_json() == stored.model_dump_json()


async def test_approve_all_is_not_an_answer() -> None:
    """H-86: build_results(approve_all=True) fills only approvals; the external call still needs an explicit value."""
    g = gates()
    first = await suspended(g)
    results = first.deferred.build_results(approve_all=True)
    assert set(results.approvals) == {"c1"} and results.calls == {}

    with pytest.raises(RunError) as raised:
        Harness(g.agent).stream(
            previous_state=first.state, deferred_resume=DeferredToolResume(first.deferred, results), bindings=g.bindings
        )
    assert raised.value.code == "deferred_results_incomplete"

    answered = first.deferred.build_results(approve_all=True, calls={"c2": "explicit"})
    result = await Harness(g.agent).run(
        previous_state=first.state, deferred_resume=DeferredToolResume(first.deferred, answered), bindings=g.bindings
    )
    assert result.status == "completed"
    assert result.state is not None
    assert [p.content for p in returns(result.state.message_history, "c2")] == ["explicit"]
