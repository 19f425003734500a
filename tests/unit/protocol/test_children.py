"""Child-run decisions (§7.13, §9.5, S-118): spawn limits, staging, the result payload, the handler's plan."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from candor.service.protocol.children import (
    ChildResultPlan,
    SpawnRefusalCode,
    child_result_payload,
    plan_child_result,
    spawn_refusal,
    stages_child_result,
    unknown_child_agents,
)


@dataclass(frozen=True)
class SpawnCase:
    name: str
    expected: SpawnRefusalCode | None
    agent: str = "helper"
    input_bytes: int = 50
    started_children: int = 0
    parent_depth: int = 0
    child_count: int = 16
    child_depth: int = 4


SPAWN_CASES = [
    SpawnCase("first child of a root run", None),
    SpawnCase("agent not in the allowed list", "child_agent_not_allowed", agent="admin"),
    SpawnCase("empty input", "child_input_empty", input_bytes=0),
    SpawnCase("input over the inbox bytes", "child_input_too_large", input_bytes=1001),
    SpawnCase("one below the count limit", None, started_children=15),
    SpawnCase("count limit reached", "child_count_exceeded", started_children=16),
    SpawnCase("count limit zero", "child_count_exceeded", child_count=0),
    SpawnCase("deepest allowed nesting", None, parent_depth=3),
    SpawnCase("one level too deep", "child_depth_exceeded", parent_depth=4),
    SpawnCase("depth limit zero forbids children", "child_depth_exceeded", child_depth=0),
    SpawnCase("agent is checked before the limits", "child_agent_not_allowed", agent="x", started_children=99),
]


@pytest.mark.parametrize("case", SPAWN_CASES, ids=lambda case: case.name)
def test_spawn_refusal(case: SpawnCase) -> None:
    """§7.13: at most `worker.child_count` children per run, nesting ≤ `worker.child_depth`, allowed agents only."""
    refusal = spawn_refusal(
        agent=case.agent,
        allowed_agents=("helper", "writer"),
        input_bytes=case.input_bytes,
        input_limit=1000,
        started_children=case.started_children,
        parent_depth=case.parent_depth,
        child_count=case.child_count,
        child_depth=case.child_depth,
    )
    assert (refusal.code if refusal is not None else None) == case.expected
    if refusal is not None:
        assert refusal.for_model().startswith(f"{case.expected}: ")


@pytest.mark.parametrize(
    ("origin", "status", "expected"),
    [
        ("child", "completed", True),
        ("child", "failed", True),
        ("child", "cancelled", True),
        ("child", "waiting", False),
        ("new", "completed", False),
        ("fork", "failed", False),
    ],
)
def test_stages_child_result(origin: str, status: str, expected: bool) -> None:
    """§7.10, S-118: only a non-waiting seal of a run on a child thread stages a `child_result` row."""
    assert stages_child_result(thread_origin=origin, status=status) is expected


def test_child_result_payload_is_one_text_item_of_canonical_json() -> None:
    """§9.5: the entry's content is one text item holding canonical JSON {child_run_id, status, output, failure}."""
    payload = child_result_payload(
        child_run_id="run_1", status="failed", output=None, failure={"message": "m", "code": "c"}
    )
    content = payload["content"]
    assert isinstance(content, list)
    (item,) = content
    assert isinstance(item, dict) and item["type"] == "text"
    expected = '{"child_run_id":"run_1","failure":{"code":"c","message":"m"},"output":null,"status":"failed"}'
    assert item["text"] == expected
    assert json.loads(item["text"])["status"] == "failed"


_FACTS: dict[str, Any] = dict(
    target_valid=True,
    parent_archived=False,
    already_entered=False,
    inbox_count=0,
    inbox_bytes=0,
    entry_bytes=100,
    count_limit=10,
    bytes_limit=1000,
)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, "insert"),
        ({"target_valid": False}, "invalid_target"),
        ({"target_valid": False, "parent_archived": True}, "invalid_target"),
        ({"parent_archived": True}, "ignore_archived"),
        ({"parent_archived": True, "inbox_count": 10}, "ignore_archived"),
        ({"already_entered": True}, "duplicate"),
        ({"already_entered": True, "inbox_count": 10}, "duplicate"),
        ({"inbox_count": 9}, "insert"),
        ({"inbox_count": 10}, "defer_inbox_full"),
        ({"inbox_bytes": 900}, "insert"),
        ({"inbox_bytes": 901}, "defer_inbox_full"),
    ],
)
def test_plan_child_result(changes: dict[str, Any], expected: ChildResultPlan) -> None:
    """§9.5, S-118: archived parent → ignored; existing entry → one entry only; full inbox → deferred; else insert."""
    assert plan_child_result(**{**_FACTS, **changes}) == expected


def test_unknown_child_agents() -> None:
    """§7.13 opt-in: every `agents.<name>.children` entry must name a configured agent."""
    children = {"lead": ["helper", "ghost"], "helper": [], "other": ["lead"]}
    assert unknown_child_agents(children, {"lead", "helper", "other"}) == [("lead", "ghost")]
    assert unknown_child_agents({}, set()) == []
