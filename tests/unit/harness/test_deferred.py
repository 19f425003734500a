"""DeferredToolResume: construction, isolation and remaining() (spec §3.9, H-87 to H-89); the function-id stamp of
a suspending run's deferrals (§5, H-74) and when candor adds its own capability (H-84, H-107)."""

from __future__ import annotations

import copy
import dataclasses
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.tools import ToolDefinition

from candor.harness._agent_glue import HarnessCapability, harness_capabilities
from candor.harness.deferred import (
    DEFERRED_FUNCTION_ID_METADATA_KEY,
    MAX_DEFERRED_ITEMS,
    MAX_DEFERRED_METADATA_BYTES,
    DeferredToolResume,
    deferred_function_id,
    pending_ids,
    stamp_function_ids,
)
from candor.harness.errors import RunError

from scripted import deferred_call as call
from scripted import deferred_history as history


def mixed_batch(*, recovery: bool = False) -> DeferredToolResume:
    """An approval `a1`, an external call `e1` and a question `q1`, each answered and with metadata."""
    requests = DeferredToolRequests(
        approvals=[call("a1", "delete")],
        calls=[call("e1", "fetch"), call("q1", "ask")],
        metadata={"a1": {"why": "irreversible"}, "e1": {"x": 1}, "q1": {DEFERRED_FUNCTION_ID_METADATA_KEY: "ask"}},
        _kinds={"q1": "question"},
    )
    results = DeferredToolResults(
        approvals={"a1": True},
        calls={"e1": {"rows": 3}, "q1": "blue"},
        metadata={"a1": {"by": "ops"}, "e1": {"trace": "t"}},
        answered_by={"a1": "alice", "e1": "svc", "q1": "bob"},
    )
    return DeferredToolResume(requests=requests, results=results, recovery=recovery)


MIXED_CALLS = (call("a1", "delete"), call("e1", "fetch"), call("q1", "ask"))


def test_constants() -> None:
    """H-66, H-69, H-74, §3.2: the batch limits and the function-id metadata key have their fixed values."""
    assert MAX_DEFERRED_ITEMS == 128
    assert MAX_DEFERRED_METADATA_BYTES == 65536
    assert DEFERRED_FUNCTION_ID_METADATA_KEY == "candor.deferred_function_id"


# -- construction (H-87, H-88) -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requests", "results"),
    [
        ({"calls": [], "approvals": []}, DeferredToolResults()),
        (DeferredToolResults(), DeferredToolResults()),
        (None, DeferredToolResults()),
        (DeferredToolRequests(approvals=[call("a1")]), {"approvals": {"a1": True}}),
        (DeferredToolRequests(approvals=[call("a1")]), DeferredToolRequests()),
        (DeferredToolRequests(approvals=[call("a1")]), None),
    ],
)
def test_non_native_values_raise_type_error(requests: Any, results: Any) -> None:
    """H-88: requests/results that are not the native pydantic-ai types raise TypeError."""
    with pytest.raises(TypeError):
        DeferredToolResume(requests=requests, results=results)


def test_non_copyable_values_raise_type_error() -> None:
    """H-88: values that cannot be deep-copied raise TypeError at construction."""
    requests = DeferredToolRequests(calls=[call("e1")])
    with pytest.raises(TypeError):
        DeferredToolResume(requests=requests, results=DeferredToolResults(calls={"e1": threading.Lock()}))

    class Refuses:
        def __deepcopy__(self, memo: dict[int, Any]) -> Any:
            raise RuntimeError("no copies")

    with pytest.raises(TypeError) as info:
        DeferredToolResume(requests=requests, results=DeferredToolResults(calls={"e1": Refuses()}))
    assert isinstance(info.value.__cause__, RuntimeError)


def test_recovery_must_be_a_bool() -> None:
    """H-88: the recovery flag is a plain bool; anything else is refused with TypeError."""
    requests = DeferredToolRequests(approvals=[call("a1")])
    with pytest.raises(TypeError):
        DeferredToolResume(requests=requests, results=DeferredToolResults(), recovery="yes")  # type: ignore[arg-type]


