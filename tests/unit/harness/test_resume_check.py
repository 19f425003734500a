"""The resume pre-flight: check_resume() (H-64 to H-73, H-86, H-92) and check_surface() (H-74)."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied, ToolReturn
from pydantic_ai.exceptions import ModelRetry, ToolFailed
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.tools import ToolDefinition, ToolDefinitionKind

from candor.harness.deferred import (
    DEFERRED_FUNCTION_ID_METADATA_KEY,
    MAX_DEFERRED_ITEMS,
    MAX_DEFERRED_METADATA_BYTES,
    DeferredToolResume,
)
from candor.harness.errors import DefinitionError, RunError
from candor.harness.resume_check import ResumeCheck, check_resume, check_surface

from scripted import deferred_call as call
from scripted import deferred_history as history

NAN, INF = float("nan"), float("inf")


@dataclass
class Batch:
    """A small builder: approvals `a*`, calls (external or question) and their answers."""

    approvals: dict[str, Any] = field(default_factory=lambda: {"a1": True})
    calls: dict[str, Any] = field(default_factory=lambda: {"e1": {"rows": 3}})
    questions: frozenset[str] = frozenset()
    request_metadata: dict[str, Any] = field(default_factory=dict)
    result_metadata: dict[str, Any] = field(default_factory=dict)
    recovery: bool = False

    def requests(self) -> DeferredToolRequests:
        return DeferredToolRequests(
            approvals=[call(i) for i in self.approvals],
            calls=[call(i) for i in self.calls],
            metadata=self.request_metadata,
            _kinds={i: "question" for i in self.questions},
        )

    def resume(
        self, *, approvals: dict[str, Any] | None = None, calls: dict[str, Any] | None = None
    ) -> DeferredToolResume:
        results = DeferredToolResults(
            approvals=self.approvals if approvals is None else approvals,
            calls=self.calls if calls is None else calls,
            metadata=self.result_metadata,
        )
        return DeferredToolResume(requests=self.requests(), results=results, recovery=self.recovery)

    def history(self, **kwargs: Any) -> list[ModelMessage]:
        return history(*(call(i) for i in [*self.approvals, *self.calls]), **kwargs)


def code_of(resume: object, messages: list[ModelMessage], *, has_previous_state: bool = True) -> str | None:
    """The error code check_resume raises, or None when it accepts; asserts the inputs stay unchanged (H-73)."""
    before = repr((messages, resume))  # repr, not ==: answers may hold NaN or objects without equality
    try:
        check_resume(resume, messages, has_previous_state=has_previous_state)
    except RunError as exc:
        assert repr((messages, resume)) == before
        return exc.code
    assert repr((messages, resume)) == before
    return None


# -- H-64: argument problems -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [None, {"requests": {}, "results": {}}, DeferredToolRequests(approvals=[call("a1")]), DeferredToolResults()],
)
def test_not_a_batch_is_resume_invalid(value: object) -> None:
    """H-64: a deferred_resume that is not a DeferredToolResume → deferred_resume_invalid (checked first)."""
    assert code_of(value, Batch().history()) == "deferred_resume_invalid"
    assert code_of(value, [], has_previous_state=False) == "deferred_resume_invalid"


def test_batch_without_previous_state_is_state_required() -> None:
    """H-64: a batch without previous_state → deferred_state_required, before any other check."""
    assert code_of(Batch().resume(), [], has_previous_state=False) == "deferred_state_required"
    assert code_of(Batch(approvals={}, calls={}).resume(), [], has_previous_state=False) == "deferred_state_required"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: setattr(r.requests, "calls", "e1"),
        lambda r: r.requests.approvals.append({"tool_call_id": "a2"}),
        lambda r: setattr(r.requests, "metadata", ["a1"]),
        lambda r: setattr(r.results, "calls", [("e1", 1)]),
        lambda r: setattr(r.results, "approvals", None),
        lambda r: setattr(r.results, "metadata", "x"),
        lambda r: setattr(r.requests.calls[0], "tool_call_id", 7),
        lambda r: setattr(r.requests.calls[0], "tool_name", None),
        lambda r: setattr(r.requests, "_kinds", {"e1": "approval"}),
    ],
)
def test_malformed_batch_contents_are_resume_invalid(mutate: Any) -> None:
    """H-64: containers that do not hold what the native types declare are a batch argument problem."""
    resume = Batch().resume()
    mutate(resume)
    assert code_of(resume, Batch().history()) == "deferred_resume_invalid"


# -- H-66: batch shape -------------------------------------------------------------------------------------------------


def test_empty_batch() -> None:
    """H-66: no items → deferred_requests_empty."""
    assert code_of(Batch(approvals={}, calls={}).resume(), Batch().history()) == "deferred_requests_empty"


def test_item_limit() -> None:
    """H-66: 128 items (calls plus approvals) are accepted, 129 → deferred_requests_too_large."""
    ids = [f"c{i}" for i in range(MAX_DEFERRED_ITEMS + 1)]
    at_limit = Batch(approvals={i: True for i in ids[:64]}, calls={i: 1 for i in ids[64:MAX_DEFERRED_ITEMS]})
    assert code_of(at_limit.resume(), at_limit.history()) is None
    over = Batch(approvals={i: True for i in ids[:64]}, calls={i: 1 for i in ids[64:]})
    assert code_of(over.resume(), over.history()) == "deferred_requests_too_large"


@pytest.mark.parametrize("blank", ["", "   "])
@pytest.mark.parametrize("category", ["approvals", "calls"])
def test_blank_id_is_duplicate(blank: str, category: str) -> None:
    """H-66: a blank id → deferred_request_duplicate."""
    batch = Batch()
    resume = batch.resume()
    getattr(resume.requests, category)[0].tool_call_id = blank
    assert code_of(resume, batch.history()) == "deferred_request_duplicate"


@pytest.mark.parametrize("category", ["approvals", "calls"])
def test_repeated_id_within_a_category_is_duplicate(category: str) -> None:
    """H-66: an id repeated within one category → deferred_request_duplicate."""
    batch = Batch()
    resume = batch.resume()
    items = getattr(resume.requests, category)
    items.append(copy.deepcopy(items[0]))
    assert code_of(resume, batch.history()) == "deferred_request_duplicate"


def test_id_in_both_categories_is_overlap() -> None:
    """H-66: one id both an approval and a call → deferred_request_category_overlap."""
    batch = Batch(approvals={"x1": True}, calls={"x1": 1})
    assert code_of(batch.resume(), history(call("x1"))) == "deferred_request_category_overlap"


# -- H-65: coverage, H-86: an answer is not an approval -------------------------------------------------------------


@pytest.mark.parametrize(
    ("approvals", "calls"),
    [
        ({}, {}),  # an empty DeferredToolResults()
        ({}, {"e1": 1}),
        ({"a1": True}, {}),
        ({"a1": True, "zz": True}, {"e1": 1}),
        ({"a1": True}, {"e1": 1, "zz": 1}),
        ({}, {"a1": True, "e1": 1}),  # approval id placed in results.calls
        ({"a1": True, "e1": True}, {}),  # call id placed in results.approvals
        ({"a1": True, "e1": True}, {"e1": 1}),
    ],
)
def test_coverage_is_exact_per_category(approvals: dict[str, Any], calls: dict[str, Any]) -> None:
    """H-65: each category's answer keys must equal its pending ids exactly → else deferred_results_incomplete."""
    batch = Batch()
    assert code_of(batch.resume(approvals=approvals, calls=calls), batch.history()) == "deferred_results_incomplete"


