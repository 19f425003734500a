"""Tests for `candor.harness._start_plan` (pure) and `candidates.pending_answer_ids`: how a run starts.

H-58, H-59, H-80, H-91: open calls or a fresh batch come before the first request; a provider-suspended response
is continued first with the input queued behind it; an incorporated recovery batch counts as no batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from pydantic_ai import DeferredToolRequests, DeferredToolResults
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from candor.harness._start_plan import plan_start
from candor.harness.candidates import pending_answer_ids
from candor.harness.deferred import DeferredToolResume

from scripted import deferred_call, deferred_history


def _batch(*call_ids: str, recovery: bool = False) -> DeferredToolResume:
    requests = DeferredToolRequests(calls=[deferred_call(i) for i in call_ids])
    results = DeferredToolResults(calls={i: "answer" for i in call_ids})
    return DeferredToolResume(requests=requests, results=results, recovery=recovery)


def _finished() -> list[ModelMessage]:
    return [ModelRequest(parts=[UserPromptPart("hi")]), ModelResponse(parts=[TextPart("hello")])]


def _provider_suspended() -> list[ModelMessage]:
    return [ModelRequest(parts=[UserPromptPart("hi")]), ModelResponse(parts=[TextPart("par")], state="suspended")]


@dataclass(frozen=True)
class Case:
    name: str
    history: list[ModelMessage]
    batch: DeferredToolResume | None
    has_open_start: bool
    iter_prompt: str | None
    queued_input: str | None
    keeps_batch: bool


CASES = [
    Case("empty history: the input is the prompt", [], None, False, "go", None, False),
    Case("finished history: the input is the prompt", _finished(), None, False, "go", None, False),
    Case("H-58: open calls come first", deferred_history(deferred_call("a")), None, True, None, None, False),
    Case("H-80: a fresh batch comes first", deferred_history(deferred_call("a")), _batch("a"), True, None, None, True),
    Case(
        "H-91: an incorporated recovery batch is no batch",
        deferred_history(deferred_call("a"), answered=("a",)),
        _batch("a", recovery=True),
        False,
        "go",
        None,
        False,
    ),
    Case("H-59: a suspended response is continued first", _provider_suspended(), None, False, None, "go", False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_plan_start(case: Case) -> None:
    """H-58, H-59, H-80, H-91: what `agent.iter` is prompted with and what waits."""
    plan = plan_start(case.history, batch=case.batch, user_input="go")
    assert plan.has_open_start is case.has_open_start
    assert plan.iter_prompt == case.iter_prompt
    assert plan.queued_input == case.queued_input
    assert plan.provider_suspended is (case.queued_input is not None)
    assert (plan.batch is not None) is case.keeps_batch
    assert plan.user_input == (None if case.queued_input is not None else "go")


def test_recovery_batch_is_reduced() -> None:
    """H-91: a recovery batch is cut down to the calls history has not answered yet."""
    history = deferred_history(deferred_call("a"), deferred_call("b"), answered=("a",))
    plan = plan_start(history, batch=_batch("a", "b", recovery=True), user_input=None)
    assert plan.batch is not None
    assert [c.tool_call_id for c in plan.batch.requests.calls] == ["b"]
    assert plan.has_open_start is True  # "b" is still open


@pytest.mark.parametrize(
    ("batch", "history", "expected"),
    [
        (None, deferred_history(deferred_call("a")), frozenset()),
        (_batch("a"), deferred_history(deferred_call("a"), deferred_call("b")), frozenset({"a"})),
        (_batch("a"), deferred_history(deferred_call("a"), answered=("a",)), frozenset()),
        (_batch("a"), [ModelRequest(parts=[UserPromptPart("hi")])], frozenset()),  # no response: not applicable
    ],
)
def test_pending_answer_ids(
    batch: DeferredToolResume | None, history: list[ModelMessage], expected: frozenset[str]
) -> None:
    """H-103: calls a batch still holds answers for stay open in a failed run's candidate."""
    assert pending_answer_ids(batch, history) == expected
