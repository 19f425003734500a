"""Pending items of a waiting run (§5.7) and the strict resume checks and mapping (§8.6)."""

from __future__ import annotations

from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from pydantic_ai import DeferredToolRequests
from pydantic_ai.messages import ToolCallPart

from candor.service.protocol.pending import (
    CoverageMismatch,
    GroupMismatch,
    Pending,
    PendingCall,
    PendingInvalid,
    build_pending,
    coverage_mismatch,
    resume_shape_problem,
    wait_reason,
)


def call(call_id, name="tool", args=None):
    return ToolCallPart(tool_name=name, args=args if args is not None else {}, tool_call_id=call_id)


def item(call_id, kind):
    return PendingCall(tool_call_id=call_id, tool_name="t", arguments={}, kind=kind, metadata={})


def test_build_pending_from_deferred_requests():
    """S-89, S-131: approvals and calls (external and question) with name, arguments, kind and metadata,
    reserved candor.* metadata keys dropped."""
    requests = DeferredToolRequests(
        approvals=[call("a1", "delete_file", '{"path": "/tmp/x"}')],
        calls=[call("c1", "client_lookup", {"q": "x"}), call("q1", "ask_user", None)],
        metadata={
            "a1": {"reason": "destructive", "candor.deferred_function_id": "fn"},
            "c1": {"candor.unknown_outcome": True},
        },
        _kinds={"q1": "question"},
    )
    pending = build_pending(requests)
    assert pending.model_dump(mode="json") == {
        "approvals": [
            {
                "tool_call_id": "a1",
                "tool_name": "delete_file",
                "arguments": {"path": "/tmp/x"},
                "kind": "approval",
                "metadata": {"reason": "destructive"},
            }
        ],
        "calls": [
            {
                "tool_call_id": "c1",
                "tool_name": "client_lookup",
                "arguments": {"q": "x"},
                "kind": "external",
                "metadata": {},
            },
            {"tool_call_id": "q1", "tool_name": "ask_user", "arguments": {}, "kind": "question", "metadata": {}},
        ],
    }
    assert wait_reason(pending) == "multiple"
    assert Pending.model_validate(pending.model_dump(mode="json")) == pending


@pytest.mark.parametrize(
    ("approvals", "calls", "reason"),
    [
        (["a"], [], "approval"),
        (["a", "b"], [], "approval"),
        ([], ["c"], "call"),
        (["a"], ["c"], "multiple"),
    ],
)
def test_wait_reason(approvals, calls, reason):
    """S-89: multiple when both groups are non-empty, else approval or call."""
    pending = build_pending(
        DeferredToolRequests(approvals=[call(i) for i in approvals], calls=[call(i) for i in calls])
    )
    assert wait_reason(pending) == reason


@pytest.mark.parametrize(
    ("approvals", "calls", "code"),
    [
        ([], [], "deferred_requests_empty"),
        ([f"a{i}" for i in range(64)], [f"c{i}" for i in range(65)], "deferred_requests_too_large"),
        (["x"], ["x"], "deferred_request_duplicate"),
        (["x", "x"], [], "deferred_request_duplicate"),
    ],
)
def test_build_pending_refuses_bad_shapes(approvals, calls, code):
    """S-89: 1–128 items, ids unique across both groups."""
    requests = DeferredToolRequests(approvals=[call(i) for i in approvals], calls=[call(i) for i in calls])
    with pytest.raises(PendingInvalid) as info:
        build_pending(requests)
    assert info.value.code == code


def test_exactly_128_items_is_allowed():
    """S-89: 128 items is the upper bound, inclusive."""
    requests = DeferredToolRequests(calls=[call(f"c{i}") for i in range(128)])
    assert len(build_pending(requests).calls) == 128


@pytest.mark.parametrize(
    "value",
    [
        {"approvals": [], "calls": []},
        {"approvals": [item("x", "approval")], "calls": [item("x", "external")]},
        {"approvals": [item("a", "external")], "calls": []},
        {"approvals": [], "calls": [item("a", "approval")]},
    ],
)
def test_stored_pending_is_validated(value):
    """S-89: a stored pending value that breaks the rules does not load."""
    with pytest.raises(ValidationError):
        Pending.model_validate(value)


PENDING = Pending(approvals=(item("a1", "approval"), item("a2", "approval")), calls=(item("c1", "external"),))