def test_mutating_inputs_after_construction_does_not_change_the_batch() -> None:
    """H-87: the batch deep-copies what it was given."""
    args = {"path": "/tmp/a"}
    requests = DeferredToolRequests(approvals=[call("a1", args=args)], calls=[call("e1")], metadata={"a1": {"k": 1}})
    value = {"rows": [1, 2]}
    results = DeferredToolResults(approvals={"a1": True}, calls={"e1": value}, metadata={"e1": {"m": 1}})
    batch = DeferredToolResume(requests=requests, results=results)
    expected = copy.deepcopy((batch.requests, batch.results))

    args["path"] = "/etc/passwd"
    requests.approvals.append(call("a2"))
    requests.metadata["a1"]["k"] = 2
    value["rows"].append(3)
    results.approvals["a1"] = False
    results.metadata["e1"]["m"] = 2

    assert (batch.requests, batch.results) == expected
    assert batch.requests is not requests and batch.results is not results


def test_batch_is_frozen() -> None:
    """H-87: fields of a batch cannot be reassigned."""
    batch = mixed_batch()
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.recovery = True  # type: ignore[misc]


def test_pending_ids_and_function_id() -> None:
    """H-65, H-74, §5: approvals and calls are separate categories; local deferrals carry the function id."""
    batch = mixed_batch()
    assert pending_ids(batch.requests) == (["a1"], ["e1", "q1"])
    assert deferred_function_id(batch.requests, "q1") == "ask"
    assert deferred_function_id(batch.requests, "e1") is None
    assert deferred_function_id(batch.requests, "zz") is None


def _tool(name: str, kind: Any = "function", metadata: dict[str, Any] | None = None) -> ToolDefinition:
    return ToolDefinition(name=name, kind=kind, metadata=metadata)


def test_stamping_gives_local_deferrals_their_function_id_and_leaves_the_rest() -> None:
    """§5, H-74: at suspension each deferral of a local function tool (approval-gated ones included) carries the
    tool's identity: its declared `candor.deferred_function_id`, else its name. A stamp the tool set itself, the
    calls of external tools, calls no tool of the surface names, approvals and the other metadata stay as they
    are, and the original requests are not changed."""
    requests = DeferredToolRequests(
        approvals=[call("a1", "delete")],
        calls=[
            call("f1", "lookup"),
            call("g1", "gated"),
            call("d1", "declared"),
            call("s1", "stamped"),
            call("e1", "fetch"),
            call("u1", "gone"),
        ],
        metadata={"f1": {"note": "kept"}, "s1": {DEFERRED_FUNCTION_ID_METADATA_KEY: "own"}, "e1": {"x": 1}},
        _kinds={"f1": "question"},
    )
    before = copy.deepcopy(requests)
    surface = {
        "delete": _tool("delete", "unapproved"),
        "lookup": _tool("lookup"),
        "gated": _tool("gated", "unapproved"),
        "declared": _tool("declared", metadata={DEFERRED_FUNCTION_ID_METADATA_KEY: "declared-v1"}),
        "stamped": _tool("stamped"),
        "fetch": _tool("fetch", "external"),
    }
    stamped = stamp_function_ids(requests, surface)
    assert stamped.metadata == {
        "f1": {"note": "kept", DEFERRED_FUNCTION_ID_METADATA_KEY: "lookup"},
        "g1": {DEFERRED_FUNCTION_ID_METADATA_KEY: "gated"},
        "d1": {DEFERRED_FUNCTION_ID_METADATA_KEY: "declared-v1"},
        "s1": {DEFERRED_FUNCTION_ID_METADATA_KEY: "own"},
        "e1": {"x": 1},
    }
    assert stamped.calls == requests.calls and stamped.approvals == requests.approvals
    assert stamped.kind("f1") == "question"
    assert requests == before


def test_stamping_returns_the_requests_themselves_when_nothing_needs_a_stamp() -> None:
    """§5: only external calls (or stamps already there): no copy is made."""
    requests = DeferredToolRequests(calls=[call("e1", "fetch")], metadata={"e1": {"x": 1}})
    assert stamp_function_ids(requests, {"fetch": _tool("fetch", "external")}) is requests


@pytest.mark.parametrize(
    ("supported", "refresh", "expected"),
    [(True, False, 0), (True, True, 1), (False, False, 1), (False, True, 1)],
)
def test_a_run_gets_the_harness_capability_only_when_its_hooks_have_work(
    supported: bool, refresh: bool, expected: int
) -> None:
    """H-84, H-107, issue 12: pydantic-ai calls every hook of every capability at every step; candor's own is added
    only for a run that cannot suspend (H-84) or replaces a thread's stored system prompts (H-107)."""
    capabilities = harness_capabilities(deferred_tools_supported=supported, refresh_system_prompt=refresh)
    assert len(capabilities) == expected
    assert all(isinstance(capability, HarnessCapability) for capability in capabilities)
    if capabilities:
        assert (capabilities[0].deferred_tools_supported, capabilities[0].refresh_system_prompt) == (supported, refresh)


