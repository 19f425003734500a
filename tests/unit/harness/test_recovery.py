"""Tests for `candor.harness.recovery` (pure): the recovery plan for unanswered calls (spec §4.E, §4.G)."""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic_ai import DeferredToolResults, ModelMessagesTypeAdapter, ToolApproved, ToolDenied
from pydantic_ai.exceptions import ModelRetry, ToolFailed
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ModelResponseState,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturn,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.tools import ToolDefinition, ToolDefinitionKind

from candor.harness.errors import RunError
from candor.harness.recovery import (
    TOOL_RECOVERY_MODES,
    RecoveryDecision,
    RecoveryPlan,
    ToolRecovery,
    decide_action,
    plan_recovery,
    validate_tool_recovery,
)
from candor.harness.recovery_tools import (
    RECOVERY_RETRY_SAFE_METADATA_KEY as SAFE_KEY,
)
from candor.harness.recovery_tools import (
    UNKNOWN_OUTCOME_CONTENT,
    UNKNOWN_OUTCOME_METADATA_KEY,
    unknown_outcome_result,
)

MODES: tuple[ToolRecovery, ...] = ("declared", "never", "always")
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


# ----------------------------------------------------------------------------------------------- builders


def call(call_id: str, name: str = "alpha", *, tool_kind: str | None = None) -> ToolCallPart:
    return ToolCallPart(tool_name=name, args={"n": 1}, tool_call_id=call_id, tool_kind=tool_kind)


def response(*parts: Any, state: ModelResponseState = "complete") -> ModelResponse:
    return ModelResponse(parts=list(parts) or [TextPart("thinking")], state=state)


def request(*parts: Any) -> ModelRequest:
    return ModelRequest(parts=list(parts) or [UserPromptPart("go")])


def returned(c: ToolCallPart, content: Any = "ok", **kwargs: Any) -> ToolReturnPart:
    return ToolReturnPart(tool_name=c.tool_name, tool_call_id=c.tool_call_id, content=content, **kwargs)


def legacy_retry(c: ToolCallPart) -> RetryPromptPart:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return RetryPromptPart(content="bad args", tool_name=c.tool_name, tool_call_id=c.tool_call_id)


def tool(
    name: str = "alpha", *, kind: ToolDefinitionKind = "function", safe: Any = "unset", **metadata: Any
) -> ToolDefinition:
    meta = dict(metadata)
    if safe != "unset":
        meta[SAFE_KEY] = safe
    return ToolDefinition(name=name, kind=kind, metadata=meta or None)


def surface_of(*defs: ToolDefinition) -> dict[str, ToolDefinition]:
    return {d.name: d for d in defs}


def history_with(*calls: ToolCallPart, state: ModelResponseState = "complete") -> list[ModelMessage]:
    return [request(UserPromptPart("go")), response(*calls, state=state)]