def test_misplaced_approval_is_named_in_details() -> None:
    """H-65: details name the missing and misplaced pending ids but only count unknown keys."""
    batch = Batch()
    with pytest.raises(RunError) as info:
        check_resume(batch.resume(approvals={}, calls={"e1": 1, "a1": True}), batch.history(), has_previous_state=True)
    assert info.value.details == {"field": "results.approvals", "missing": ["a1"], "misplaced": [], "unknown_count": 0}
    with pytest.raises(RunError) as info:
        check_resume(
            batch.resume(approvals={"a1": True}, calls={"e1": 1, "a1": True, "secret-key": 1}),
            batch.history(),
            has_previous_state=True,
        )
    assert info.value.details == {"field": "results.calls", "missing": [], "misplaced": ["a1"], "unknown_count": 1}


def test_approve_all_fills_only_approvals() -> None:
    """H-86: build_results(approve_all=True) approves approvals only; external calls still need explicit values."""
    batch = Batch(approvals={"a1": True, "a2": True}, calls={"e1": 1, "q1": "x"}, questions=frozenset({"q1"}))
    requests = batch.requests()
    results = requests.build_results(approve_all=True)
    assert results.approvals == {"a1": ToolApproved(), "a2": ToolApproved()} and results.calls == {}
    resume = DeferredToolResume(requests=requests, results=results)
    with pytest.raises(RunError) as info:
        check_resume(resume, batch.history(), has_previous_state=True)
    assert info.value.code == "deferred_results_incomplete"
    assert info.value.details["missing"] == ["e1", "q1"]
    complete = requests.build_results(approve_all=True, calls={"e1": 1, "q1": "blue"})
    assert code_of(DeferredToolResume(requests=requests, results=complete), batch.history()) is None


