"""The pure decisions behind MCP recovery (issue 36): annotations → declaration, declaration + overrides + decorator
→ retry-safety and its source, the recovery basis entries, the recorded tool list, and which errors mean a tool
server is unreachable."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from mcp.shared.exceptions import MCPError
from pydantic_ai.exceptions import ModelRetry
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tools import ToolDefinition

from candor.harness._agent_glue import classify_agent_exception
from candor.harness.mcp_policy import (
    ToolDeclaration,
    ToolServerUnavailable,
    check_overrides,
    declaration_from_annotations,
    declarations_from_record,
    judge_retry_safety,
    recorded_tools_data,
)
from candor.harness.recovery import Action, Reason, RecoveryDecision
from candor.harness.recovery_basis import basis_entry, merged_basis
from candor.mcp import is_connection_failure

RO, IDEM, DESTR = "readOnlyHint", "idempotentHint", "destructiveHint"


@pytest.mark.parametrize(
    ("annotations", "retry_safe"),
    [
        ({RO: True}, True),
        ({IDEM: True}, True),
        ({IDEM: True, DESTR: False}, True),
        ({RO: True, IDEM: True}, True),
        ({IDEM: True, DESTR: True}, False),
        ({RO: True, DESTR: True}, False),
        ({DESTR: True}, False),
        ({}, False),
        (None, False),
        ({RO: False, IDEM: False}, False),
        ({RO: 1, IDEM: "true"}, False),  # only the boolean true counts, as for the decorator (H-51)
        ({RO: None}, False),
        ("readOnly", False),  # not an object at all
    ],
)
def test_annotations_declare_retry_safety(annotations: object, retry_safe: bool) -> None:
    """H-51, issue 36 item 1: readOnlyHint or idempotentHint true, and destructiveHint not true."""
    assert declaration_from_annotations(annotations).retry_safe is retry_safe  # type: ignore[arg-type]  # non-mappings too


SAFE = ToolDeclaration(read_only=True)
UNSAFE = ToolDeclaration()


@pytest.mark.parametrize(
    ("declaration", "retry_safe", "never_retry", "decorated", "expected"),
    [
        (SAFE, set(), set(), False, (True, "annotation")),
        (UNSAFE, set(), set(), False, (False, "none")),
        (None, set(), set(), False, (False, "none")),  # not an MCP tool, not decorated
        (None, set(), set(), True, (True, "decorator")),
        (UNSAFE, set(), set(), True, (True, "decorator")),
        (UNSAFE, {"t"}, set(), False, (True, "override")),
        (SAFE, set(), {"t"}, False, (False, "override")),
        (SAFE, set(), {"t"}, True, (False, "override")),  # never_retry wins over the decorator too
        (UNSAFE, {"other"}, {"another"}, False, (False, "none")),  # overrides name other tools
    ],
)
def test_judge_retry_safety(
    declaration: ToolDeclaration | None,
    retry_safe: set[str],
    never_retry: set[str],
    decorated: bool,
    expected: tuple[bool, str],
) -> None:
    """H-46, H-53, issue 36 item 1: never_retry > retry_safe > decorator > annotations > nothing."""
    safety = judge_retry_safety(
        "t", declaration, retry_safe=frozenset(retry_safe), never_retry=frozenset(never_retry), decorated=decorated
    )
    assert (safety.retry_safe, safety.source) == expected


@pytest.mark.parametrize(
    ("retry_safe", "never_retry", "problem"),
    [
        (["a"], ["b"], None),
        ([], [], None),
        (["a", "b"], ["b"], "both retry_safe and never_retry: b"),
        ([""], [], "non-empty"),
    ],
)
def test_check_overrides(retry_safe: list[str], never_retry: list[str], problem: str | None) -> None:
    """Issue 36 item 1: a tool cannot be both; names are non-empty."""
    if problem is None:
        assert check_overrides(retry_safe, never_retry) == (frozenset(retry_safe), frozenset(never_retry))
    else:
        with pytest.raises(ValueError, match=problem):
            check_overrides(retry_safe, never_retry)


def test_the_recorded_tool_list_round_trips_and_tolerates_other_shapes() -> None:
    """Issue 36 item 2: names and the three hints only; data in another shape reads as no record."""
    declarations = {"b": ToolDeclaration(idempotent=True, destructive=True), "a": SAFE}
    data = recorded_tools_data(declarations)
    assert list(data["tools"]) == ["a", "b"]
    assert data["tools"]["a"] == {"readOnlyHint": True, "idempotentHint": False, "destructiveHint": False}
    assert declarations_from_record(data) == declarations
    others: list[object] = [None, [], {"tools": []}, {"tool": {}}]
    for other in others:
        assert declarations_from_record(other) == {}


def _decision(action: Action, reason: Reason) -> RecoveryDecision:
    return RecoveryDecision(call=ToolCallPart("t", {}, tool_call_id="c1"), action=action, reason=reason)


@pytest.mark.parametrize(
    ("metadata", "declared_by", "changed"),
    [
        ({"candor.retry_safe_source": "annotation", "candor.recovery_retry_safe": True}, "annotation", False),
        ({"candor.retry_safe_source": "override", "candor.declaration_changed": True}, "override", True),
        ({"candor.recovery_retry_safe": True}, "decorator", False),  # recovery_retryable or equivalent (H-53)
        ({"candor.recovery_retry_safe": 1}, "none", False),  # H-51
        ({}, "none", False),
        (None, "none", False),
        ({"candor.retry_safe_source": "gossip"}, "none", False),  # unknown sources are not repeated
    ],
)
def test_basis_entry_says_where_the_declaration_came_from(
    metadata: dict[str, Any] | None, declared_by: str, changed: bool
) -> None:
    """Issue 36 item 1: the run view's source of each recovery decision."""
    tool_def = ToolDefinition(name="t", metadata=metadata)
    entry = basis_entry(_decision("replay", "retry_safe"), tool_def)
    assert entry == {
        "tool_name": "t",
        "action": "replay",
        "reason": "retry_safe",
        "declared_by": declared_by,
        "declaration_changed": changed,
    }