# -- remaining() (H-89) ----------------------------------------------------------------------------------------------


def test_remaining_without_a_response_raises() -> None:
    """H-89, §3.9 step 1: a history without any ModelResponse raises deferred_request_missing."""
    with pytest.raises(RunError) as info:
        mixed_batch().remaining([ModelRequest(parts=[UserPromptPart("hi")])])
    assert info.value.code == "deferred_request_missing"
    with pytest.raises(RunError) as info:
        mixed_batch().remaining([])
    assert info.value.code == "deferred_request_missing"


@pytest.mark.parametrize("recovery", [False, True])
def test_remaining_keeps_everything_while_all_calls_are_open(recovery: bool) -> None:
    """H-89: nothing is reflected in history yet, so the whole batch remains, recovery flag unchanged."""
    batch = mixed_batch(recovery=recovery)
    rest = batch.remaining(history(*MIXED_CALLS))
    assert rest is not None and rest is not batch
    assert rest == batch
    assert rest.recovery is recovery


@pytest.mark.parametrize("recovery", [False, True])
def test_remaining_returns_only_approvals_when_external_result_is_in_history(recovery: bool) -> None:
    """H-89: the external call's result is already in history; only what history does not reflect remains."""
    batch = mixed_batch(recovery=recovery)
    rest = batch.remaining(history(*MIXED_CALLS, answered=("e1", "q1")))
    assert rest is not None
    assert rest.recovery is recovery
    assert pending_ids(rest.requests) == (["a1"], [])
    assert rest.requests.metadata == {"a1": {"why": "irreversible"}}
    assert rest.requests._kinds == {}
    assert rest.results == DeferredToolResults(
        approvals={"a1": True}, metadata={"a1": {"by": "ops"}}, answered_by={"a1": "alice"}
    )


def test_remaining_keeps_question_kind_of_retained_ids() -> None:
    """H-89, §3.9 step 4: retained questions keep their category (the private _kinds entry)."""
    rest = mixed_batch().remaining(history(*MIXED_CALLS, answered=("a1", "e1")))
    assert rest is not None
    assert pending_ids(rest.requests) == ([], ["q1"])
    assert rest.requests.kind("q1") == "question"
    assert rest.requests.metadata == {"q1": {DEFERRED_FUNCTION_ID_METADATA_KEY: "ask"}}
    assert rest.results.calls == {"q1": "blue"} and rest.results.metadata == {}


def test_remaining_is_none_once_everything_is_incorporated() -> None:
    """H-89, H-90: every item has a return after the last response → None."""
    assert mixed_batch().remaining(history(*MIXED_CALLS, answered=("a1", "e1", "q1"))) is None


def test_remaining_is_none_when_a_later_response_superseded_the_batch() -> None:
    """H-89, §3.9 step 3: calls of earlier responses never count; a later response supersedes the batch."""
    messages = history(*MIXED_CALLS, answered=("a1", "e1", "q1"))
    messages.append(ModelResponse(parts=[TextPart("all done")]))
    assert mixed_batch().remaining(messages) is None
    # Even calls still open in an earlier response do not count once another response follows.
    stale = [*history(*MIXED_CALLS), ModelRequest(parts=[UserPromptPart("?")]), ModelResponse(parts=[call("x9")])]
    assert mixed_batch().remaining(stale) is None


@pytest.mark.filterwarnings("ignore:`RetryPromptPart` is deprecated")
def test_remaining_counts_legacy_retry_prompts_as_returns() -> None:
    """H-89, §2: a legacy RetryPromptPart answers its call like a ToolReturnPart."""
    messages = history(*MIXED_CALLS)
    messages.append(ModelRequest(parts=[RetryPromptPart(content="bad", tool_name="fetch", tool_call_id="e1")]))
    rest = mixed_batch().remaining(messages)
    assert rest is not None and pending_ids(rest.requests) == (["a1"], ["q1"])


def test_remaining_ignores_output_tool_calls() -> None:
    """H-89, §2: output-tool calls are never open calls, so a batch item naming one is dropped."""
    output_call = ToolCallPart(tool_name="final_result", args={}, tool_call_id="o1", tool_kind="output")
    batch = DeferredToolResume(
        requests=DeferredToolRequests(calls=[call("o1", "final_result")]),
        results=DeferredToolResults(calls={"o1": 1}),
    )
    assert batch.remaining(history(output_call)) is None


