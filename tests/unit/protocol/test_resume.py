"""`protocol.resume` (§8.6): the typed resume answers, the lookup split, the refusals and the successor; and
`protocol.webhook_filter` (§9.3). Pure functions, table tests, no database."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import ValidationError
from pydantic_ai import DeferredToolResults, ToolApproved, ToolDenied
from pydantic_ai.exceptions import ToolFailed

from candor.service.errors import Conflict, Disabled, Forbidden, InvalidArgument
from candor.service.protocol.requests import checked_resume_body
from candor.service.protocol.resume import (
    ResumeAnswers,
    StoredResume,
    parse_stored_resume,
    resume_refusal,
    split_resume_lookup,
    successor_of,
)
from candor.service.protocol.tool_recovery import ToolRecovery
from candor.service.protocol.webhook_filter import subscription_wants

BODY = {
    "approvals": {
        "a1": {"action": "approve"},
        "a2": {"action": "deny", "reason": "not today"},
        "a3": {"action": "deny"},
        "a4": {"action": "deny", "reason": None},
    },
    "calls": {
        "c1": {"status": "returned", "value": {"rows": [1, 2]}},
        "c2": {"status": "returned", "value": None},
        "c3": {"status": "failed", "message": "upstream said no"},
    },
    "input": {"content": [{"type": "text", "text": "go on"}]},
}


def test_answers_convert_once_to_deferred_tool_results() -> None:
    """S-132, S-87: approve → ToolApproved(), deny → ToolDenied(reason or default), returned → the plain value,
    failed → ToolFailed(message)."""
    results = ResumeAnswers.model_validate(BODY).to_results()
    assert isinstance(results, DeferredToolResults)
    assert results.approvals == {
        "a1": ToolApproved(),
        "a2": ToolDenied("not today"),
        "a3": ToolDenied(),
        "a4": ToolDenied(),
    }
    assert results.calls == {"c1": {"rows": [1, 2]}, "c2": None, "c3": ToolFailed("upstream said no")}


@pytest.mark.parametrize(
    "body",
    [
        {"approvals": {"a": {"action": "approve"}}, "calls": {}},
        {"approvals": {}, "calls": {"c": {"status": "failed", "message": "m"}}, "input": {"content": []}},
        BODY,
    ],
)
def test_stored_json_is_the_body_as_written_and_reads_back_equal(body: dict[str, Any]) -> None:
    """§8.2, S-81: the stored form is the body as the client wrote it (the digest's input); reading it back gives
    an equal value, and storing that again gives the same JSON."""
    answers = ResumeAnswers.model_validate(body)
    assert answers.stored_json() == body
    again = ResumeAnswers.from_stored(answers.stored_json())
    assert again == answers and again.stored_json() == body


def test_stored_answers_parse_once_at_the_claim() -> None:
    """S-87: a successor's stored answers become one typed value; any other run has none."""
    assert parse_stored_resume(None) == StoredResume(answers=None, problem=None)
    parsed = parse_stored_resume(BODY)
    assert parsed.problem is None and parsed.answers == ResumeAnswers.model_validate(BODY)


@pytest.mark.parametrize(
    ("stored", "problem"),
    [
        (
            {"approvals": {"a": {"action": "maybe"}}, "calls": {}},
            "the stored answers do not validate (first error at approvals.a)",
        ),
        ({"approvals": {}}, "the stored answers do not validate (first error at calls)"),
        (["approvals"], "the stored answers are not a JSON object (list)"),
        ("{}", "the stored answers are not a JSON object (str)"),
    ],
)
def test_corrupt_stored_answers_are_a_problem_not_an_exception(stored: object, problem: str) -> None:
    """S-87: corrupt stored answers never raise at the claim (other runs are claimed with them); the problem is
    returned for that run's attempt to fail with."""
    assert parse_stored_resume(stored) == StoredResume(answers=None, problem=problem)


def test_a_null_input_is_left_out() -> None:
    """§8.6: an explicit `"input": null` reads as no input."""
    assert ResumeAnswers.model_validate({"approvals": {}, "calls": {}, "input": None}).stored_json() == {
        "approvals": {},
        "calls": {},
    }


@pytest.mark.parametrize(
    "body",
    [
        {"calls": {}},
        {"approvals": {}},
        {"approvals": {"a": {"action": "maybe"}}, "calls": {}},
        {"approvals": {"a": "approve"}, "calls": {}},
        {"approvals": {"a": {"action": "deny", "reason": 3}}, "calls": {}},
        {"approvals": {}, "calls": {"c": {"status": "returned"}}},
        {"approvals": {}, "calls": {"c": {"status": "failed"}}},
        {"approvals": {}, "calls": {"c": {"status": "failed", "message": 1}}},
        {"approvals": {}, "calls": {"c": {"status": "retry", "message": "x"}}},
        {"approvals": {}, "calls": {}, "extra": 1},
    ],
)
def test_malformed_answers_are_refused(body: dict[str, Any]) -> None:
    """S-79: both maps present, and every answer in one of the §8.6 shapes; nothing else."""
    with pytest.raises(ValidationError):
        ResumeAnswers.model_validate(body)


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ([], [("body", "invalid")]),
        ({"approvals": {}, "calls": {}, "x": 1}, [("body", "invalid")]),
        ({"approvals": {}}, [("calls", "required")]),
        ({"approvals": {"a": {"action": "maybe"}}, "calls": {"c": 1}}, [("approvals", "invalid_answer")]),
        ({"approvals": {}, "calls": {"c": 1}}, [("calls", "invalid_answer")]),
        ({"approvals": {}, "calls": {}, "input": "hi"}, [("input", "invalid_content")]),
        ({"approvals": {}, "calls": {}, "input": {"content": []}}, [("input", "invalid_content")]),
        (
            {"approvals": {"x": {"action": "approve"}}, "calls": {"x": {"status": "failed", "message": "m"}}},
            [("calls", "id_also_in_approvals")],
        ),
        (
            {"approvals": {f"a{i}": {"action": "approve"} for i in range(129)}, "calls": {}},
            [("body", "too_many_results")],
        ),
    ],
)
def test_request_check_names_the_first_bad_field(body: Any, fields: list[tuple[str, str]]) -> None:
    """S-79, §8.6 step 1: a plain mapping is built into the typed value once, or refused naming the field."""
    with pytest.raises(InvalidArgument) as caught:
        checked_resume_body(body)
    assert [tuple(f) for f in caught.value.fields] == fields


