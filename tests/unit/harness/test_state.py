"""Tests for `candor.harness.state`: HarnessState and CapabilityState (spec §3.3, rules H-1 to H-13)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from pydantic_ai import ModelMessagesTypeAdapter
from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from candor import CapabilityState, HarnessState
from candor.tools import unknown_outcome_result

EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
THREAD_ID = re.compile(r"^thr_[0-9a-f]{32}$")


def history() -> list[Any]:
    call = ToolCallPart(tool_name="add", args={"a": 1, "b": 2}, tool_call_id="c1")
    open_call = ToolCallPart(tool_name="echo", args='{"value": "x"}', tool_call_id="c2")
    return [
        ModelRequest(parts=[SystemPromptPart("sys", timestamp=EPOCH), UserPromptPart("hi", timestamp=EPOCH)]),
        ModelResponse(
            parts=[ThinkingPart("hmm", signature="sig"), TextPart("ok"), call], timestamp=EPOCH, state="complete"
        ),
        ModelRequest(parts=[ToolReturnPart("add", 3, tool_call_id="c1", timestamp=EPOCH)]),
        ModelResponse(parts=[open_call], timestamp=EPOCH, state="interrupted"),
        ModelRequest(parts=[unknown_outcome_result(open_call)]),
    ]


def full_state(thread_id: str = "thr_full") -> HarnessState:
    return HarnessState(
        schema_version="1",
        thread_id=thread_id,
        message_history=history(),
        capabilities={
            "memo": CapabilityState(version="1", data={"items": [1, 2.5, "x", None, True], "nested": {"k": []}}),
            "candor.usage": CapabilityState(version="1", data={"requests": 2}),
        },
        environment={"workspace": {"cwd": "/tmp", "files": ["a", "b"]}, "flag": True},
    )


def payload(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"schema_version": "1", "thread_id": "thr_abc"}
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not ...}


# ---------------------------------------------------------------------------------------------- H-1


def test_new_state_is_empty_with_generated_thread_id() -> None:
    """H-1: new() has schema "1", empty history/capabilities/environment and a `thr_` + 32 hex id."""
    state = HarnessState.new()
    assert state.schema_version == "1"
    assert state.message_history == ()
    assert state.capabilities == {}
    assert state.environment == {}
    assert THREAD_ID.fullmatch(state.thread_id)


def test_new_state_ids_are_unique() -> None:
    """H-1: two calls never return the same thread id."""
    ids = {HarnessState.new().thread_id for _ in range(500)}
    assert len(ids) == 500


def test_new_state_with_given_thread_id() -> None:
    """H-1, H-2: new(thread_id) uses the id given, and that id is validated."""
    assert HarnessState.new("ticket_42").thread_id == "ticket_42"
    with pytest.raises(ValidationError):
        HarnessState.new("Ticket-42")


# ---------------------------------------------------------------------------------------------- H-2

REJECTED_IDS = [
    "",
    "1-thread",
    "thread with space",
    "thread-custom",
    "Thr_abc",
    "thr_",
    "thr_ABC",
    "_abc",
    "thr",
    "thr__",
    "thr_a\n",
    "thr_é",
    "thr_a_b",
    "t" + "_" + "a" * 255,
]
ACCEPTED_IDS = ["thr_hostroot", "thr_" + "0123456789abcdef" * 2, "ticket_42", "a_b", "t" + "_" + "a" * 254, "a1b2_9z"]


@pytest.mark.parametrize("thread_id", REJECTED_IDS, ids=repr)
def test_thread_id_rejected(thread_id: str) -> None:
    """H-2: ids outside `^[a-z][a-z0-9]*_[a-z0-9]+$` or longer than 256 characters fail validation."""
    with pytest.raises(ValidationError):
        HarnessState(schema_version="1", thread_id=thread_id)
    with pytest.raises(ValidationError):
        HarnessState.model_validate_json(json.dumps(payload(thread_id=thread_id)))


@pytest.mark.parametrize("thread_id", ACCEPTED_IDS, ids=repr)
def test_thread_id_accepted(thread_id: str) -> None:
    """H-2: ids that match the pattern with at most 256 characters validate."""
    assert len(thread_id) <= 256
    assert HarnessState(schema_version="1", thread_id=thread_id).thread_id == thread_id
    assert HarnessState.model_validate_json(json.dumps(payload(thread_id=thread_id))).thread_id == thread_id


def test_thread_id_length_limit_is_exactly_256() -> None:
    """H-2: 256 characters validate, 257 do not."""
    HarnessState(schema_version="1", thread_id="t_" + "a" * 254)
    with pytest.raises(ValidationError):
        HarnessState(schema_version="1", thread_id="t_" + "a" * 255)


# ---------------------------------------------------------------------------------------------- H-3


@pytest.mark.parametrize(
    "data",
    [
        payload(schema_version=...),
        payload(thread_id=...),
        payload(schema_version="2"),
        payload(schema_version=1),
        payload(schema_version=None),
        payload(schema_version="1.0"),
        payload(schema_version=""),
    ],
    ids=["no-version", "no-thread", "v2", "int-1", "null", "1.0", "blank"],
)
def test_payload_without_valid_version_or_thread_fails(data: dict[str, Any]) -> None:
    """H-3: a missing schema_version/thread_id, or any version other than "1", fails validation."""
    with pytest.raises(ValidationError):
        HarnessState.model_validate_json(json.dumps(data))
    with pytest.raises(ValidationError):
        HarnessState.model_validate(data)


def test_schema_version_is_never_defaulted() -> None:
    """H-3: direct construction without schema_version is rejected too."""
    with pytest.raises(ValidationError):
        HarnessState(thread_id="thr_abc")  # type: ignore[call-arg]


# ---------------------------------------------------------------------------------------------- H-4


@pytest.mark.parametrize("extra", [{"unknown": 1}, {"approvals": {}}, {"credentials": "x"}, {"version": "1"}])
def test_unknown_top_level_field_fails(extra: dict[str, Any]) -> None:
    """H-4: unknown top-level fields fail validation (JSON, dict and constructor)."""
    with pytest.raises(ValidationError):
        HarnessState.model_validate_json(json.dumps(payload(**extra)))
    with pytest.raises(ValidationError):
        HarnessState(**payload(**extra))


def test_unknown_capability_field_fails() -> None:
    """H-4: a capability namespace has exactly version and data."""
    with pytest.raises(ValidationError):
        HarnessState.model_validate(payload(capabilities={"x": {"version": "1", "data": 1, "extra": 2}}))


@pytest.mark.parametrize("field", ["schema_version", "thread_id", "message_history", "capabilities", "environment"])
def test_assigning_a_field_raises(field: str) -> None:
    """H-4: a state is frozen."""
    state = full_state()
    before = state.model_dump_json()
    with pytest.raises(ValidationError):
        setattr(state, field, HarnessState.new().__dict__[field])
    assert state.model_dump_json() == before


def test_assigning_capability_state_field_raises() -> None:
    """H-4: a CapabilityState is frozen as well."""
    cs = CapabilityState(version="1", data={"a": 1})
    with pytest.raises(ValidationError):
        cs.version = "2"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        cs.data = {}  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------- H-5


def test_json_round_trip_of_a_full_state() -> None:
    """H-5: validate(dump(s)) == s, the second dump is byte-identical, and a deep copy is equal."""
    state = full_state()
    dumped = state.model_dump_json()
    loaded = HarnessState.model_validate_json(dumped)
    assert loaded == state
    assert loaded.model_dump_json() == dumped
    assert state.model_copy(deep=True) == state
    assert state.model_copy(deep=True).model_dump_json() == dumped


def test_json_round_trip_of_an_empty_state() -> None:
    """H-5: also holds for a state from new()."""
    state = HarnessState.new()
    dumped = state.model_dump_json()
    assert HarnessState.model_validate_json(dumped) == state
    assert HarnessState.model_validate_json(dumped).model_dump_json() == dumped


def test_message_history_json_is_the_native_encoding() -> None:
    """H-5 (§3.3): the JSON form of `message_history` is the `ModelMessagesTypeAdapter` encoding."""
    state = full_state()
    encoded = json.loads(state.model_dump_json())["message_history"]
    assert encoded == json.loads(ModelMessagesTypeAdapter.dump_json(list(state.message_history)))


_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
_json = st.recursive(
    _json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=10,
)


@settings(max_examples=60, deadline=None)
@given(
    caps=st.dictionaries(
        st.text(min_size=1, max_size=8), st.tuples(st.text(min_size=1, max_size=3), _json), max_size=3
    ),
    env=st.dictionaries(st.text(max_size=8), _json, max_size=3),
    prompts=st.lists(st.text(max_size=20), max_size=3),
)
def test_json_round_trip_property(caps: dict[str, Any], env: dict[str, Any], prompts: list[str]) -> None:
    """H-5: round trip and byte-identical re-dump hold for arbitrary finite JSON data and prompts."""
    messages: list[Any] = []
    for p in prompts:
        messages.append(ModelRequest(parts=[UserPromptPart(p, timestamp=EPOCH)]))
        messages.append(ModelResponse(parts=[TextPart(p)], timestamp=EPOCH))
    state = HarnessState(
        schema_version="1",
        thread_id="thr_prop",
        message_history=messages,
        capabilities={k: CapabilityState(version=v, data=d) for k, (v, d) in caps.items()},
        environment=env,
    )
    dumped = state.model_dump_json()
    loaded = HarnessState.model_validate_json(dumped)
    assert loaded == state
    assert loaded.model_dump_json() == dumped
    assert state.model_copy(deep=True) == state


# ---------------------------------------------------------------------------------------------- H-6


def test_mutating_messages_passed_in_does_not_change_state() -> None:
    """H-6: the constructor detaches the messages (and the list) it was given."""
    messages = history()
    state = HarnessState(schema_version="1", thread_id="thr_a", message_history=messages)
    before = state.model_dump_json()
    messages[0].parts[1].content = "changed"
    messages[1].parts.append(TextPart("extra"))
    messages[2].parts[0].content = 99
    messages.append(ModelRequest(parts=[UserPromptPart("appended")]))
    assert state.model_dump_json() == before


def test_mutating_messages_read_from_state_does_not_change_state() -> None:
    """H-6: every read of message_history is a fresh, detached tuple."""
    state = full_state()
    before = state.model_dump_json()
    read = state.message_history
    assert isinstance(read, tuple)
    prompt, response_parts, open_call = read[0].parts[1], read[1].parts, read[3].parts[0]
    assert isinstance(prompt, UserPromptPart) and isinstance(response_parts, list)
    assert isinstance(open_call, ToolCallPart)
    prompt.content = "changed"
    response_parts.clear()
    open_call.args = {"value": "changed"}
    assert state.model_dump_json() == before
    assert state.message_history[0].parts[1] == UserPromptPart("hi", timestamp=EPOCH)
    assert state.message_history is not state.message_history


def test_mutating_capability_and_environment_reads_does_not_change_state() -> None:
    """H-6, H-19: capability data and environment are detached on read, too."""
    state = full_state()
    before = state.model_dump_json()
    memo, workspace = state.capabilities["memo"].data, state.environment["workspace"]
    assert isinstance(memo, dict) and isinstance(memo["items"], list)
    assert isinstance(workspace, dict) and isinstance(workspace["files"], list)
    memo["items"].append("x")
    state.capabilities.pop("memo")
    workspace["files"].append("c")
    state.environment["new"] = 1
    assert state.model_dump_json() == before


def test_mutating_inputs_of_capabilities_and_environment_does_not_change_state() -> None:
    """H-6, H-19: data handed to the constructors is not shared with the state."""
    data = {"items": [1]}
    env = {"workspace": {"files": ["a"]}}
    caps = {"memo": CapabilityState(version="1", data=data)}
    state = HarnessState(schema_version="1", thread_id="thr_a", capabilities=caps, environment=env)
    before = state.model_dump_json()
    data["items"].append(2)
    env["workspace"]["files"].append("b")
    caps["other"] = CapabilityState(version="1", data=None)
    assert state.model_dump_json() == before


# ---------------------------------------------------------------------------------------------- H-7, H-8


def test_fork_generates_a_new_thread_id() -> None:
    """H-7: fork() without an id generates a fresh `thr_` id."""
    state = full_state()
    forked = state.fork()
    assert THREAD_ID.fullmatch(forked.thread_id)
    assert forked.thread_id != state.thread_id
    assert state.fork().thread_id != forked.thread_id


def test_fork_uses_the_given_thread_id() -> None:
    """H-7: fork(thread_id="thr_x") uses that id."""
    assert full_state().fork(thread_id="thr_x").thread_id == "thr_x"


def test_fork_to_the_same_thread_id_raises_value_error() -> None:
    """H-7: forking onto the source's own id is a ValueError (not a validation problem)."""
    state = full_state()
    with pytest.raises(ValueError) as info:
        state.fork(thread_id=state.thread_id)
    assert not isinstance(info.value, ValidationError)


