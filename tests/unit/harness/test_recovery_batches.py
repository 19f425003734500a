"""Run-level tests of re-offered batches (`DeferredToolResume(recovery=True)`, spec §3.9, §4.G), public API only.

A recovery batch carries answers the host accepted before an interruption. They are facts to write into history
once; an approval in it never authorises a replay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic_ai import (
    Agent,
    DeferredToolRequests,
    DeferredToolResults,
    Tool,
    ToolApproved,
    ToolDenied,
)
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import (
    FunctionToolCallEvent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ToolCallPart,
    ToolReturn,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import FunctionModel

from candor import BoundaryEvent, DeferredToolResume, Harness, HarnessState, RunBindings, RunResultEvent
from candor.errors import RunError
from candor.tools import recovery_retryable

from scripted import ScriptedModel, external, is_unknown, returns, text

# ----------------------------------------------------------------------------------------------- helpers


def return_ids(messages: Sequence[ModelMessage]) -> list[str]:
    return [
        part.tool_call_id
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


# The suspended response every test starts from: c1 approval of `gated`, c2 external `ext`, c3 approval of `gated`.
C1 = ToolCallPart("gated", {"n": 1}, tool_call_id="c1")
C2 = ToolCallPart("ext", {"q": "x"}, tool_call_id="c2")
C3 = ToolCallPart("gated", {"n": 3}, tool_call_id="c3")
PROMPT = ModelRequest(parts=[UserPromptPart("hi")])
RESPONSE = ModelResponse(parts=[C1, C2, C3])
BINDINGS = RunBindings(toolsets=[external("ext")])


def suspended_state(*tail: ModelMessage) -> HarnessState:
    return HarnessState(schema_version="1", thread_id="thr_batch", message_history=[PROMPT, RESPONSE, *tail])


def requests(*calls: ToolCallPart) -> DeferredToolRequests:
    return DeferredToolRequests(
        approvals=[c for c in calls if c.tool_name == "gated"], calls=[c for c in calls if c.tool_name == "ext"]
    )


def agent_with(*, safe: bool, script: ScriptedModel | None = None) -> tuple[Agent[None, str], ScriptedModel, list[int]]:
    script = script or ScriptedModel(text("done"), text("done again"))
    ran: list[int] = []

    def gated(n: int) -> str:
        ran.append(n)
        return f"g{n}"

    tool = Tool(gated, requires_approval=True)
    agent: Agent[None, str] = Agent(FunctionModel(script), tools=[recovery_retryable(tool) if safe else tool])
    return agent, script, ran


def full_batch(*, recovery: bool = True, c2: Any = "answer", c1: Any = True) -> DeferredToolResume:
    return DeferredToolResume(
        requests(C1, C2, C3),
        DeferredToolResults(approvals={"c1": c1, "c3": ToolDenied("not this one")}, calls={"c2": c2}),
        recovery=recovery,
    )


# ----------------------------------------------------------------------------------------------- H-87, H-88, H-89


async def test_batch_objects_mutated_after_construction_do_not_reach_the_run() -> None:
    """H-87, H-93: the run uses the answers as they were when the batch was built."""
    agent, _, _ = agent_with(safe=False)
    req = requests(C1, C2, C3)
    res = DeferredToolResults(approvals={"c1": False, "c3": False}, calls={"c2": "original"})
    batch = DeferredToolResume(req, res, recovery=True)
    res.calls["c2"] = "changed"
    req.calls.clear()

    result = await Harness(agent).run(previous_state=suspended_state(), deferred_resume=batch, bindings=BINDINGS)

    assert result.status == "completed"
    assert result.state is not None
    assert [p.content for p in returns(result.state.message_history, "c2")] == ["original"]


def test_non_native_batch_parts_raise_type_error() -> None:
    """H-88: only native pydantic-ai types are accepted, at construction."""
    with pytest.raises(TypeError):
        DeferredToolResume({"approvals": []}, DeferredToolResults(), recovery=True)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        DeferredToolResume(requests(C1), {"approvals": {"c1": True}}, recovery=True)  # type: ignore[arg-type]


async def test_partially_incorporated_batch_applies_only_what_is_missing() -> None:
    """H-89, H-93, H-91: the external answer already in history is not written again; only the rest is applied."""
    agent, _script, ran = agent_with(safe=False)
    written = ModelRequest(parts=[ToolReturnPart("ext", "answer", tool_call_id="c2")])
    state = suspended_state(written)
    batch = full_batch(c1=False)
    remaining = batch.remaining(state.message_history)
    assert remaining is not None and remaining.requests.calls == []

    result = await Harness(agent).run(previous_state=state, deferred_resume=batch, bindings=BINDINGS)

    assert result.status == "completed" and result.output == "done"
    assert result.state is not None
    history = result.state.message_history
    assert sorted(return_ids(history)) == ["c1", "c2", "c3"]  # one return per id
    assert [p.content for p in returns(history, "c2")] == ["answer"]
    assert [(p.outcome, p.content) for p in returns(history, "c3")] == [("denied", "not this one")]
    assert [p.outcome for p in returns(history, "c1")] == ["denied"]
    assert ran == []
    assert batch.remaining(history) is None  # H-90


async def test_partially_incorporated_batch_still_asks_again_for_a_retry_safe_approval() -> None:
    """H-89, H-94: with the external answer already written, a positive approval for a retry-safe tool under
    "declared" still suspends with a new approval request for that id."""
    agent, _, ran = agent_with(safe=True)
    state = suspended_state(ModelRequest(parts=[ToolReturnPart("ext", "answer", tool_call_id="c2")]))

    result = await Harness(agent).run(previous_state=state, deferred_resume=full_batch(), bindings=BINDINGS)

    assert ran == []
    assert result.status == "suspended"
    assert result.deferred is not None
    assert [c.tool_call_id for c in result.deferred.approvals] == ["c1"]
    assert result.state is not None
    assert returns(result.state.message_history, "c1") == []


# ----------------------------------------------------------------------------------------------- H-90, H-96, H-103


async def test_interrupted_fresh_run_is_finished_by_its_recovery_batch() -> None:
    """H-96, H-103, H-89, H-90, H-94: a fresh resume is cancelled while the approved tool runs; the cancelled state
    leaves the batch's calls open, pending_deferred_input re-offers them (readable after shutdown), and the recovery
    run writes the external answer once, closes the approved call with an unknown outcome and completes."""
    started = asyncio.Event()
    ran: list[int] = []

    async def gated(n: int) -> str:
        ran.append(n)
        started.set()
        await asyncio.Event().wait()  # the process "dies" while this call is in flight
        return "never"

    script = ScriptedModel(text("after recovery"))
    agent: Agent[None, str] = Agent(FunctionModel(script), tools=[Tool(gated, requires_approval=True)])
    state = HarnessState(
        schema_version="1", thread_id="thr_batch", message_history=[PROMPT, ModelResponse(parts=[C1, C2])]
    )
    fresh = DeferredToolResume(requests(C1, C2), DeferredToolResults(approvals={"c1": True}, calls={"c2": "answer"}))

    stream = Harness(agent).stream(previous_state=state, deferred_resume=fresh, bindings=BINDINGS)

    async def cancel_when_started() -> None:
        await started.wait()
        stream.cancel()

    canceller = asyncio.ensure_future(cancel_when_started())
    pending_while_running: list[DeferredToolResume | None] = []
    async with stream:
        async for event in stream:
            if isinstance(event, FunctionToolCallEvent):
                pending_while_running.append(stream.pending_deferred_input)
    await canceller

    cancelled = stream.outcome
    assert cancelled is not None
    assert cancelled.status == "cancelled" and cancelled.state is not None
    assert ran == [1]
    assert pending_while_running and all(p is not None and p.recovery for p in pending_while_running)
    # H-103: calls with accepted answers still pending are not closed with unknown outcomes; whatever the
    # cancelled state holds for the batch is the accepted answer itself.
    history = cancelled.state.message_history
    assert returns(history, "c1") == []
    assert all(p.content == "answer" and p.outcome == "success" for p in returns(history, "c2"))
    reoffer = stream.pending_deferred_input  # H-96: readable after shutdown
    assert reoffer is not None and reoffer.recovery is True
    assert [c.tool_call_id for c in reoffer.requests.approvals] == ["c1"]

    result = await Harness(agent).run(previous_state=cancelled.state, deferred_resume=reoffer, bindings=BINDINGS)

    assert result.status == "completed" and result.output == "after recovery"
    assert ran == [1]  # H-94: the approved call is not performed a second time
    assert result.state is not None
    history = result.state.message_history
    [c1] = returns(history, "c1")
    assert is_unknown(c1)
    assert [p.content for p in returns(history, "c2")] == ["answer"]
    assert reoffer.remaining(history) is None  # H-90
    assert fresh.remaining(history) is None


async def test_pending_deferred_input_after_cancel_matches_the_outcome_state() -> None:
    """H-96, H-103: after shutdown, pending_deferred_input holds exactly the batch items the outcome state has not
    incorporated."""
    started = asyncio.Event()

    async def gated(n: int) -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    agent: Agent[None, str] = Agent(
        FunctionModel(ScriptedModel(text("x"))), tools=[Tool(gated, requires_approval=True)]
    )
    state = HarnessState(
        schema_version="1", thread_id="thr_batch", message_history=[PROMPT, ModelResponse(parts=[C1, C2])]
    )
    fresh = DeferredToolResume(requests(C1, C2), DeferredToolResults(approvals={"c1": True}, calls={"c2": "answer"}))
    stream = Harness(agent).stream(previous_state=state, deferred_resume=fresh, bindings=BINDINGS)

    async def cancel_when_started() -> None:
        await started.wait()
        stream.cancel()

    canceller = asyncio.ensure_future(cancel_when_started())
    async with stream:
        async for _ in stream:
            pass
    await canceller

    assert stream.outcome is not None
    assert stream.outcome.state is not None
    history = stream.outcome.state.message_history
    assert [p.content for p in returns(history, "c2")] == ["answer"]  # this schedule incorporates c2 before the cancel
    expected = fresh.remaining(history)
    pending = stream.pending_deferred_input
    assert expected is not None and pending is not None
    assert [c.tool_call_id for c in pending.requests.calls] == [c.tool_call_id for c in expected.requests.calls] == []
    assert [c.tool_call_id for c in pending.requests.approvals] == ["c1"]


async def test_pending_deferred_input_while_items_remain_and_after() -> None:
    """H-96: pending_deferred_input is the not-yet-incorporated part (recovery=True) while items remain, None once
    they are incorporated, and stays readable after shutdown."""
    agent, _, _ = agent_with(safe=False)
    batch = full_batch(c1=False)
    stream = Harness(agent).stream(previous_state=suspended_state(), deferred_resume=batch, bindings=BINDINGS)

    before = stream.pending_deferred_input
    assert before is not None and before.recovery is True
    assert {c.tool_call_id for c in before.requests.approvals} == {"c1", "c3"}
    assert before.results.calls == {"c2": "answer"}
    after_boundary: list[DeferredToolResume | None] = []
    async with stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent):
                after_boundary.append(stream.pending_deferred_input)

    assert after_boundary and all(p is None for p in after_boundary)
    assert stream.outcome is not None
    assert stream.outcome.status == "completed"
    assert stream.pending_deferred_input is None


async def test_fresh_batch_pending_input_is_reported_as_recovery() -> None:
    """H-96: a fresh batch's items not yet incorporated are reported as a recovery batch."""
    agent, _, _ = agent_with(safe=False)
    stream = Harness(agent).stream(
        previous_state=suspended_state(), deferred_resume=full_batch(recovery=False), bindings=BINDINGS
    )
    pending = stream.pending_deferred_input
    assert pending is not None and pending.recovery is True
    async with stream:
        async for _ in stream:
            pass
    assert stream.outcome is not None
    assert stream.outcome.status == "completed" and stream.pending_deferred_input is None