def test_request_check_passes_a_typed_value_through() -> None:
    """The typed value the HTTP layer built is not validated again: the same object comes back."""
    answers = ResumeAnswers.model_validate(BODY)
    assert checked_resume_body(answers) is answers
    assert checked_resume_body(BODY) == answers


@dataclass(frozen=True)
class Row:
    id: str
    workspace_id: str = "wsp_1"
    resumed_by_id: str | None = None
    request_key: str | None = None
    thread_id: str = "thr_1"
    agent: str = "demo"
    principal_id: str = "key_1"
    authority: dict[str, Any] = field(default_factory=lambda: {"permissions": ["run"]})
    options: dict[str, Any] = field(default_factory=lambda: {"o": 1})
    checkpoint_id: str | None = "chk_9"
    tool_recovery: ToolRecovery = "never"
    pending: Any = field(
        default_factory=lambda: {
            "approvals": [],
            "calls": [{"tool_call_id": "c1", "tool_name": "t", "arguments": {}, "kind": "external", "metadata": {}}],
        }
    )


WAITING = Row(id="run_w")
SUCCESSOR = Row(id="run_s", resumed_by_id="key_1", request_key="r")
RESUMED_AGAIN = Row(id="run_s2", resumed_by_id="key_1", request_key="r2")
FOREIGN = Row(id="run_w", workspace_id="wsp_2")


@pytest.mark.parametrize(
    ("rows", "run_id", "replay", "target"),
    [
        ([], "run_w", None, None),
        ([WAITING], "run_w", None, WAITING),
        ([SUCCESSOR, WAITING], "run_w", SUCCESSOR, WAITING),
        ([FOREIGN], "run_w", None, None),
        ([SUCCESSOR], "run_s", SUCCESSOR, SUCCESSOR),
        ([RESUMED_AGAIN], "run_w", None, None),
    ],
    ids=["nothing", "target", "replay_and_target", "other_workspace", "both_in_one_row", "other_key"],
)
def test_split_resume_lookup(rows: list[Row], run_id: str, replay: Row | None, target: Row | None) -> None:
    """§8.2, S-81, S-126: the key's successor is the replay; the run of the caller's workspace is the target."""
    found = split_resume_lookup(rows, principal_id="key_1", key="r", workspace_id="wsp_1", run_id=run_id)
    assert (found.replay, found.target) == (replay, target)


@dataclass(frozen=True)
class Thread:
    id: str = "thr_1"
    state: str = "waiting"
    last_run_id: str | None = "run_w"


@dataclass(frozen=True)
class Facts:
    workspace_archived: bool = False
    allowed: bool = True

    def verdict(self) -> str:
        return "allowed" if self.allowed else "refused"