@pytest.mark.parametrize("thread_id", ["", "Thr_x", "thr-x", "thr_"])
def test_fork_to_an_invalid_thread_id_raises_validation_error(thread_id: str) -> None:
    """H-7: an id that breaks H-2 raises ValidationError."""
    with pytest.raises(ValidationError):
        full_state().fork(thread_id=thread_id)


def test_fork_keeps_history_and_capabilities_and_clears_environment() -> None:
    """H-8: equal history and capabilities, environment {}, and the source is unchanged."""
    state = full_state()
    before = state.model_dump_json()
    forked = state.fork(thread_id="thr_fork")
    assert forked.message_history == state.message_history
    assert forked.capabilities == state.capabilities
    assert forked.environment == {}
    assert forked.schema_version == "1"
    assert state.model_dump_json() == before
    source = json.loads(before)
    dumped = json.loads(forked.model_dump_json())
    assert dumped["message_history"] == source["message_history"]
    assert dumped["capabilities"] == source["capabilities"]


def test_fork_is_detached_from_the_source() -> None:
    """H-8: a fork round-trips on its own and does not share mutable data with the source."""
    state = full_state()
    before = state.model_dump_json()
    forked = state.fork()
    assert HarnessState.model_validate_json(forked.model_dump_json()) == forked
    forked_parts, forked_memo = forked.message_history[0].parts, forked.capabilities["memo"].data
    assert isinstance(forked_parts, list) and isinstance(forked_memo, dict)
    nested = forked_memo["nested"]
    assert isinstance(nested, dict) and isinstance(nested["k"], list)
    forked_parts.clear()
    nested["k"].append(1)
    assert state.model_dump_json() == before