def test_basis_entry_for_a_tool_that_is_gone() -> None:
    """H-48: the tool left the surface; no declaration."""
    entry = basis_entry(_decision("unknown_outcome", "tool_missing"), None)
    assert (entry["declared_by"], entry["reason"]) == ("none", "tool_missing")


def test_merged_basis_keeps_the_newest_entries() -> None:
    """Issue 36 item 1: entries accumulate across recoveries, a reused id (H-81) takes the newer entry, at most
    `limit` are kept, and data in another shape is replaced."""
    merged = merged_basis(None, [("a", {"n": 1}), ("b", {"n": 2})])
    merged = merged_basis(merged, [("a", {"n": 3}), ("c", {"n": 4})], limit=3)
    assert list(merged["calls"].items()) == [("b", {"n": 2}), ("a", {"n": 3}), ("c", {"n": 4})]
    assert merged_basis(merged, [("d", {"n": 5})], limit=2)["calls"] == {"c": {"n": 4}, "d": {"n": 5}}
    assert merged_basis(["junk"], [("a", {})]) == {"calls": {"a": {}}}


def _caused(exc: BaseException, cause: BaseException) -> BaseException:
    exc.__cause__ = cause
    return exc


@pytest.mark.parametrize(
    ("exc", "unreachable"),
    [
        (ConnectionRefusedError(), True),
        (RuntimeError("Client failed to connect: All connection attempts failed"), True),
        (_caused(RuntimeError("wrapped"), httpx.ConnectError("refused")), True),
        (MCPError(-32000, "Connection closed"), True),
        (MCPError(-32001, "Request timed out"), True),
        (_caused(ModelRetry("Connection closed"), MCPError(-32000, "Connection closed")), True),
        (ExceptionGroup("g", [ValueError("x"), BrokenPipeError()]), True),
        (MCPError(-32602, "Invalid params"), False),  # the server answered
        (ModelRetry("bad argument"), False),
        (ValueError("tool bug"), False),
        (RuntimeError("something else"), False),
        (None, False),
    ],
)
def test_is_connection_failure(exc: BaseException | None, unreachable: bool) -> None:
    """Issue 36 item 3: only errors that say the server could not be reached, or the call lost it, count."""
    assert is_connection_failure(exc) is unreachable


def test_cause_chains_that_loop_end() -> None:
    """A cause cycle is walked a bounded number of steps."""
    first, second = ValueError("a"), ValueError("b")
    first.__cause__, second.__cause__ = second, first
    assert is_connection_failure(first) is False


def test_an_unreachable_server_is_a_transient_tool_unavailable_failure() -> None:
    """H-31, issue 36 item 3: `tool_unavailable`, retry_hint new_run, details name the server and the stage only."""
    failure = classify_agent_exception(ToolServerUnavailable("crm", "connect"))
    assert (failure.code, failure.retry_hint) == ("tool_unavailable", "new_run")
    assert failure.details == {"error_type": "ToolServerUnavailable", "server": "crm", "stage": "connect"}
    assert classify_agent_exception(TimeoutError()).code == "agent_run_failed"  # a tool's own timeout
