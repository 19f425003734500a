"""Tests for `candor.harness.results`: RunResult and SafeFailure built directly (spec §3.8, rules H-24 to H-29)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError
from pydantic_ai import DeferredToolRequests
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart, UserPromptPart
from pydantic_ai.usage import RunUsage

from candor import HarnessState, RunResult, SafeFailure
from candor.errors import RunError

THREAD = "thr_results"
RUN = "run_" + "0" * 31 + "1"


def state(thread_id: str = THREAD) -> HarnessState:
    return HarnessState(
        schema_version="1",
        thread_id=thread_id,
        message_history=[ModelRequest(parts=[UserPromptPart("hi")]), ModelResponse(parts=[TextPart("yo")])],
    )


def deferred() -> DeferredToolRequests:
    return DeferredToolRequests(approvals=[ToolCallPart("delete", {"path": "/x"}, tool_call_id="c1")])


def failure(**kwargs: Any) -> SafeFailure:
    return SafeFailure(code="agent_run_failed", message="boom", **kwargs)


VALID: dict[str, dict[str, Any]] = {
    "completed": {"state": state(), "output": "done"},
    "completed-none-output": {"state": state()},
    "suspended": {"state": state(), "deferred": deferred(), "suspend_reason": "deferred"},
    "failed": {"failure": failure()},
    "failed-with-state": {"failure": failure(), "state": state()},
    "cancelled": {},
    "cancelled-with-state": {"state": state()},
}


def make(status: str, **fields: Any) -> RunResult[Any]:
    return RunResult(thread_id=THREAD, run_id=RUN, status=status, **fields)  # type: ignore[arg-type]  # bad statuses/fields too, on purpose


@pytest.mark.parametrize("name", list(VALID))
def test_allowed_combinations_construct(name: str) -> None:
    """H-24: every combination of the §3.8 table constructs."""
    status = name.split("-")[0]
    result = make(status, **VALID[name])
    assert result.status == status


INVALID: list[tuple[str, dict[str, Any]]] = [
    ("completed", {}),
    ("completed", {"state": state(), "failure": failure()}),
    ("completed", {"state": state(), "suspend_reason": "deferred"}),
    ("completed", {"state": state(), "deferred": deferred()}),
    ("suspended", {"state": state(), "suspend_reason": "deferred"}),
    ("suspended", {"deferred": deferred(), "suspend_reason": "deferred"}),
    ("suspended", {"state": state(), "deferred": deferred()}),
    ("suspended", {"state": state(), "deferred": deferred(), "suspend_reason": "other"}),
    ("suspended", {"state": state(), "deferred": deferred(), "suspend_reason": "deferred", "output": "x"}),
    ("suspended", {"state": state(), "deferred": deferred(), "suspend_reason": "deferred", "failure": failure()}),
    ("failed", {}),
    ("failed", {"state": state()}),
    ("failed", {"failure": failure(), "output": "x"}),
    ("failed", {"failure": failure(), "output": 0}),
    ("failed", {"failure": failure(), "suspend_reason": "deferred"}),
    ("failed", {"failure": failure(), "deferred": deferred()}),
    ("cancelled", {"output": "x"}),
    ("cancelled", {"output": False}),
    ("cancelled", {"failure": failure()}),
    ("cancelled", {"suspend_reason": "deferred"}),
    ("cancelled", {"deferred": deferred()}),
    ("unknown", {"state": state()}),
    ("completed", {"state": state(), "failure": {"code": "x", "message": "y"}}),
]


@pytest.mark.parametrize(("status", "fields"), INVALID, ids=[f"{s}-{'+'.join(f) or 'nothing'}" for s, f in INVALID])
def test_disallowed_combinations_raise_value_error(status: str, fields: dict[str, Any]) -> None:
    """H-24: the constructor rejects any combination outside the §3.8 table (e.g. suspended without deferred)."""
    with pytest.raises(ValueError):
        make(status, **fields)


@pytest.mark.parametrize(
    ("status", "fields"), INVALID[:-2], ids=[f"{s}-{'+'.join(f) or 'nothing'}" for s, f in INVALID[:-2]]
)
def test_replace_rejects_disallowed_combinations(status: str, fields: dict[str, Any]) -> None:
    """H-24: replace() validates like the constructor."""
    base = make("cancelled")
    changes = {"status": status, "state": None, **fields}
    with pytest.raises(ValueError):
        base.replace(**changes)


def test_replace_returns_a_validated_copy() -> None:
    """H-24 (§3.8): replace() returns a new result with the changes applied; the original is unchanged."""
    original = make("completed", state=state(), output="a")
    changed = original.replace(output="b")
    assert changed is not original
    assert (original.output, changed.output) == ("a", "b")
    failed = original.replace(status="failed", output=None, failure=failure())
    assert failed.status == "failed" and failed.failure == failure()
    with pytest.raises(ValueError):
        original.replace(status="failed")  # output still set, failure missing
    with pytest.raises(ValueError):
        original.replace(nonsense=1)


# ---------------------------------------------------------------------------------------------- H-25


@pytest.mark.parametrize("status", ["completed", "cancelled", "failed"])
def test_state_thread_mismatch_raises(status: str) -> None:
    """H-25: a state whose thread_id differs from the result's thread_id is rejected."""
    fields: dict[str, Any] = {"state": state("thr_other")}
    if status == "failed":
        fields["failure"] = failure()
    with pytest.raises(ValueError):
        make(status, **fields)