Differences = tuple[tuple[str, ...], tuple[str, ...]]  # (missing, unexpected)


def differing(*, approvals: Differences | None = None, calls: Differences | None = None) -> CoverageMismatch:
    groups: dict[Literal["approvals", "calls"], GroupMismatch] = {}
    if approvals is not None:
        groups["approvals"] = GroupMismatch(missing=approvals[0], unexpected=approvals[1])
    if calls is not None:
        groups["calls"] = GroupMismatch(missing=calls[0], unexpected=calls[1])
    return CoverageMismatch(groups=groups)


@pytest.mark.parametrize(
    ("approval_ids", "call_ids", "mismatch"),
    [
        ({"a1", "a2"}, {"c1"}, None),
        ({"a1"}, {"c1"}, differing(approvals=(("a2",), ()))),
        ({"a1", "a2", "zz"}, {"c1"}, differing(approvals=((), ("zz",)))),
        ({"a1", "a2"}, set(), differing(calls=(("c1",), ()))),
        ({"a1", "a2"}, {"c1", "c9"}, differing(calls=((), ("c9",)))),
        # wrong category: an approval answered in calls; both maps are reported
        ({"a1"}, {"c1", "a2"}, differing(approvals=(("a2",), ()), calls=((), ("a2",)))),
        (set(), set(), differing(approvals=(("a1", "a2"), ()), calls=(("c1",), ()))),
    ],
)
def test_coverage_mismatch(approval_ids, call_ids, mismatch):
    """S-78: a missing, extra or wrong-category id → 400 pending_coverage_mismatch with missing/unexpected of
    every differing map."""
    assert coverage_mismatch(PENDING, approval_ids, call_ids) == mismatch


def test_coverage_mismatch_details():
    """S-78: the error details name the field, the reason and both lists."""
    mismatch = coverage_mismatch(PENDING, {"a1", "x"}, {"c1"})
    assert mismatch is not None
    assert mismatch.details() == {
        "field": "approvals",
        "reason": "pending_coverage_mismatch",
        "missing": ["a2"],
        "unexpected": ["x"],
        "misplaced": [],
        "by_field": {"approvals": {"missing": ["a2"], "unexpected": ["x"]}},
    }
    both = coverage_mismatch(PENDING, {"a1", "c1"}, {"a2"})
    assert both is not None and both.details()["field"] == "body" and both.details()["misplaced"] == ["a2", "c1"]


_ids = st.sets(st.sampled_from(["a1", "a2", "a3", "c1", "c2", "zz"]))


@given(_ids, _ids, _ids, _ids)
def test_coverage_mismatch_property(pending_approvals, pending_calls, answered_approvals, answered_calls):
    """S-78: no mismatch ⇔ each map equals its group exactly; a mismatch reports exactly the set differences."""
    pending_calls = pending_calls - pending_approvals
    if not pending_approvals and not pending_calls:
        return
    pending = Pending(
        approvals=tuple(item(i, "approval") for i in sorted(pending_approvals)),
        calls=tuple(item(i, "external") for i in sorted(pending_calls)),
    )
    mismatch = coverage_mismatch(pending, answered_approvals, answered_calls)
    exact = answered_approvals == pending_approvals and answered_calls == pending_calls
    assert (mismatch is None) is exact
    if mismatch is not None:
        for name, expected, given_ids in (
            ("approvals", pending_approvals, answered_approvals),
            ("calls", pending_calls, answered_calls),
        ):
            group = mismatch.groups.get(name)  # type: ignore[call-overload]  # name is one of the two groups
            assert (group is None) is (expected == given_ids)
            if group is not None:
                assert set(group.missing) == expected - given_ids
                assert set(group.unexpected) == given_ids - expected


@pytest.mark.parametrize(
    ("approval_ids", "call_ids", "problem"),
    [
        ({"a"}, {"c"}, None),
        ({"a", "x"}, {"x"}, "overlap"),
        ({f"a{i}" for i in range(64)}, {f"c{i}" for i in range(64)}, None),
        ({f"a{i}" for i in range(64)}, {f"c{i}" for i in range(65)}, "too_many"),
    ],
)
def test_resume_shape(approval_ids, call_ids, problem):
    """S-79: an id in both maps or more than 128 results → 400."""
    assert resume_shape_problem(approval_ids, call_ids) == problem