# ----------------------------------------------------------------------------------------------- H-91, H-92


async def test_incorporated_batch_is_treated_as_no_batch() -> None:
    """H-91, H-93: a recovery batch re-offered on the state it already produced changes nothing: no second return."""
    agent, _script, ran = agent_with(safe=False)
    batch = full_batch(c1=False)
    first = await Harness(agent).run(previous_state=suspended_state(), deferred_resume=batch, bindings=BINDINGS)
    assert first.status == "completed"

    again = await Harness(agent).run(
        "anything else?", previous_state=first.state, deferred_resume=batch, bindings=BINDINGS, tool_recovery="always"
    )

    assert again.status == "completed"
    assert again.state is not None
    assert sorted(return_ids(again.state.message_history)) == ["c1", "c2", "c3"]
    assert ran == []


async def test_superseded_batch_is_treated_as_no_batch() -> None:
    """H-91: once a later response superseded the batch's response, the batch is ignored and recovery proceeds."""
    agent, _, ran = agent_with(safe=True)
    later = ModelResponse(parts=[ToolCallPart("gated", {"n": 9}, tool_call_id="c9")])
    state = suspended_state(
        ModelRequest(parts=[ToolReturnPart("gated", "x", tool_call_id=i) for i in ("c1", "c2", "c3")]), later
    )
    batch = full_batch()
    assert batch.remaining(state.message_history) is None

    result = await Harness(agent).run(previous_state=state, deferred_resume=batch, bindings=BINDINGS)

    # Ordinary recovery of c9: retry-safe but approval-gated → a fresh approval request (H-55).
    assert result.status == "suspended"
    assert result.deferred is not None
    assert [c.tool_call_id for c in result.deferred.approvals] == ["c9"]
    assert ran == []