def canonical(history: Sequence[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(list(history))


def no_ts(part: Any) -> Any:
    """Parts compared without their construction timestamp (pydantic-ai stamps it)."""
    return dataclasses.replace(part, timestamp=EPOCH)


def only(plan: RecoveryPlan) -> RecoveryDecision:
    assert len(plan.decisions) == 1
    return plan.decisions[0]


# ------------------------------------------------------------------------------------------ H-61: modes


@pytest.mark.parametrize("value", MODES)
def test_validate_tool_recovery_accepts_the_three_literals(value: str) -> None:
    """H-61: the three literals are accepted and returned unchanged."""
    assert validate_tool_recovery(value) == value
    assert frozenset(MODES) == TOOL_RECOVERY_MODES


@pytest.mark.parametrize(
    "value", ["", "Declared", "ALWAYS", " never", "auto", None, True, 1, ["never"], b"never", object()]
)
def test_validate_tool_recovery_rejects_everything_else(value: object) -> None:
    """H-61: any other value raises ValueError (unhashable values included)."""
    with pytest.raises(ValueError):
        validate_tool_recovery(value)


def test_plan_recovery_rejects_an_invalid_mode() -> None:
    """H-61: the planner refuses an invalid mode too, before deciding anything."""
    with pytest.raises(ValueError):
        plan_recovery(history_with(call("c1")), surface_of(tool()), "sometimes")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- policy table: decide_action


@dataclasses.dataclass(frozen=True)
class PolicyCase:
    rules: str
    mode: ToolRecovery
    tool_def: ToolDefinition | None
    expected: tuple[str, str]
    approved: bool = False


POLICY_CASES = [
    # H-48: a tool the surface no longer offers is closed, whatever the mode (even with an approval, H-94).
    *(PolicyCase("H-48", m, None, ("unknown_outcome", "tool_missing")) for m in MODES),
    *(PolicyCase("H-48 H-94", m, None, ("unknown_outcome", "tool_missing"), approved=True) for m in MODES),
    # H-45: never executes nothing, not even retry-safe, approval-gated or external tools.
    PolicyCase("H-45", "never", tool(safe=True), ("unknown_outcome", "mode_never")),
    PolicyCase("H-45", "never", tool(), ("unknown_outcome", "mode_never")),
    PolicyCase("H-45", "never", tool(kind="unapproved", safe=True), ("unknown_outcome", "mode_never")),
    PolicyCase("H-45", "never", tool(kind="external", safe=True), ("unknown_outcome", "mode_never")),
    # H-46: declared replays only retry-safe tools.
    PolicyCase("H-46 H-40", "declared", tool(safe=True), ("replay", "retry_safe")),
    PolicyCase("H-46 H-40", "declared", tool(), ("unknown_outcome", "not_retry_safe")),
    PolicyCase("H-46", "declared", tool(safe=False), ("unknown_outcome", "not_retry_safe")),
    PolicyCase("H-46", "declared", tool(kind="unapproved"), ("unknown_outcome", "not_retry_safe")),
    PolicyCase("H-46", "declared", tool(kind="external"), ("unknown_outcome", "not_retry_safe")),
    # H-51: only the boolean True marks a tool.
    *(
        PolicyCase("H-51", "declared", tool(safe=v), ("unknown_outcome", "not_retry_safe"))
        for v in (1, 1.0, "true", "True", "yes", [True], {"v": True}, None, 0, (True,))
    ),
    PolicyCase("H-51 H-53", "declared", tool(safe=True, other="kept"), ("replay", "retry_safe")),
    # H-47: always replays whatever the marking.
    PolicyCase("H-47", "always", tool(), ("replay", "mode_always")),
    PolicyCase("H-47", "always", tool(safe=True), ("replay", "mode_always")),
    PolicyCase("H-47", "always", tool(safe="true"), ("replay", "mode_always")),
    # H-55: replay is not approval; H-56: an external replay suspends again.
    PolicyCase("H-55", "always", tool(kind="unapproved"), ("suspend", "approval_required")),
    PolicyCase("H-55", "declared", tool(kind="unapproved", safe=True), ("suspend", "approval_required")),
    PolicyCase("H-56", "always", tool(kind="external"), ("suspend", "external_tool")),
    PolicyCase("H-56", "declared", tool(kind="external", safe=True), ("suspend", "external_tool")),
    # H-94: an accepted approval never authorises a replay.
    PolicyCase("H-94", "declared", tool(safe=True), ("suspend", "accepted_approval_not_reused"), approved=True),
    PolicyCase(
        "H-94", "declared", tool(kind="unapproved", safe=True), ("suspend", "accepted_approval_not_reused"), True
    ),
    PolicyCase("H-94", "declared", tool(), ("unknown_outcome", "not_retry_safe"), approved=True),
    PolicyCase("H-94 H-51", "declared", tool(safe=1), ("unknown_outcome", "not_retry_safe"), approved=True),
    PolicyCase("H-94", "never", tool(safe=True), ("unknown_outcome", "mode_never"), approved=True),
    PolicyCase("H-94", "never", tool(kind="unapproved"), ("unknown_outcome", "mode_never"), approved=True),
    PolicyCase("H-94", "always", tool(), ("suspend", "accepted_approval_not_reused"), approved=True),
    PolicyCase("H-94", "always", tool(kind="unapproved"), ("suspend", "accepted_approval_not_reused"), True),
]


@pytest.mark.parametrize("case", POLICY_CASES, ids=lambda c: f"{c.rules}-{c.mode}-{c.expected[1]}")
def test_decide_action_policy_table(case: PolicyCase) -> None:
    """H-45, H-46, H-47, H-48, H-51, H-55, H-56, H-94: the policy table, one row per case."""
    assert decide_action(case.tool_def, case.mode, approved=case.approved) == case.expected


@pytest.mark.parametrize("case", POLICY_CASES, ids=lambda c: f"{c.rules}-{c.mode}-{c.expected[1]}")
def test_plan_recovery_follows_the_policy_table(case: PolicyCase) -> None:
    """H-45..H-48, H-51, H-55, H-56, H-94: the planner applies the same table to a real history."""
    c = call("c1")
    surface = {} if case.tool_def is None else {"alpha": case.tool_def}
    accepted = DeferredToolResults(approvals={"c1": True}) if case.approved else None
    decision = only(plan_recovery(history_with(c), surface, case.mode, accepted))
    assert decision.call is c
    assert (decision.action, decision.reason) == case.expected
    assert decision.answer == ()


# ------------------------------------------------------------------------------ history shape (H-41..H-49)


def test_only_the_last_response_is_recovered() -> None:
    """H-41: a dangling call of an earlier response is never touched, even under "always"."""
    old, new = call("c1"), call("c2")
    history: list[ModelMessage] = [request(), response(old), request(UserPromptPart("later")), response(new)]
    plan = plan_recovery(history, surface_of(tool()), "always")
    assert [d.call for d in plan.decisions] == [new]


def test_mixed_response_under_declared() -> None:
    """H-40, H-46, H-43, H-44: unmarked calls get unknown outcomes in call order, retry-safe calls replay."""
    a, b, c, d = call("c1", "alpha"), call("c2", "beta"), call("c3", "alpha"), call("c4", "gamma")
    surface = surface_of(tool("alpha"), tool("beta", safe=True))
    plan = plan_recovery(history_with(a, b, c, d), surface, "declared")
    assert [x.call.tool_call_id for x in plan.decisions] == ["c1", "c2", "c3", "c4"]
    assert plan.replay_ids == ("c2",)
    assert plan.unknown_ids == ("c1", "c3", "c4")
    assert plan.decisions[3].reason == "tool_missing"
    assert [no_ts(p) for p in plan.unknown_outcome_parts()] == [no_ts(unknown_outcome_result(x)) for x in (a, c, d)]


def test_unknown_outcome_parts_exact_shape() -> None:
    """H-43: every produced unknown-outcome result equals the §3.10 shape exactly."""
    c = call("call_7", "transfer_money")
    (part,) = plan_recovery(history_with(c), {}, "always").unknown_outcome_parts()
    assert type(part) is ToolReturnPart
    assert part.tool_name == "transfer_money"
    assert part.tool_call_id == "call_7"
    assert part.content == UNKNOWN_OUTCOME_CONTENT
    assert part.outcome == "interrupted"
    assert part.metadata == {UNKNOWN_OUTCOME_METADATA_KEY: True} == {"candor.unknown_outcome": True}
    assert part.tool_kind is None and part.retry is None
    assert no_ts(part) == no_ts(unknown_outcome_result(c))


def test_partly_answered_response_keeps_recorded_returns() -> None:
    """H-42, H-49: returns of any kind, earlier unknown outcomes and legacy retries stay closed under "always"."""
    calls = [call(f"c{i}") for i in range(7)]
    recorded = [
        returned(calls[0]),
        unknown_outcome_result(calls[1]),
        returned(calls[2], "boom", outcome="failed"),
        returned(calls[3], "no", outcome="denied"),
        returned(calls[4], "fix args", outcome="retried"),
        returned(calls[5], "cut", outcome="interrupted", metadata={"pydantic_ai_synthesized_tool_return": True}),
    ]
    history: list[ModelMessage] = [
        request(),
        response(*calls),
        request(*recorded[:3]),
        request(*recorded[3:], legacy_retry(calls[6])),
    ]
    assert plan_recovery(history, surface_of(tool(safe=True)), "always").is_empty


def test_history_ending_in_a_request_still_recovers_open_calls() -> None:
    """H-41, H-49: the open call after a partial request of returns is still found; the answered one is not."""
    a, b = call("c1"), call("c2")
    history: list[ModelMessage] = [request(), response(a, b), request(returned(a))]
    plan = plan_recovery(history, surface_of(tool(safe=True)), "declared")
    assert plan.replay_ids == ("c2",)


def test_reused_call_ids_are_handled_per_response() -> None:
    """H-41, H-81: an id answered for an earlier response does not answer the same id in the last response."""
    first, again = call("c1"), call("c1")
    history: list[ModelMessage] = [request(), response(first), request(returned(first)), response(again)]
    assert only(plan_recovery(history, surface_of(tool()), "never")).call is again


def test_retry_safe_flag_comes_from_the_current_surface() -> None:
    """H-50: stored metadata is ignored; the same saved state replays or not depending on today's surface."""
    c = call("c1")
    history: list[ModelMessage] = [request(), response(c)]
    history[1].metadata = {SAFE_KEY: True}  # something stored in the messages never counts
    before = canonical(history)
    assert only(plan_recovery(history, surface_of(tool(safe=True)), "declared")).action == "replay"
    assert only(plan_recovery(history, surface_of(tool()), "declared")).action == "unknown_outcome"
    assert canonical(history) == before


@pytest.mark.parametrize("state", ["complete", "interrupted", "incomplete"])
def test_not_provider_suspended_responses_are_recovered(state: ModelResponseState) -> None:
    """H-59: only `state == "suspended"` skips recovery; interrupted responses are recovered (§8)."""
    plan = plan_recovery(history_with(call("c1"), state=state), {}, "declared")
    assert plan.skipped_reason is None and plan.unknown_ids == ("c1",)


@pytest.mark.parametrize("mode", MODES)
def test_provider_suspended_response_skips_recovery(mode: ToolRecovery) -> None:
    """H-59: a provider-suspended final response skips recovery entirely, accepted answers included."""
    accepted = DeferredToolResults(calls={"c1": "done"})
    plan = plan_recovery(history_with(call("c1"), state="suspended"), surface_of(tool()), mode, accepted)
    assert plan == RecoveryPlan(decisions=(), skipped_reason="provider_suspended")
    assert plan.is_empty


def test_earlier_suspended_response_does_not_skip() -> None:
    """H-59: only the last response's state counts."""
    history: list[ModelMessage] = [request(), response(state="suspended"), request(), response(call("c1"))]
    assert plan_recovery(history, {}, "never").unknown_ids == ("c1",)


@pytest.mark.parametrize(
    "history",
    [[], [request()], [request(), response()], [request(), response(TextPart("hi")), request()]],
    ids=["empty", "request-only", "text-response", "text-then-request"],
)
def test_nothing_to_recover(history: list[ModelMessage]) -> None:
    """H-41: no last response, or one without calls, gives an empty plan that is not 'skipped'."""
    plan = plan_recovery(history, surface_of(tool()), "always")
    assert plan.is_empty and plan.skipped_reason is None and plan.unknown_outcome_parts() == []


def test_output_tool_calls_are_never_planned() -> None:
    """§2, H-41: output-tool calls (tagged, named or defined as output) are left to pydantic-ai."""
    tagged, named, defined, real = (
        call("c1", "alpha", tool_kind="output"),
        call("c2", "final_result"),
        call("c3", "structured"),
        call("c4", "alpha"),
    )
    surface = surface_of(tool("alpha"), tool("structured", kind="output"))
    accepted = DeferredToolResults(calls={"c1": 1, "c2": 2, "c3": 3})
    plan = plan_recovery(
        history_with(tagged, named, defined, real),
        surface,
        "always",
        accepted,
        output_tool_names=frozenset({"final_result"}),
    )
    assert [d.call for d in plan.decisions] == [real]


# ------------------------------------------------------------------------- accepted recovery batches (H-93)


@dataclasses.dataclass(frozen=True)
class AnswerCase:
    rules: str
    accepted: DeferredToolResults
    expected: tuple[Any, ...]  # ToolReturnPart / UserPromptPart built for call "c1" of tool "alpha"
    reason: str = "accepted_answer"


C1 = call("c1")
ANSWER_CASES = [
    AnswerCase("H-79 H-93", DeferredToolResults(calls={"c1": {"rows": [1, 2]}}), (returned(C1, {"rows": [1, 2]}),)),
    AnswerCase("H-79 H-93", DeferredToolResults(calls={"c1": None}), (returned(C1, None),)),
    AnswerCase("H-79 H-93", DeferredToolResults(calls={"c1": "text"}), (returned(C1, "text"),)),
    AnswerCase(
        "H-79 H-93",
        DeferredToolResults(calls={"c1": ToolReturn(42, content="see chart", metadata={"m": 1})}),
        (returned(C1, 42, metadata={"m": 1}), UserPromptPart("see chart")),
    ),
    AnswerCase(
        "H-79 H-93",
        DeferredToolResults(calls={"c1": ToolReturn([1], content=["a", "b"])}),
        (returned(C1, [1]), UserPromptPart(["a", "b"])),
    ),
    AnswerCase("H-79 H-93", DeferredToolResults(calls={"c1": ToolReturn("v")}), (returned(C1, "v"),)),
    AnswerCase("H-79 H-93", DeferredToolResults(calls={"c1": ToolReturn("v", content="")}), (returned(C1, "v"),)),
    AnswerCase(
        "H-79 H-93",
        DeferredToolResults(calls={"c1": ToolFailed("declined")}),
        (returned(C1, "declined", outcome="failed"),),
    ),
    AnswerCase(
        "H-78 H-93",
        DeferredToolResults(approvals={"c1": False}),
        (returned(C1, "The tool call was denied.", outcome="denied"),),
        "accepted_denial",
    ),
    AnswerCase(
        "H-78 H-93",
        DeferredToolResults(approvals={"c1": ToolDenied("not today")}),
        (returned(C1, "not today", outcome="denied"),),
        "accepted_denial",
    ),
    AnswerCase(
        "H-78 H-93",
        DeferredToolResults(approvals={"c1": ToolDenied()}),
        (returned(C1, "The tool call was denied.", outcome="denied"),),
        "accepted_denial",
    ),
    AnswerCase(  # an id in both maps: the call answer wins, as in pydantic-ai (pre-flight refuses it, H-66)
        "H-93", DeferredToolResults(calls={"c1": "x"}, approvals={"c1": True}), (returned(C1, "x"),)
    ),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("surface", [{}, surface_of(tool(kind="external")), surface_of(tool(safe=True))])
@pytest.mark.parametrize("case", ANSWER_CASES, ids=lambda c: f"{c.rules}-{c.reason}")
def test_accepted_answers_are_applied_whatever_the_mode(
    case: AnswerCase, surface: dict[str, ToolDefinition], mode: ToolRecovery
) -> None:
    """H-93, H-78, H-79: kept answers are written once, also under "never" and for a tool that is gone."""
    before = copy.deepcopy(case.accepted)
    decision = only(plan_recovery(history_with(C1), surface, mode, case.accepted))
    assert decision.call is C1
    assert (decision.action, decision.reason) == ("apply_answer", case.reason)
    assert [no_ts(p) for p in decision.answer] == [no_ts(p) for p in case.expected]
    assert case.accepted == before


def test_answers_for_closed_or_foreign_ids_are_ignored() -> None:
    """H-93, H-91: answers already in history, for earlier responses or unknown ids never give a second return."""
    old, done, open_ = call("old"), call("done"), call("open")
    history: list[ModelMessage] = [request(), response(old), request(), response(done, open_), request(returned(done))]
    accepted = DeferredToolResults(calls={"old": 1, "done": 2, "ghost": 3}, approvals={"done2": False, "ghost2": True})
    with_batch = plan_recovery(history, surface_of(tool()), "never", accepted)
    assert with_batch == plan_recovery(history, surface_of(tool()), "never")
    assert with_batch.unknown_ids == ("open",)


def test_fully_incorporated_batch_is_no_batch() -> None:
    """H-91: a batch whose ids all have returns leaves ordinary tool_recovery to proceed."""
    a, b = call("c1"), call("c2")
    history: list[ModelMessage] = [request(), response(a, b), request(returned(a, "ext"))]
    accepted = DeferredToolResults(calls={"c1": "ext"})
    plan = plan_recovery(history, surface_of(tool(safe=True)), "declared", accepted)
    assert plan.replay_ids == ("c2",) and plan.answer_ids == ()


@pytest.mark.parametrize("approval", [True, ToolApproved(), ToolApproved(override_args={"n": 2})])
def test_positive_approval_never_authorises_a_replay(approval: Any) -> None:
    """H-94: declared+safe asks again, declared+unmarked/never close, always asks again; never a replay."""
    a, b = call("c1", "safe"), call("c2", "plain")
    surface = surface_of(tool("safe", kind="unapproved", safe=True), tool("plain", kind="unapproved"))
    accepted = DeferredToolResults(approvals={"c1": approval, "c2": approval})
    declared = plan_recovery(history_with(a, b), surface, "declared", accepted)
    assert [(d.action, d.reason) for d in declared.decisions] == [
        ("suspend", "accepted_approval_not_reused"),
        ("unknown_outcome", "not_retry_safe"),
    ]
    assert plan_recovery(history_with(a, b), surface, "never", accepted).unknown_ids == ("c1", "c2")
    assert plan_recovery(history_with(a, b), surface, "always", accepted).suspend_ids == ("c1", "c2")


def test_mixed_batch_in_one_response() -> None:
    """H-93, H-94, H-46: answers, denials, approvals and plain open calls side by side, in call order."""
    calls = [call("e1", "ext"), call("d1", "gate"), call("a1", "gate"), call("p1", "read"), call("p2", "write")]
    surface = surface_of(
        tool("ext", kind="external"), tool("gate", kind="unapproved", safe=True), tool("read", safe=True), tool("write")
    )
    accepted = DeferredToolResults(calls={"e1": "r"}, approvals={"d1": False, "a1": True})
    plan = plan_recovery(history_with(*calls), surface, "declared", accepted)
    assert [d.call for d in plan.decisions] == calls
    assert plan.answer_ids == ("e1", "d1")
    assert plan.suspend_ids == ("a1",)
    assert plan.replay_ids == ("p1",)
    assert plan.unknown_ids == ("p2",)
    assert [p.tool_call_id for p in plan.unknown_outcome_parts()] == ["p2"]


@pytest.mark.parametrize(
    ("accepted", "code"),
    [
        (DeferredToolResults(calls={"c1": ModelRetry("again")}), "deferred_results_invalid"),
        (DeferredToolResults(approvals={"c1": "approved"}), "deferred_approval_invalid"),  # type: ignore[dict-item]
        (DeferredToolResults(approvals={"c1": 1}), "deferred_approval_invalid"),  # type: ignore[dict-item]
    ],
)
def test_answers_pre_flight_would_refuse_raise(accepted: DeferredToolResults, code: str) -> None:
    """H-67: a value pre-flight refuses is never turned into history by the planner."""
    with pytest.raises(RunError) as info:
        plan_recovery(history_with(call("c1")), surface_of(tool()), "declared", accepted)
    assert info.value.code == code


def test_plan_convenience_properties() -> None:
    """H-44: id tuples follow call order; an empty plan is empty."""
    assert RecoveryPlan(decisions=()).is_empty
    plan = plan_recovery(history_with(call("x"), call("y"), call("z")), surface_of(tool()), "always")
    assert plan.replay_ids == ("x", "y", "z") and not plan.is_empty
    assert plan.unknown_ids == plan.suspend_ids == plan.answer_ids == ()


# ---------------------------------------------------------------------------------- property tests


NAMES = ("alpha", "beta", "gamma", "delta", "final_result")
IDS = tuple(f"id{i}" for i in range(8))
SAFE_VALUES = (True, False, 1, 0, 1.0, "true", "True", None, "yes", [True], {"v": True})
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)
call_answers: st.SearchStrategy[Any] = st.one_of(
    json_values,
    st.builds(
        lambda v, c, m: ToolReturn(v, content=c, metadata=m),
        json_values,
        st.none() | st.text(max_size=5),
        st.none() | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    ),
    st.builds(ToolFailed, st.text(max_size=8)),
)
approval_answers: st.SearchStrategy[bool | ToolApproved | ToolDenied] = st.sampled_from(
    [True, False, ToolApproved(), ToolApproved(override_args={"n": 3}), ToolDenied(), ToolDenied("no")]
)


@st.composite
def surfaces(draw: st.DrawFn) -> dict[str, ToolDefinition]:
    surface: dict[str, ToolDefinition] = {}
    for name in draw(st.lists(st.sampled_from(NAMES[:4]), unique=True)):
        kinds: list[ToolDefinitionKind] = ["function", "function", "external", "unapproved"]
        kind = draw(st.sampled_from(kinds))
        metadata = draw(
            st.sampled_from([None, {}, {"other": 1}]) | st.builds(lambda v: {SAFE_KEY: v}, st.sampled_from(SAFE_VALUES))
        )
        surface[name] = ToolDefinition(name=name, kind=kind, metadata=copy.deepcopy(metadata))
    if draw(st.booleans()):
        surface["final_result"] = ToolDefinition(name="final_result", kind="output")
    return surface


@st.composite
def recorded_return(draw: st.DrawFn, c: ToolCallPart) -> Any:
    kind = draw(st.sampled_from(["success", "failed", "denied", "retried", "unknown", "synthesized", "legacy"]))
    if kind == "unknown":
        return unknown_outcome_result(c)
    if kind == "legacy":
        return legacy_retry(c)
    if kind == "synthesized":
        return returned(c, "cut", outcome="interrupted", metadata={"pydantic_ai_synthesized_tool_return": True})
    return returned(c, "r", outcome=kind)


@st.composite
def histories(draw: st.DrawFn) -> list[ModelMessage]:
    messages: list[ModelMessage] = [request(UserPromptPart("go"))]
    rounds = draw(st.integers(1, 4))
    for index in range(rounds):
        ids = draw(st.lists(st.sampled_from(IDS), unique=True, max_size=6))  # ids reused across responses (H-81)
        calls = [
            call(i, draw(st.sampled_from(NAMES)), tool_kind=draw(st.sampled_from([None, None, None, "output"])))
            for i in ids
        ]
        parts: list[Any] = [*([TextPart("t")] if draw(st.booleans()) else []), *calls]
        messages.append(
            response(*parts, state=draw(st.sampled_from(["complete", "complete", "interrupted", "suspended"])))
        )
        answered = draw(st.lists(st.sampled_from(calls), unique_by=lambda c: c.tool_call_id)) if calls else []
        is_last = index == rounds - 1
        if not is_last or draw(st.booleans()):
            returns = [draw(recorded_return(c)) for c in answered]
            split = draw(st.integers(0, len(returns)))
            messages.append(request(*returns[:split]))
            if split < len(returns):
                messages.append(request(*returns[split:]))
    return messages


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[ModelMessage], dict[str, ToolDefinition], str, Any, frozenset[str]]:
    history = draw(histories())
    surface = draw(surfaces())
    mode = draw(st.sampled_from(MODES))
    accepted = None
    if draw(st.booleans()):
        call_ids = draw(st.lists(st.sampled_from(IDS), unique=True, max_size=4))
        approval_ids = draw(st.lists(st.sampled_from([i for i in IDS if i not in call_ids]), unique=True, max_size=4))
        accepted = DeferredToolResults(
            calls={i: draw(call_answers) for i in call_ids}, approvals={i: draw(approval_answers) for i in approval_ids}
        )
    output_names = draw(st.sampled_from([frozenset(), frozenset({"final_result"})]))
    return history, surface, mode, accepted, output_names


def expected_open_calls(
    history: Sequence[ModelMessage], surface: Mapping[str, ToolDefinition], output_names: frozenset[str]
) -> list[ToolCallPart]:
    """Independent oracle for §2 "unanswered call" (not using candor.harness.history)."""
    positions = [i for i, m in enumerate(history) if isinstance(m, ModelResponse)]
    if not positions:
        return []
    last = positions[-1]
    answered = {
        p.tool_call_id for m in history[last + 1 :] for p in m.parts if isinstance(p, (ToolReturnPart, RetryPromptPart))
    }
    excluded = output_names | {n for n, d in surface.items() if d.kind == "output"}
    return [
        p
        for p in history[last].parts
        if isinstance(p, ToolCallPart)
        and p.tool_kind != "output"
        and p.tool_name not in excluded
        and p.tool_call_id not in answered
    ]


def has_answer(accepted: DeferredToolResults | None, call_id: str) -> bool:
    if accepted is None:
        return False
    approval = accepted.approvals.get(call_id)
    return call_id in accepted.calls or approval is False or isinstance(approval, ToolDenied)


def is_approved(accepted: DeferredToolResults | None, call_id: str) -> bool:
    if accepted is None or call_id in accepted.calls:
        return False
    approval = accepted.approvals.get(call_id)
    return approval is True or isinstance(approval, ToolApproved)


def apply_plan(history: Sequence[ModelMessage], plan: RecoveryPlan) -> list[ModelMessage]:
    """What an executor does: answers, simulated replay returns and unknown outcomes in one new request."""
    returns: list[Any] = []
    prompts: list[Any] = []
    for d in plan.decisions:
        if d.action == "apply_answer":
            returns += [p for p in d.answer if isinstance(p, ToolReturnPart)]
            prompts += [p for p in d.answer if isinstance(p, UserPromptPart)]
        elif d.action == "replay":
            returns.append(returned(d.call, "replayed"))
    returns += plan.unknown_outcome_parts()
    parts = returns + prompts
    return [*history, request(*parts)] if parts else list(history)


PROPERTY_SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(scenarios())
def test_property_one_decision_per_unanswered_call(scenario: Any) -> None:
    """H-41, H-42, H-49, H-59: exactly the unanswered calls of the last response, same objects, ids and order."""
    history, surface, mode, accepted, output_names = scenario
    plan = plan_recovery(history, surface, mode, accepted, output_tool_names=output_names)
    last = [m for m in history if isinstance(m, ModelResponse)][-1]
    if last.state == "suspended":
        assert plan == RecoveryPlan(skipped_reason="provider_suspended")
        return
    assert plan.skipped_reason is None
    expected = expected_open_calls(history, surface, output_names)
    assert len(plan.decisions) == len(expected)
    assert all(d.call is c for d, c in zip(plan.decisions, expected, strict=True))
    for d in plan.decisions:
        assert (d.answer != ()) == (d.action == "apply_answer")
        assert all(p.tool_call_id == d.call.tool_call_id for p in d.answer if isinstance(p, ToolReturnPart))
        assert sum(isinstance(p, ToolReturnPart) for p in d.answer) == (d.action == "apply_answer")
    assert [p.tool_call_id for p in plan.unknown_outcome_parts()] == list(plan.unknown_ids)
    assert all(p.metadata == {UNKNOWN_OUTCOME_METADATA_KEY: True} for p in plan.unknown_outcome_parts())  # H-43


@PROPERTY_SETTINGS
@given(scenarios())
def test_property_inputs_are_never_mutated(scenario: Any) -> None:
    """H-42: history (canonical JSON), surface and accepted batch are unchanged by planning."""
    history, surface, mode, accepted, output_names = scenario
    before = (canonical(history), copy.deepcopy(surface), copy.deepcopy(accepted), list(history))
    plan = plan_recovery(history, surface, mode, accepted, output_tool_names=output_names)
    plan.unknown_outcome_parts()
    assert (canonical(history), surface, accepted) == before[:3]
    assert all(a is b for a, b in zip(history, before[3], strict=True))


@PROPERTY_SETTINGS
@given(scenarios())
def test_property_policy(scenario: Any) -> None:
    """H-45..H-48, H-50, H-51, H-93, H-94: missing tools close, only True marks, answers first, approvals never replay."""
    history, surface, mode, accepted, output_names = scenario
    for d in plan_recovery(history, surface, mode, accepted, output_tool_names=output_names).decisions:
        call_id, tool_def = d.call.tool_call_id, surface.get(d.call.tool_name)
        assert (d.action == "apply_answer") == has_answer(accepted, call_id)  # H-93: whatever mode or surface
        if d.action == "apply_answer":
            continue
        if tool_def is None:
            assert (d.action, d.reason) == ("unknown_outcome", "tool_missing")  # H-48
        elif mode == "never":
            assert d.action == "unknown_outcome"  # H-45
        elif mode == "declared":  # H-46, H-50, H-51: only the boolean True in today's surface marks a tool
            marked = (tool_def.metadata or {}).get(SAFE_KEY) is True
            assert (d.action != "unknown_outcome") == marked
        else:
            assert d.action in ("replay", "suspend")  # H-47
        if is_approved(accepted, call_id):
            assert d.action != "replay"  # H-94
        if d.action == "replay":
            assert tool_def is not None and tool_def.kind == "function"  # H-55, H-56


@PROPERTY_SETTINGS
@given(scenarios())
def test_property_recorded_returns_are_never_reopened(scenario: Any) -> None:
    """H-49, H-60, H-93: after applying the plan, "always" re-plans only the suspended calls; then nothing."""
    history, surface, mode, accepted, output_names = scenario
    plan = plan_recovery(history, surface, mode, accepted, output_tool_names=output_names)
    if plan.skipped_reason is not None:
        return
    applied = apply_plan(history, plan)
    last = max(i for i, m in enumerate(applied) if isinstance(m, ModelResponse))
    ids = [
        p.tool_call_id for m in applied[last + 1 :] for p in m.parts if isinstance(p, (ToolReturnPart, RetryPromptPart))
    ]
    assert len(ids) == len(set(ids))  # H-93: no call id ever ends up with two returns
    for again in (None, accepted):
        replanned = plan_recovery(applied, surface, "always", again, output_tool_names=output_names)
        assert [d.call.tool_call_id for d in replanned.decisions] == list(plan.suspend_ids)
        assert replanned.answer_ids == ()
    closed = [
        *applied,
        request(*(returned(d.call, "no", outcome="denied") for d in plan.decisions if d.action == "suspend")),
    ]
    assert plan_recovery(closed, surface, "always", accepted, output_tool_names=output_names).is_empty