# ---------------------------------------------------------------------------------------------- H-12

NON_FINITE = [float("nan"), float("inf"), float("-inf")]


@pytest.mark.parametrize("bad", NON_FINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize(
    "where",
    [
        lambda v: {"capabilities": {"x": {"version": "1", "data": v}}},
        lambda v: {"capabilities": {"x": {"version": "1", "data": {"a": [1, {"b": v}]}}}},
        lambda v: {"environment": {"m": v}},
        lambda v: {"environment": {"m": {"deep": [[v]]}}},
    ],
    ids=["cap-top", "cap-nested", "env-top", "env-nested"],
)
def test_non_finite_numbers_fail_validation(bad: float, where: Any) -> None:
    """H-12: NaN, +Infinity or -Infinity anywhere in capability data or environment fails validation."""
    with pytest.raises(ValidationError):
        HarnessState.model_validate(payload(**where(bad)))


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_in_json_fail_validation(token: str) -> None:
    """H-12: the JSON constants are rejected as well."""
    for body in (
        f'"capabilities": {{"x": {{"version": "1", "data": {{"a": [{token}]}}}}}}',
        f'"environment": {{"m": {token}}}',
    ):
        raw = f'{{"schema_version": "1", "thread_id": "thr_a", {body}}}'
        with pytest.raises(ValidationError):
            HarnessState.model_validate_json(raw)


@pytest.mark.parametrize("bad", NON_FINITE, ids=["nan", "inf", "-inf"])
def test_non_finite_capability_state_fails(bad: float) -> None:
    """H-12: CapabilityState itself rejects non-finite data."""
    with pytest.raises(ValidationError):
        CapabilityState(version="1", data={"x": [bad]})


def test_capability_version_must_not_be_empty() -> None:
    """§3.3: CapabilityState.version has at least one character."""
    with pytest.raises(ValidationError):
        CapabilityState(version="", data=None)


# ---------------------------------------------------------------------------------------------- H-13


@pytest.mark.parametrize(
    "make", [HarnessState.new, full_state, lambda: full_state().fork()], ids=["new", "full", "fork"]
)
def test_json_has_exactly_the_five_keys(make: Any) -> None:
    """H-13: the JSON of a state has exactly the five top-level keys."""
    keys = set(json.loads(make().model_dump_json()))
    assert keys == {"schema_version", "thread_id", "message_history", "capabilities", "environment"}


def test_capability_json_has_version_and_data() -> None:
    """H-13 (§3.3): each namespace is encoded as {version, data}."""
    dumped = json.loads(full_state().model_dump_json())
    assert dumped["capabilities"]["memo"] == {
        "version": "1",
        "data": {"items": [1, 2.5, "x", None, True], "nested": {"k": []}},
    }


def test_read_views_are_the_stored_values_without_copies() -> None:
    """H-6, H-19, §3.3: the copy-free views hand out the stored values (equal to the copying fields, same objects on
    every call), while the fields still copy; a host that only reads uses the views."""
    state = HarnessState(
        schema_version="1",
        thread_id="thr_views",
        message_history=(ModelRequest(parts=[UserPromptPart(content="hi", timestamp=EPOCH)]),),
        capabilities={"ns": CapabilityState(version="1", data={"n": 1})},
        environment={"mount": {"cwd": "/"}},
    )
    assert state.history_view() == state.message_history
    assert state.history_view() is state.history_view()
    assert state.history_view()[0] is not state.message_history[0]
    assert dict(state.capabilities_view()) == state.capabilities
    assert state.capabilities_view() is state.capabilities_view()
    assert dict(state.environment_view()) == state.environment == {"mount": {"cwd": "/"}}
    assert state.environment_view() is state.environment_view()
    assert state.environment_view() is not state.environment