@pytest.mark.parametrize(
    ("changed", "code"),
    [
        pytest.param(ToolCallPart("other", {"n": 1}, tool_call_id="c1"), "deferred_request_mismatch", id="tool-name"),
        pytest.param(ToolCallPart("gated", {"n": 2}, tool_call_id="c1"), "deferred_request_mismatch", id="args"),
    ],
)
async def test_recovery_batch_is_still_checked_against_history(changed: ToolCallPart, code: str) -> None:
    """H-92, H-73: a recovery batch whose request no longer matches history is refused synchronously; no trace."""
    agent, script, ran = agent_with(safe=True)
    state = suspended_state()
    before = state.model_dump_json()
    batch = DeferredToolResume(
        DeferredToolRequests(approvals=[changed, C3], calls=[C2]),
        DeferredToolResults(approvals={changed.tool_call_id: True, "c3": False}, calls={"c2": "answer"}),
        recovery=True,
    )

    with pytest.raises(RunError) as raised:
        Harness(agent).stream(previous_state=state, deferred_resume=batch, bindings=BINDINGS)
    assert raised.value.code == code
    with pytest.raises(RunError):
        await Harness(agent).run(previous_state=state, deferred_resume=batch, bindings=BINDINGS)

    assert state.model_dump_json() == before
    assert script.seen == [] and ran == []