def test_replace_thread_mismatch_raises() -> None:
    """H-25: replace() changing thread_id away from the state's id is rejected."""
    result = make("completed", state=state())
    with pytest.raises(ValueError):
        result.replace(thread_id="thr_other")
    with pytest.raises(ValueError):
        result.replace(state=state("thr_other"))


@pytest.mark.parametrize(
    ("thread_id", "run_id"),
    [("", RUN), (THREAD, ""), ("   ", RUN), (THREAD, "   "), (THREAD, "run_xyz"), (THREAD, "RUN_" + "0" * 32)],
    ids=["blank-thread", "blank-run", "space-thread", "space-run", "short-run", "upper-run"],
)
def test_blank_ids_raise(thread_id: str, run_id: str) -> None:
    """H-25 (§3.8): a blank thread_id or run_id is rejected; run_id is `run_` + 32 hex."""
    with pytest.raises(ValueError):
        RunResult(thread_id=thread_id, run_id=run_id, status="cancelled")


# ---------------------------------------------------------------------------------------------- H-26


def test_completed_with_deferred_requests_output_raises() -> None:
    """H-26: a completed result cannot carry DeferredToolRequests as its output."""
    with pytest.raises(ValueError):
        make("completed", state=state(), output=deferred())
    with pytest.raises(ValueError):
        make("completed", state=state(), output=DeferredToolRequests())
    with pytest.raises(ValueError):
        make("completed", state=state(), output="x").replace(output=deferred())


# ---------------------------------------------------------------------------------------------- H-27


class Out(BaseModel):
    items: list[int]


def test_mutating_read_messages_does_not_change_later_reads() -> None:
    """H-27: all_messages() and new_messages() hand out deep copies."""
    s = state()
    result = make("completed", state=s, new_message_index=1)
    first = result.all_messages()
    prompt = first[0].parts[0]
    assert isinstance(prompt, UserPromptPart)
    prompt.content = "changed"
    first.append(ModelRequest(parts=[UserPromptPart("x")]))
    new = result.new_messages()
    new_parts = new[0].parts
    assert isinstance(new_parts, list)
    new_parts.clear()
    assert [m.parts for m in result.all_messages()] == [m.parts for m in s.message_history]
    assert len(result.new_messages()) == 1 and result.new_messages()[0].parts


@pytest.mark.parametrize("output", [{"a": [1]}, [1, [2]], Out(items=[1])], ids=["dict", "list", "model"])
def test_mutating_output_does_not_change_later_reads(output: Any) -> None:
    """H-27: a mutable output is copied at construction and on every read."""
    result = make("completed", state=state(), output=output)
    read = result.output
    if isinstance(read, dict):
        read["a"].append(2)
        output["a"].append(3)
        assert result.output == {"a": [1]}
    elif isinstance(read, list):
        read[1].append(3)
        output.append(4)
        assert result.output == [1, [2]]
    else:
        assert read is not None
        read.items.append(2)
        output.items.append(3)
        assert result.output == Out(items=[1])
    assert result.output_or_raise() == result.output


