"""(pure) What an attempt hands to `Harness.stream`: content, start state, resume batch, usage deltas (§7.7)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai import DeferredToolRequests
from pydantic_ai.messages import ModelRequest, ToolCallPart, UserPromptPart
from pydantic_ai.usage import RunUsage

from candor import HarnessState
from candor.service.errors import CheckpointCorrupt
from candor.service.protocol.resume import ResumeAnswers
from candor.service.worker.inputs import (
    deferred_json,
    input_content,
    resume_batch,
    resume_input,
    start_state,
    usage_delta,
)


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"content": [{"type": "text", "text": "hi"}]}, "hi"),
        ({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, ["a", "b"]),
        ({"input": {"content": [{"type": "text", "text": "wrapped"}]}}, "wrapped"),
        ({"content": [{"type": "image", "url": "x"}]}, None),
        ({}, None),
        (None, None),
    ],
)
def test_input_content(payload: dict[str, Any] | None, expected: object) -> None:
    """§8.1 input content becomes harness user content."""
    assert input_content(payload) == expected


def test_resume_input_only_until_consumed() -> None:
    """S-88: the resume input is passed until the successor's envelope says it entered history."""
    body = {"approvals": {}, "calls": {}, "input": {"content": [{"type": "text", "text": "go on"}]}}
    answers = ResumeAnswers.model_validate(body)
    assert resume_input(answers, consumed=False) == "go on"
    assert resume_input(answers, consumed=True) is None
    assert resume_input(ResumeAnswers(approvals={}, calls={}), consumed=False) is None
    assert resume_input(None, consumed=False) is None


def test_start_state_new_own_and_fork() -> None:
    """§6, §7.7 step 2: nothing → new state of the thread; a fork's origin state is re-homed, environment cleared."""
    assert start_state(None, thread_id="thr_" + "a" * 32, from_own_checkpoint=False).thread_id == "thr_" + "a" * 32
    origin = HarnessState(
        schema_version="1",
        thread_id="thr_origin",
        message_history=[ModelRequest(parts=[UserPromptPart("x")])],
        environment={"mount": {"k": 1}},
    )
    forked = start_state(origin, thread_id="thr_fork", from_own_checkpoint=False)
    assert forked.thread_id == "thr_fork" and forked.environment == {}
    assert forked.message_history == origin.message_history
    assert start_state(origin, thread_id="thr_origin", from_own_checkpoint=True) is origin
    with pytest.raises(CheckpointCorrupt):
        start_state(origin, thread_id="thr_fork", from_own_checkpoint=True)


def test_resume_batch_is_fresh_on_the_first_attempt_only() -> None:
    """S-87: the first attempt passes the answers with recovery=False, every later one with recovery=True."""
    requests = DeferredToolRequests(approvals=[ToolCallPart("delete", {"path": "a"}, tool_call_id="c1")])
    stored = deferred_json(requests)
    body = ResumeAnswers.model_validate({"approvals": {"c1": {"action": "approve"}}, "calls": {}})
    first = resume_batch(stored, body, attempt_number=1)
    later = resume_batch(stored, body, attempt_number=2)
    assert (first.recovery, later.recovery) == (False, True)
    assert [c.tool_call_id for c in first.requests.approvals] == ["c1"]
    assert set(first.results.approvals) == {"c1"}
    with pytest.raises(ValueError):
        resume_batch(None, body, attempt_number=1)


def test_usage_delta() -> None:
    """S-51: usage records hold what was incurred since the previous record."""
    from_nothing = usage_delta(RunUsage(requests=1, input_tokens=6), RunUsage())
    assert from_nothing is not None
    assert usage_delta(RunUsage(requests=2, input_tokens=10), RunUsage(requests=1, input_tokens=4)) == {
        **from_nothing,
    }
    assert usage_delta(RunUsage(requests=1), RunUsage(requests=1)) is None