# ----------------------------------------------------------------------------------------------- H-93, H-94


@pytest.mark.parametrize("mode", ["never", "declared", "always"])
@pytest.mark.parametrize(
    ("answer", "outcome", "content"),
    [
        pytest.param("answer", "success", "answer", id="value"),
        pytest.param({"k": [1, None]}, "success", {"k": [1, None]}, id="json"),
        pytest.param(ToolFailed("client failed"), "failed", "client failed", id="tool-failed"),
        pytest.param(ToolReturn("v", metadata={"m": 1}), "success", "v", id="tool-return"),
    ],
)
async def test_accepted_answers_are_written_once_in_every_mode(
    answer: Any, outcome: str, content: Any, mode: str
) -> None:
    """H-93, H-78, H-79: external results in any accepted form and explicit denials are written into history once,
    also under "never"; no call id ends up with two returns."""
    agent, _, ran = agent_with(safe=False)
    batch = DeferredToolResume(
        requests(C1, C2, C3),
        DeferredToolResults(approvals={"c1": False, "c3": ToolDenied("nope")}, calls={"c2": answer}),
        recovery=True,
    )

    result = await Harness(agent).run(
        previous_state=suspended_state(), deferred_resume=batch, tool_recovery=mode, bindings=BINDINGS
    )

    assert result.status == "completed"
    assert result.state is not None
    history = result.state.message_history
    assert sorted(return_ids(history)) == ["c1", "c2", "c3"]
    [c2] = returns(history, "c2")
    assert (c2.outcome, c2.content) == (outcome, content)
    assert [(p.outcome, p.content) for p in returns(history, "c1")] == [("denied", ToolDenied().message)]
    assert [(p.outcome, p.content) for p in returns(history, "c3")] == [("denied", "nope")]
    assert ran == []