def test_mutating_deferred_and_usage_does_not_change_later_reads() -> None:
    """H-27: deferred and usage are deep copies, both on the way in and on the way out."""
    requests = deferred()
    usage = RunUsage(requests=1)
    result = make("suspended", state=state(), deferred=requests, suspend_reason="deferred", usage=usage)
    requests.approvals.clear()
    usage.requests = 99
    read = result.deferred
    assert read is not None
    read.approvals[0].tool_name = "other"
    read.calls.append(ToolCallPart("x", {}, tool_call_id="c9"))
    result.usage.requests = 50
    assert result.deferred == deferred()
    assert result.usage.requests == 1


def test_mutating_failure_details_does_not_change_later_reads() -> None:
    """H-27: SafeFailure.details (a mutable dict) read from a result is detached."""
    source = failure(details={"error_type": "X", "nested": {"n": [1]}})
    result = make("failed", failure=source)
    read = result.failure
    assert read is not None
    read.details["error_type"] = "changed"
    nested = read.details["nested"]
    assert isinstance(nested, dict) and isinstance(nested["n"], list)
    nested["n"].append(2)
    source.details["added"] = True
    assert result.failure == failure(details={"error_type": "X", "nested": {"n": [1]}})
    with pytest.raises(RunError) as info:
        result.raise_for_status()
    info.value.details["nested"]["n"].append(3)
    assert result.failure == failure(details={"error_type": "X", "nested": {"n": [1]}})


def test_mutating_state_read_from_result_does_not_change_later_reads() -> None:
    """H-27: the state a result hands out cannot be changed through any read."""
    result = make("completed", state=state())
    read = result.state
    assert read is not None
    before = read.model_dump_json()
    read_parts = read.message_history[0].parts
    assert isinstance(read_parts, list)
    read_parts.clear()
    with pytest.raises(ValidationError):
        read.thread_id = "thr_x"  # type: ignore[misc]
    assert result.state is not None
    assert result.state.model_dump_json() == before


# ---------------------------------------------------------------------------------------------- H-28, H-29


def test_raise_for_status_returns_for_completed() -> None:
    """H-28: completed → returns None."""
    make("completed", state=state()).raise_for_status()  # returns (raises for every other status)


@pytest.mark.parametrize(
    ("status", "fields", "code"),
    [
        ("suspended", {"state": state(), "deferred": deferred(), "suspend_reason": "deferred"}, "run_suspended"),
        ("cancelled", {}, "run_cancelled"),
        ("cancelled", {"state": state()}, "run_cancelled"),
    ],
)
def test_raise_for_status_suspended_and_cancelled(status: str, fields: dict[str, Any], code: str) -> None:
    """H-28, H-29: suspended → run_suspended, cancelled → run_cancelled; both with retry_hint new_run."""
    result = make(status, **fields)
    for call in (result.raise_for_status, result.output_or_raise):
        with pytest.raises(RunError) as info:
            call()
        assert info.value.code == code
        assert info.value.retry_hint == "new_run"


@pytest.mark.parametrize("hint", ["none", "new_run", "dependency_change"])
def test_raise_for_status_failed_uses_the_failure(hint: str) -> None:
    """H-28, H-29: failed → RunError with the SafeFailure's code, details and retry_hint."""
    result = make(
        "failed",
        failure=SafeFailure(code="model_unavailable", message="m", details={"error_type": "E"}, retry_hint=hint),
    )
    for call in (result.raise_for_status, result.output_or_raise):
        with pytest.raises(RunError) as info:
            call()
        assert info.value.code == "model_unavailable"
        assert info.value.details == {"error_type": "E"}
        assert info.value.retry_hint == hint


@pytest.mark.parametrize("output", [None, 0, "", False, [], {"k": None}])
def test_output_or_raise_returns_completed_output_even_none(output: Any) -> None:
    """H-29: a completed run's output is returned, including a legitimate None."""
    assert make("completed", state=state(), output=output).output_or_raise() == output


def test_safe_failure_defaults_and_validation() -> None:
    """§3.8: SafeFailure defaults details to {} and retry_hint to "none"; other hints are rejected."""
    f = SafeFailure(code="x", message="y")
    assert (f.details, f.retry_hint) == ({}, "none")
    with pytest.raises(ValidationError):
        SafeFailure(code="x", message="y", retry_hint="later")