# -- H-67, H-68: answer types and finiteness -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer", [True, False, ToolApproved(), ToolApproved(override_args={"n": 2}), ToolDenied(), ToolDenied("no")]
)
def test_accepted_approval_answers(answer: Any) -> None:
    """H-67: bool, ToolApproved and ToolDenied are approval answers."""
    batch = Batch()
    assert code_of(batch.resume(approvals={"a1": answer}), batch.history()) is None


@pytest.mark.parametrize(
    "answer",
    [
        "approved",
        1,
        0,
        None,
        {"approved": True},
        ToolFailed("x"),
        ToolApproved(override_args="n=2"),  # type: ignore[arg-type]
        ToolApproved(override_args={1: 2}),  # type: ignore[dict-item]
        ToolDenied(message=5),  # type: ignore[arg-type]
    ],
)
def test_rejected_approval_answers(answer: Any) -> None:
    """H-67: anything that is not a bool, ToolApproved or ToolDenied → deferred_approval_invalid."""
    batch = Batch()
    assert code_of(batch.resume(approvals={"a1": answer}), batch.history()) == "deferred_approval_invalid"


@pytest.mark.parametrize(
    "answer",
    [
        None,
        0,
        1.5,
        "text",
        True,
        [1, "a", None],
        {"a": {"b": [1.0, False]}},
        ToolReturn({"x": 1}, content="see"),
        ToolReturn("v", metadata={"m": 1}),
        ToolFailed("it broke"),
    ],
)
def test_accepted_call_answers(answer: Any) -> None:
    """H-67: a JSON value, ToolReturn or ToolFailed answers an external call or a question."""
    batch = Batch(calls={"e1": answer, "q1": answer}, questions=frozenset({"q1"}))
    assert code_of(batch.resume(), batch.history()) is None


class _Opaque:
    def __repr__(self) -> str:
        return "SECRET-VALUE"


@pytest.mark.parametrize(
    "answer",
    [
        ModelRetry("again"),
        _Opaque(),
        {1: "int key"},
        {"a": {2}},
        (1, 2),
        b"bytes",
        ToolFailed(5),  # type: ignore[arg-type]
        ToolDenied("no"),
        ToolApproved(),
        "legacy-retry-prompt",
    ],
)
@pytest.mark.filterwarnings("ignore:`RetryPromptPart` is deprecated")
def test_rejected_call_answers(answer: Any) -> None:
    """H-67: a call value that is not a JSON value, ToolReturn or ToolFailed (e.g. ModelRetry) → results_invalid."""
    if answer == "legacy-retry-prompt":
        answer = RetryPromptPart(content="x", tool_name="tool", tool_call_id="e1")
    batch = Batch()
    assert code_of(batch.resume(calls={"e1": answer}), batch.history()) == "deferred_results_invalid"