async def test_tool_return_content_is_added_once_in_a_recovery_batch() -> None:
    """H-93, H-79, H-83: a ToolReturn's content enters history once, after the returns and before new input."""
    agent, _script, _ = agent_with(safe=False)
    batch = full_batch(c1=False, c2=ToolReturn("v", content="extra context", metadata={"m": 1}))

    result = await Harness(agent).run(
        "next", previous_state=suspended_state(), deferred_resume=batch, bindings=BINDINGS
    )

    [request, _] = result.new_messages()
    kinds = [type(p).__name__ for p in request.parts]
    assert kinds == ["ToolReturnPart"] * 3 + ["UserPromptPart", "UserPromptPart"]
    assert [getattr(p, "content", None) for p in request.parts[3:]] == ["extra context", "next"]
    assert result.state is not None
    [c2] = returns(result.state.message_history, "c2")
    assert c2.metadata == {"m": 1}


async def test_approval_for_retry_safe_tool_asks_again_under_declared() -> None:
    """H-94, H-55: an approval in a recovery batch never authorises a replay; under "declared" with a retry-safe
    tool the run suspends with a new approval request for that id, and a later denial records outcome="denied"."""
    agent, script, ran = agent_with(safe=True)
    only_c1 = DeferredToolResume(requests(C1), DeferredToolResults(approvals={"c1": ToolApproved()}), recovery=True)
    state = HarnessState(schema_version="1", thread_id="thr_batch", message_history=[PROMPT, ModelResponse(parts=[C1])])

    result = await Harness(agent).run(previous_state=state, deferred_resume=only_c1)

    assert result.status == "suspended"
    assert result.deferred is not None
    assert [c.tool_call_id for c in result.deferred.approvals] == ["c1"]
    assert result.deferred is not None
    assert result.deferred.calls == []
    assert ran == [] and script.seen == []
    assert result.state is not None
    assert returns(result.state.message_history, "c1") == []

    denied = await Harness(agent).run(
        previous_state=result.state,
        deferred_resume=DeferredToolResume(result.deferred, DeferredToolResults(approvals={"c1": False})),
    )
    assert denied.status == "completed"
    assert denied.state is not None
    assert [p.outcome for p in returns(denied.state.message_history, "c1")] == ["denied"]
    assert ran == []


async def test_asked_again_approval_can_be_answered_after_other_answers_were_written() -> None:
    """H-94, H-93: after the recovery batch wrote c2/c3 and asked again for c1, the host's denial of c1 is recorded."""
    agent, _, ran = agent_with(safe=True)
    result = await Harness(agent).run(previous_state=suspended_state(), deferred_resume=full_batch(), bindings=BINDINGS)
    assert result.status == "suspended"
    assert result.deferred is not None
    assert [c.tool_call_id for c in result.deferred.approvals] == ["c1"]
    assert result.state is not None
    assert sorted(return_ids(result.state.message_history)) == ["c2", "c3"]

    assert result.deferred is not None
    denied = await Harness(agent).run(
        previous_state=result.state,
        deferred_resume=DeferredToolResume(result.deferred, DeferredToolResults(approvals={"c1": False})),
        bindings=BINDINGS,
    )

    assert denied.status == "completed"
    assert denied.state is not None
    assert sorted(return_ids(denied.state.message_history)) == ["c1", "c2", "c3"]
    assert [p.outcome for p in returns(denied.state.message_history, "c1")] == ["denied"]
    assert ran == []