COVERED = ResumeAnswers.model_validate({"approvals": {}, "calls": {"c1": {"status": "returned", "value": 1}}})
UNCOVERED = ResumeAnswers.model_validate({"approvals": {}, "calls": {}})


@pytest.mark.parametrize(
    ("thread", "facts", "answers", "error", "reason"),
    [
        (Thread(state="archived"), Facts(workspace_archived=True, allowed=False), UNCOVERED, Disabled, None),
        (Thread(state="archived"), Facts(allowed=False), UNCOVERED, Conflict, "archived"),
        (Thread(last_run_id="run_other"), Facts(allowed=False), UNCOVERED, Conflict, "not_idle_waiting_run"),
        (Thread(state="running"), Facts(allowed=False), UNCOVERED, Conflict, "not_idle_waiting_run"),
        (Thread(), Facts(allowed=False), UNCOVERED, InvalidArgument, "pending_coverage_mismatch"),
        (Thread(), Facts(allowed=False), COVERED, Forbidden, None),
        (Thread(), Facts(), COVERED, None, None),
    ],
    ids=["workspace_archived", "thread_archived", "not_last_run", "not_waiting", "coverage", "authority", "ok"],
)
def test_resume_refusal_first_failure_wins(
    thread: Thread, facts: Facts, answers: ResumeAnswers, error: type | None, reason: str | None
) -> None:
    """§8.6 steps 3–6: S-128 → S-84 → S-77 → S-78 → §4.3, the first that fails is the answer; none → None."""
    refusal = resume_refusal(thread, WAITING, facts, answers)
    if error is None:
        assert refusal is None
    else:
        assert isinstance(refusal, error) and getattr(refusal, "reason", None) == reason, refusal


def test_coverage_refusal_lists_the_missing_and_unexpected_ids() -> None:
    """S-78: the 400 names the group and the ids."""
    refusal = resume_refusal(Thread(), WAITING, Facts(), UNCOVERED)
    assert isinstance(refusal, InvalidArgument)
    assert refusal.details == {
        "field": "calls",
        "reason": "pending_coverage_mismatch",
        "missing": ["c1"],
        "unexpected": [],
        "misplaced": [],
        "by_field": {"calls": {"missing": ["c1"], "unexpected": []}},
    }


def test_successor_of_continues_the_waiting_run() -> None:
    """S-80, S-10: trigger `resume`, lineage `continue`, the waiting run's agent, options, principal and authority,
    its final checkpoint; the answers stored as their JSON; `max_attempts` as given."""
    new = successor_of(WAITING, answers=COVERED, resumed_by_id="key_2", key="r", digest="d" * 64, max_attempts=4)
    assert (new.trigger, new.lineage, new.parent_run_id, new.start_checkpoint_id) == (
        "resume",
        "continue",
        "run_w",
        "chk_9",
    )
    assert (new.agent, new.principal_id, new.options, new.authority) == (
        "demo",
        "key_1",
        {"o": 1},
        {"permissions": ["run"]},
    )
    assert (new.resume, new.resumed_by_id, new.request_key, new.request_digest, new.max_attempts) == (
        COVERED.stored_json(),
        "key_2",
        "r",
        "d" * 64,
        4,
    )
    assert new.tool_recovery == "never"  # the same logical run continues: its recovery mode stays
    assert new.options is not WAITING.options  # a copy: the successor's options never alias the waiting run's


@pytest.mark.parametrize(
    ("events", "filter_", "event_type", "run", "wanted"),
    [
        (["run.completed"], {}, "run.completed", {"agent": "a", "thread_id": "t"}, True),
        (["run.completed"], {}, "run.failed", {"agent": "a", "thread_id": "t"}, False),
        (None, None, "run.completed", {"agent": "a", "thread_id": "t"}, False),
        (["run.completed"], None, "run.completed", {"agent": "a", "thread_id": "t"}, True),
        (["run.completed"], {"agent": "a"}, "run.completed", {"agent": "a", "thread_id": "t"}, True),
        (["run.completed"], {"agent": "b"}, "run.completed", {"agent": "a", "thread_id": "t"}, False),
        (["run.completed"], {"agent": None, "thread_id": "t"}, "run.completed", {"agent": "a", "thread_id": "t"}, True),
        (["run.completed"], {"thread_id": "u"}, "run.completed", {"agent": "a", "thread_id": "t"}, False),
    ],
)
def test_subscription_wants(events: Any, filter_: Any, event_type: str, run: dict[str, str], wanted: bool) -> None:
    """§9.3: the event type is subscribed and every non-null filter field matches the run."""
    assert subscription_wants({"events": events, "filter": filter_}, event_type, run) is wanted