def test_self_containing_value_is_not_json() -> None:
    """H-67: a container that contains itself is not a JSON value."""
    loop: list[Any] = [1]
    loop.append(loop)
    batch = Batch()
    assert code_of(batch.resume(calls={"e1": loop}), batch.history()) == "deferred_results_invalid"


@pytest.mark.parametrize(
    ("approvals", "calls"),
    [
        ({"a1": True}, {"e1": NAN}),
        ({"a1": True}, {"e1": {"deep": [1, {"x": -INF}]}}),
        ({"a1": True}, {"e1": ToolReturn(INF)}),
        ({"a1": True}, {"e1": ToolReturn({"v": [NAN]})}),
        ({"a1": True}, {"e1": ToolReturn("ok", metadata={"m": NAN})}),
        ({"a1": True}, {"e1": ToolFailed(NAN)}),  # type: ignore[arg-type]
        ({"a1": ToolApproved(override_args={"n": INF})}, {"e1": 1}),
        ({"a1": ToolApproved(override_args={"n": {"k": [NAN]}})}, {"e1": 1}),
    ],
)
def test_non_finite_answers(approvals: dict[str, Any], calls: dict[str, Any]) -> None:
    """H-68: NaN or infinity in call values, ToolReturn, ToolFailed.message or override_args → results_invalid."""
    batch = Batch()
    assert code_of(batch.resume(approvals=approvals, calls=calls), batch.history()) == "deferred_results_invalid"


def test_errors_never_echo_submitted_values() -> None:
    """H-67, §6: details name ids and fields, never the submitted value."""
    batch = Batch(result_metadata={"SECRET-KEY": {"v": 1}})
    for resume in (batch.resume(calls={"e1": _Opaque()}), batch.resume(approvals={"a1": "SECRET-VALUE"})):
        with pytest.raises(RunError) as info:
            check_resume(resume, batch.history(), has_previous_state=True)
        assert "SECRET" not in json.dumps(info.value.details) + str(info.value)
    with pytest.raises(RunError) as info:
        check_resume(batch.resume(), batch.history(), has_previous_state=True)
    assert info.value.code == "deferred_metadata_invalid"
    assert "SECRET" not in json.dumps(info.value.details) + str(info.value)


# -- H-69: metadata --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("side", ["request_metadata", "result_metadata"])
@pytest.mark.parametrize(
    ("metadata", "ok"),
    [
        ({"a1": {"note": "x"}, "e1": {DEFERRED_FUNCTION_ID_METADATA_KEY: "fetch"}}, True),
        ({}, True),
        ({"zz": {"note": "x"}}, False),  # not a pending id
        ({1: {"note": "x"}}, False),
        ({"a1": {"v": NAN}}, False),
        ({"a1": {"v": [INF]}}, False),
        ({"a1": {"v": _Opaque()}}, False),
        ({"a1": {"v": {1, 2}}}, False),
        ({"a1": "not an object"}, False),
    ],
)
def test_metadata_keys_and_values(side: str, metadata: dict[Any, Any], ok: bool) -> None:
    """H-69: metadata keys must be pending ids and values finite JSON objects → else deferred_metadata_invalid."""
    fields: dict[str, Any] = {side: metadata}
    batch = Batch(**fields)
    assert code_of(batch.resume(), batch.history()) == (None if ok else "deferred_metadata_invalid")