def test_remaining_never_mutates_the_batch_and_returns_a_detached_value() -> None:
    """H-89: remaining() builds a new batch; changing it leaves the original untouched."""
    batch = mixed_batch()
    before = copy.deepcopy((batch.requests, batch.results))
    rest = batch.remaining(history(*MIXED_CALLS, answered=("e1",)))
    assert (batch.requests, batch.results) == before
    assert rest is not None
    rest.requests.approvals[0].args = {"n": 99}
    rest.results.approvals["a1"] = ToolDenied("no")
    rest.results.calls["q1"] = ToolFailed("late")
    assert (batch.requests, batch.results) == before


def test_remaining_keeps_answer_objects_intact() -> None:
    """H-89: retained answers keep their native form (ToolApproved with override_args, ToolFailed)."""
    batch = DeferredToolResume(
        requests=DeferredToolRequests(approvals=[call("a1")], calls=[call("e1")]),
        results=DeferredToolResults(
            approvals={"a1": ToolApproved(override_args={"n": 2})}, calls={"e1": ToolFailed("x")}
        ),
        recovery=True,
    )
    rest = batch.remaining(history(call("a1"), call("e1")))
    assert rest == batch


# -- property: remaining() is a subset of open items -----------------------------------------------------------------

_IDS = st.text(alphabet="abcdef0123", min_size=1, max_size=4)


@st.composite
def _history_and_batch(draw: st.DrawFn) -> tuple[list[ModelMessage], DeferredToolResume, set[str]]:
    response_ids = draw(st.lists(_IDS, min_size=1, max_size=8, unique=True))
    answered = draw(st.sets(st.sampled_from(response_ids)))
    foreign = draw(st.lists(_IDS.map(lambda s: "z" + s), max_size=3, unique=True))
    batch_ids = draw(st.lists(st.sampled_from(response_ids + foreign), min_size=1, max_size=10, unique=True))
    as_approval = {i for i in batch_ids if draw(st.booleans())}
    approvals = [call(i) for i in batch_ids if i in as_approval]
    calls = [call(i) for i in batch_ids if i not in as_approval]
    requests = DeferredToolRequests(
        approvals=approvals,
        calls=calls,
        metadata={i: {"i": i} for i in batch_ids if draw(st.booleans())},
        _kinds={c.tool_call_id: "question" for c in calls if draw(st.booleans())},
    )
    results = DeferredToolResults(
        approvals={i: True for i in as_approval},
        calls={c.tool_call_id: c.tool_call_id for c in calls},
        metadata={i: {"m": 1} for i in batch_ids if draw(st.booleans())},
    )
    messages = history(*(call(i) for i in response_ids), answered=tuple(sorted(answered)))
    open_ids = set(response_ids) - answered
    return messages, DeferredToolResume(requests=requests, results=results, recovery=draw(st.booleans())), open_ids


@settings(max_examples=200, deadline=None)
@given(_history_and_batch())
def test_remaining_property_subset_of_open_items(case: tuple[list[ModelMessage], DeferredToolResume, set[str]]) -> None:
    """H-89: remaining() returns exactly the batch items whose call is open, never an answered one."""
    messages, batch, open_ids = case
    before = copy.deepcopy((batch.requests, batch.results))
    approval_ids, call_ids = pending_ids(batch.requests)
    expected = (set(approval_ids) | set(call_ids)) & open_ids
    rest = batch.remaining(messages)
    assert (batch.requests, batch.results) == before
    if not expected:
        assert rest is None
        return
    assert rest is not None and rest.recovery is batch.recovery
    kept_approvals, kept_calls = pending_ids(rest.requests)
    assert set(kept_approvals) <= set(approval_ids) and set(kept_calls) <= set(call_ids)
    assert set(kept_approvals) | set(kept_calls) == expected
    kept = expected
    for mapping in (rest.requests.metadata, rest.requests._kinds, rest.results.metadata):
        assert set(mapping) <= kept
    assert set(rest.results.approvals) == set(kept_approvals)
    assert set(rest.results.calls) == set(kept_calls)
    for tool_call_id in kept_calls:
        assert rest.requests.kind(tool_call_id) == batch.requests.kind(tool_call_id)
