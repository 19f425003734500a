"""`recovered_calls`: which returns of a run's messages recovery produced (docs/state-and-resume.md; H-43)."""

from __future__ import annotations

from typing import Any

from pydantic_ai.messages import (
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)

from candor.service.protocol.recovered import RecoveredCall, recovered_calls
from candor.tools import unknown_outcome_result


def _json(*messages: Any) -> list[dict[str, Any]]:
    dumped: list[dict[str, Any]] = ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")
    return dumped


def _ret(call_id: str, metadata: Any) -> ToolReturnPart:
    return ToolReturnPart("t_" + call_id, "x", call_id, metadata=metadata)


def test_each_mark_maps_to_its_outcome_in_history_order() -> None:
    messages = _json(
        ModelResponse(parts=[ToolCallPart("t_a", {}, tool_call_id="a")]),
        ModelRequest(
            parts=[
                _ret("a", {"candor.recovery": "reconciled", "candor.call_key": "ck_1"}),
                _ret("b", {"candor.recovery": "rerun"}),
                unknown_outcome_result(ToolCallPart("t_c", {}, tool_call_id="c")),
                _ret("d", {"candor.recovery": "replayed", "tool's own": 1}),
            ]
        ),
        ModelResponse(parts=[TextPart("done")]),
    )
    assert recovered_calls(messages) == [
        RecoveredCall(tool_call_id="a", tool_name="t_a", outcome="reconciled"),
        RecoveredCall(tool_call_id="b", tool_name="t_b", outcome="rerun"),
        RecoveredCall(tool_call_id="c", tool_name="t_c", outcome="unknown"),
        RecoveredCall(tool_call_id="d", tool_name="t_d", outcome="replayed"),
    ]


def test_ordinary_and_foreign_returns_are_not_recovery() -> None:
    messages = _json(
        ModelRequest(
            parts=[
                _ret("a", None),
                _ret("b", {"candor.recovery": "something else"}),
                _ret("c", {"candor.unknown_outcome": "yes"}),  # only the boolean True marks it (H-43 shape)
                _ret("d", ["not", "a", "dict"]),
                _ret("e", {"pydantic_ai_synthesized_tool_return": True}),
            ]
        ),
    )
    assert recovered_calls(messages) == []
    assert recovered_calls([{"kind": "request", "parts": None}, {"kind": "response"}]) == []