@pytest.mark.parametrize("side", ["request_metadata", "result_metadata"])
def test_metadata_size_limit(side: str) -> None:
    """H-69: the encoded JSON (compact UTF-8) of each metadata mapping may hold at most 65536 bytes."""
    overhead = len(json.dumps({"a1": {"v": ""}}, separators=(",", ":")).encode())
    exact = {"a1": {"v": "x" * (MAX_DEFERRED_METADATA_BYTES - overhead)}}
    fits: dict[str, Any] = {side: exact}
    batch = Batch(**fits)
    assert code_of(batch.resume(), batch.history()) is None
    too_big: dict[str, Any] = {side: {"a1": {"v": "é" * ((MAX_DEFERRED_METADATA_BYTES - overhead) // 2 + 1)}}}
    over = Batch(**too_big)
    assert code_of(over.resume(), over.history()) == "deferred_metadata_invalid"


# -- H-70, H-71, H-72: correlation with history --------------------------------------------------------------------


def test_history_without_response_is_missing() -> None:
    """H-70: a history with no ModelResponse at all → deferred_request_missing."""
    assert code_of(Batch().resume(), []) == "deferred_request_missing"
    assert code_of(Batch().resume(), [ModelRequest(parts=[UserPromptPart("go")])]) == "deferred_request_missing"


def test_pending_id_not_in_final_response_is_missing() -> None:
    """H-70: a pending id absent from the final response (even if an earlier response had it) → missing."""
    batch = Batch()
    assert code_of(batch.resume(), history(call("a1"))) == "deferred_request_missing"
    earlier = [*batch.history(), ModelRequest(parts=[UserPromptPart("more")]), ModelResponse(parts=[TextPart("hi")])]
    assert code_of(batch.resume(), earlier) == "deferred_request_missing"
    output_call = ToolCallPart(tool_name="tool", args={"n": 1}, tool_call_id="e1", tool_kind="output")
    assert code_of(batch.resume(), history(call("a1"), output_call)) == "deferred_request_missing"


def test_final_response_repeating_a_call_id_is_duplicate() -> None:
    """H-70: a final response that repeats a call id → deferred_request_duplicate."""
    batch = Batch()
    assert code_of(batch.resume(), history(call("a1"), call("e1"), call("e1"))) == "deferred_request_duplicate"


@pytest.mark.filterwarnings("ignore:`RetryPromptPart` is deprecated")
def test_already_answered_is_completed() -> None:
    """H-71: a pending id with a return (or legacy retry prompt) after the last response → completed."""
    batch = Batch()
    assert code_of(batch.resume(), batch.history(answered=("e1",))) == "deferred_request_completed"
    legacy = RetryPromptPart(content="x", tool_name="tool", tool_call_id="a1")
    retried = [*batch.history(), ModelRequest(parts=[legacy])]
    assert code_of(batch.resume(), retried) == "deferred_request_completed"


@pytest.mark.parametrize(
    ("request_call", "recorded", "code"),
    [
        (call("e1", args={"n": 1}), call("e1", args='{"n": 1}'), None),
        (call("e1", args={"a": 1, "b": [2]}), call("e1", args={"b": [2], "a": 1}), None),
        (call("e1", args=""), call("e1", args={}), None),
        (call("e1", "other"), call("e1"), "deferred_request_mismatch"),
        (call("e1", args={"n": 2}), call("e1", args={"n": 1}), "deferred_request_mismatch"),
        (call("e1", args={"n": True}), call("e1", args={"n": 1}), "deferred_request_mismatch"),
        (call("e1", args={"n": 1, "m": 1}), call("e1", args={"n": 1}), "deferred_request_mismatch"),
        (call("e1", args="{not json"), call("e1"), "deferred_request_invalid"),
        (call("e1", args="[1, 2]"), call("e1"), "deferred_request_invalid"),
        (call("e1"), call("e1", args="{not json"), "deferred_request_invalid"),
    ],
)
def test_request_must_match_recorded_call(request_call: ToolCallPart, recorded: ToolCallPart, code: str | None) -> None:
    """H-72: tool_name and parsed arguments must equal the call in history; unparsable arguments are invalid."""
    resume = DeferredToolResume(
        requests=DeferredToolRequests(calls=[request_call]), results=DeferredToolResults(calls={"e1": 1})
    )
    assert code_of(resume, history(recorded)) == code


def test_recovery_batch_is_checked_against_history() -> None:
    """H-92: a recovery batch whose tool name changed → deferred_request_mismatch."""
    batch = Batch(recovery=True)
    assert code_of(batch.resume(), history(call("a1", "renamed"), call("e1"))) == "deferred_request_mismatch"


def test_accepted_batch_reports_pending_calls_and_categories() -> None:
    """H-64–H-72: an accepted batch yields the history's calls, in call order, with their categories."""
    recorded = [call("q1", args='{"n": 1}'), call("x9", "done"), call("e1"), call("a1")]
    messages = history(*recorded, answered=("x9",))
    batch = Batch(calls={"e1": 1, "q1": "blue"}, questions=frozenset({"q1"}))
    result = check_resume(batch.resume(), messages, has_previous_state=True)
    assert isinstance(result, ResumeCheck)
    assert list(result.calls) == ["q1", "e1", "a1"]
    assert result.calls["q1"] == recorded[0]  # the args string as recorded, not the request's dict
    assert dict(result.categories) == {"a1": "approval", "e1": "external", "q1": "question"}
    assert result.category("q1") == "question" and result.response_index == 1
    result.calls["q1"].args = "{}"  # detached: the history is not touched
    question = messages[1].parts[0]
    assert isinstance(question, ToolCallPart) and question.args == '{"n": 1}'


# -- check order and H-73 --------------------------------------------------------------------------------------------


def test_checks_run_in_order() -> None:
    """H-64–H-72: shape before coverage before answer types before metadata before history."""
    batch = Batch(result_metadata={"zz": {}})
    # incomplete coverage wins over an invalid approval type and bad metadata
    assert code_of(batch.resume(approvals={"a1": "yes"}, calls={}), []) == "deferred_results_incomplete"
    # answer type wins over metadata and a missing history
    assert code_of(batch.resume(approvals={"a1": "yes"}), []) == "deferred_approval_invalid"
    # metadata wins over a missing history
    assert code_of(batch.resume(), []) == "deferred_metadata_invalid"
    # shape wins over coverage
    overlap = Batch(approvals={"x1": True}, calls={"x1": 1})
    assert code_of(overlap.resume(approvals={}, calls={}), []) == "deferred_request_category_overlap"


def test_errors_leave_no_trace() -> None:
    """H-73: every error is a RunError and leaves the batch and the history exactly as they were."""
    batch = Batch()
    cases = [
        (batch.resume(approvals={}), batch.history()),
        (batch.resume(calls={"e1": NAN}), batch.history()),
        (batch.resume(), batch.history(answered=("a1",))),
        (batch.resume(), history(call("a1", "x"), call("e1"))),
    ]
    for resume, messages in cases:
        before = (copy.deepcopy(resume), json.dumps([repr(m) for m in messages]))
        with pytest.raises(RunError):
            check_resume(resume, messages, has_previous_state=True)
        assert (resume, json.dumps([repr(m) for m in messages])) == before


# -- property: exact coverage ----------------------------------------------------------------------------------------

_IDS = st.text(alphabet="abcxyz019", min_size=1, max_size=3)


@st.composite
def _coverage_case(draw: st.DrawFn) -> tuple[list[str], list[str], set[str], set[str]]:
    ids = draw(st.lists(_IDS, min_size=1, max_size=10, unique=True))
    approvals = [i for i in ids if draw(st.booleans())]
    calls = [i for i in ids if i not in approvals]
    strangers = draw(st.sets(_IDS.map(lambda s: "s" + s), max_size=2))

    def answers(own: list[str]) -> set[str]:
        mode = draw(st.sampled_from(["exact", "random"]))
        if mode == "exact":
            return set(own)
        return draw(st.sets(st.sampled_from(ids + sorted(strangers)))) if ids or strangers else set()

    return approvals, calls, answers(approvals), answers(calls)


@settings(max_examples=300, deadline=None)
@given(_coverage_case())
def test_coverage_property(case: tuple[list[str], list[str], set[str], set[str]]) -> None:
    """H-65, H-86: check_resume accepts iff each category's answer keys equal exactly its pending ids."""
    approvals, calls, approval_keys, call_keys = case
    requests = DeferredToolRequests(approvals=[call(i) for i in approvals], calls=[call(i) for i in calls])
    results = DeferredToolResults(approvals={i: True for i in approval_keys}, calls={i: "ok" for i in call_keys})
    resume = DeferredToolResume(requests=requests, results=results)
    code = code_of(resume, history(*(call(i) for i in [*calls, *approvals])))
    exact = approval_keys == set(approvals) and call_keys == set(calls)
    assert code == (None if exact else "deferred_results_incomplete")


# -- H-74: the tool surface --------------------------------------------------------------------------------------------


def tool(name: str, kind: ToolDefinitionKind = "function", function_id: str | None = None) -> ToolDefinition:
    metadata = None if function_id is None else {DEFERRED_FUNCTION_ID_METADATA_KEY: function_id}
    return ToolDefinition(name=name, kind=kind, metadata=metadata)


def surface_resume(
    *,
    approval: str | None = None,
    external: str | None = None,
    answer: Any = 1,
    function_id: Any = None,
    question: bool = False,
) -> DeferredToolResume:
    approvals = [call("a1", approval)] if approval else []
    calls = [call("e1", external)] if external else []
    metadata = {} if function_id is None else {"e1": {DEFERRED_FUNCTION_ID_METADATA_KEY: function_id}}
    requests = DeferredToolRequests(
        approvals=approvals, calls=calls, metadata=metadata, _kinds={"e1": "question"} if question else {}
    )
    results = DeferredToolResults(approvals={"a1": True} if approval else {}, calls={"e1": answer} if external else {})
    return DeferredToolResume(requests=requests, results=results)


@pytest.mark.parametrize(
    ("surface", "ok"),
    [
        ({"delete": tool("delete")}, True),
        ({"delete": tool("delete", "unapproved")}, True),
        ({"delete": tool("delete", "external")}, False),
        ({"delete": tool("delete", "output")}, False),
        ({"other": tool("other")}, False),
        ({}, False),
    ],
)
def test_surface_for_approvals(surface: dict[str, ToolDefinition], ok: bool) -> None:
    """H-74: an approval needs a function or approval-gated tool of the same name."""
    assert _surface_code(surface_resume(approval="delete"), surface) == (None if ok else "deferred_surface_mismatch")


@pytest.mark.parametrize(
    ("surface", "answer", "ok"),
    [
        ({"fetch": tool("fetch", "external")}, 1, True),
        ({"fetch": tool("fetch", "external")}, ToolFailed("x"), True),
        ({}, ToolFailed("gone"), True),  # the external tool was removed: only ToolFailed is accepted
        ({}, 1, False),
        ({}, ToolReturn(1), False),
        ({"fetch": tool("fetch")}, 1, False),  # a local tool merely sharing the name does not match …
        ({"fetch": tool("fetch")}, ToolFailed("gone"), False),  # … not even for a ToolFailed answer
        ({"fetch": tool("fetch", "unapproved")}, ToolFailed("gone"), False),
    ],
)
def test_surface_for_external_calls(surface: dict[str, ToolDefinition], answer: Any, ok: bool) -> None:
    """H-74: an external call needs an external tool of the same name; if removed, only ToolFailed is accepted."""
    resume = surface_resume(external="fetch", answer=answer)
    assert _surface_code(resume, surface) == (None if ok else "deferred_surface_mismatch")


@pytest.mark.parametrize("question", [False, True])
@pytest.mark.parametrize(
    ("surface", "ok"),
    [
        ({"lookup": tool("lookup", function_id="ts1:lookup")}, True),
        ({"lookup": tool("lookup", "unapproved", function_id="ts1:lookup")}, True),
        ({"lookup": tool("lookup", function_id="ts2:lookup")}, False),
        ({"lookup": tool("lookup", "external", function_id="ts1:lookup")}, False),
        ({"lookup": tool("lookup")}, False),  # fallback: the name "lookup" is not "ts1:lookup"
        ({"other": tool("other", function_id="ts1:lookup")}, False),  # the call's tool must be the one
        ({}, False),
    ],
)
def test_surface_for_local_deferrals(surface: dict[str, ToolDefinition], ok: bool, question: bool) -> None:
    """H-74: a deferral raised by a local function tool needs a function tool with the same function id."""
    resume = surface_resume(external="lookup", function_id="ts1:lookup", question=question, answer=ToolFailed("x"))
    assert _surface_code(resume, surface) == (None if ok else "deferred_surface_mismatch")


def test_surface_function_id_falls_back_to_the_tool_name() -> None:
    """H-74: a definition without candor.deferred_function_id metadata is compared by its name."""
    resume = surface_resume(external="lookup", function_id="lookup")
    assert _surface_code(resume, {"lookup": tool("lookup")}) is None
    assert _surface_code(resume, {"lookup": tool("lookup", function_id="")}) is None
    assert _surface_code(resume, {"lookup": tool("lookup", function_id="ts:lookup")}) == "deferred_surface_mismatch"


def test_surface_rejects_non_string_function_id() -> None:
    """H-74: a function id that is not a string matches no tool."""
    resume = surface_resume(external="lookup", function_id=7)
    for surface in ({"lookup": tool("lookup", function_id=7)}, {"lookup": tool("lookup")}):  # type: ignore[arg-type]
        assert _surface_code(resume, surface) == "deferred_surface_mismatch"


def test_surface_for_unstamped_questions() -> None:
    """H-74: a question without the function-id stamp needs a local tool of that name."""
    resume = surface_resume(external="ask", question=True)
    assert _surface_code(resume, {"ask": tool("ask")}) is None
    assert _surface_code(resume, {"ask": tool("ask", "external")}) == "deferred_surface_mismatch"


def test_surface_error_details_name_the_item() -> None:
    """H-74: DefinitionError names the pending id and category, nothing submitted."""
    with pytest.raises(DefinitionError) as info:
        check_surface(surface_resume(approval="delete", external="fetch"), {"delete": tool("delete")})
    assert info.value.details == {"tool_call_id": "e1", "category": "external", "reason": "external_tool_removed"}


def _surface_code(resume: DeferredToolResume, surface: dict[str, ToolDefinition]) -> str | None:
    before = copy.deepcopy((resume, surface))
    try:
        check_surface(resume, surface)
    except DefinitionError as exc:
        return exc.code
    finally:
        assert (resume, surface) == before
    return None


def test_recovery_batch_is_reduced_before_the_check() -> None:
    """H-89, H-91, H-92: a partly incorporated recovery batch is checked as its remaining() part."""
    batch = Batch(recovery=True)
    messages = batch.history(answered=("e1",))
    resume = batch.resume()
    assert code_of(resume, messages) == "deferred_request_completed"  # the whole batch no longer fits …
    rest = resume.remaining(messages)
    assert rest is not None and rest.recovery
    result = check_resume(rest, messages, has_previous_state=True)  # … its remaining part does
    assert dict(result.categories) == {"a1": "approval"}
    renamed = history(call("a1", "renamed"), call("e1"), answered=("e1",))
    rest = resume.remaining(renamed)
    assert rest is not None and code_of(rest, renamed) == "deferred_request_mismatch"