@pytest.mark.parametrize(
    ("safe", "mode"),
    [
        pytest.param(True, "never", id="never-retry-safe"),
        pytest.param(False, "declared", id="declared-unmarked"),
        pytest.param(False, "never", id="never-unmarked"),
    ],
)
@pytest.mark.parametrize(
    "approval", [True, ToolApproved(), ToolApproved(override_args={"n": 5})], ids=["true", "approved", "override"]
)
async def test_approval_is_closed_with_unknown_outcome_when_not_replayable(
    safe: bool, mode: str, approval: Any
) -> None:
    """H-94, H-93: under "never", or when the tool is not marked, an approved call of a recovery batch is closed with
    an unknown-outcome result; the effect is not performed again; the batch's other answers are still written."""
    agent, _script, ran = agent_with(safe=safe)
    batch = full_batch(c1=approval)

    result = await Harness(agent).run(
        previous_state=suspended_state(), deferred_resume=batch, tool_recovery=mode, bindings=BINDINGS
    )

    assert result.status == "completed"
    assert ran == []
    assert result.state is not None
    history = result.state.message_history
    [c1] = returns(history, "c1")
    assert is_unknown(c1)
    assert sorted(return_ids(history)) == ["c1", "c2", "c3"]
    request = result.new_messages()[0]
    assert [getattr(p, "tool_call_id", None) for p in request.parts] == ["c1", "c2", "c3"]  # one request, call order


# ----------------------------------------------------------------------------------------------- H-95


MARKERS = ("MARKER-RESULT-METADATA", "MARKER-ANSWERED-BY", "MARKER-REQUEST-METADATA")


async def test_no_state_or_namespace_ever_holds_the_batch() -> None:
    """H-95: no state taken during or after a recovery run contains the batch; no capability namespace holds it."""
    agent, _, _ = agent_with(safe=True)
    batch = DeferredToolResume(
        DeferredToolRequests(approvals=[C1, C3], calls=[C2], metadata={"c2": {"note": MARKERS[2]}}),
        DeferredToolResults(
            approvals={"c1": ToolApproved(override_args={"n": 77}), "c3": False},
            calls={"c2": "answer"},
            metadata={"c2": {"note": MARKERS[0]}},
            answered_by={"c2": MARKERS[1]},
        ),
        recovery=True,
    )
    stream = Harness(agent).stream(previous_state=suspended_state(), deferred_resume=batch, bindings=BINDINGS)
    states: list[HarnessState] = []
    async with stream:
        states.append(await stream.export_state())
        async for event in stream:
            if isinstance(event, (BoundaryEvent, RunResultEvent)):
                states.append(await stream.export_state())
    assert stream.outcome is not None and stream.outcome.state is not None
    states.append(stream.outcome.state)

    assert stream.outcome.status == "suspended"  # c1 is asked again (H-94)
    for state in states:
        payload = state.model_dump_json()
        for marker in MARKERS:
            assert marker not in payload
        assert "tool-approved" not in payload and '"n":77' not in payload.replace(" ", "")
        assert set(state.capabilities) <= {"candor.usage", "candor.steering", "candor.recovery"}
        for namespace in state.capabilities.values():
            assert "answer" not in namespace.model_dump_json()


async def test_cancelled_state_does_not_hold_unincorporated_answers() -> None:
    """H-95, H-103: an answer that was accepted but not yet incorporated is absent from the cancelled state."""
    script = ScriptedModel(text("done"))

    def gated(n: int) -> str:
        return "g"

    agent: Agent[None, str] = Agent(FunctionModel(script), tools=[recovery_retryable(Tool(gated))])
    # c1 is an open, retry-safe call outside the batch; the run is cancelled before its first step.
    response = ModelResponse(parts=[ToolCallPart("gated", {"n": 1}, tool_call_id="c1"), C2])
    state = HarnessState(schema_version="1", thread_id="thr_batch", message_history=[PROMPT, response])
    batch = DeferredToolResume(requests(C2), DeferredToolResults(calls={"c2": "UNINCORPORATED-ANSWER"}), recovery=True)
    stream = Harness(agent).stream(previous_state=state, deferred_resume=batch, bindings=BINDINGS)
    async with stream:
        stream.cancel()
        async for _ in stream:
            pass

    cancelled = stream.outcome
    assert cancelled is not None
    assert cancelled.status == "cancelled"
    assert cancelled.state is not None
    assert "UNINCORPORATED-ANSWER" not in cancelled.state.model_dump_json()
    assert returns(cancelled.state.message_history, "c2") == []  # pending accepted input stays open (H-103)
    assert stream.pending_deferred_input is not None
