"""Building the strict resume batch (spec §8.6) from a waiting run's pending items — pure, no I/O.

A resume must answer every pending item and nothing else, or the service refuses it whole (400
`pending_coverage_mismatch`). `ResumeBatch` checks that locally before anything is sent: each answer names a
pending item of the right kind, and `body()` raises `IncompleteBatch` while an item has no answer.

    batch = ResumeBatch(run.pending)
    batch.approve("call_refund", arguments={"order_id": "A1", "amount": 40})   # approve with edited arguments
    batch.deny("call_delete", reason="not on a Friday")
    batch.answer("call_weather", "sunny")        # an external call or a question
    batch.fail("call_lookup", "the lookup service is down")
    client.resume(run.id, batch)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .errors import IncompleteBatch
from .models import PendingItem

__all__ = ("ResumeBatch",)


class ResumeBatch:
    """The answers to one waiting run; `body()` is the JSON of `POST /v1/runs/{id}/resume`."""

    def __init__(self, pending: Iterable[PendingItem]) -> None:
        self._pending = {item.tool_call_id: item for item in pending}
        self._answers: dict[str, dict[str, Any]] = {}
        self._input: dict[str, Any] | None = None

    @property
    def pending(self) -> list[PendingItem]:
        return list(self._pending.values())

    def missing(self) -> list[str]:
        """Pending ids without an answer yet."""
        return [call_id for call_id in self._pending if call_id not in self._answers]

    def approve(self, tool_call_id: str, *, arguments: Mapping[str, Any] | None = None) -> ResumeBatch:
        """Approve an approval item, optionally running the tool with edited `arguments` (a JSON object; the
        worker checks them against the tool's schema, `deferred_override_invalid` otherwise)."""
        self._item(tool_call_id, "approvals")
        answer: dict[str, Any] = {"action": "approve"}
        if arguments is not None:
            if not isinstance(arguments, Mapping) or not all(isinstance(key, str) for key in arguments):
                raise ValueError(f"{tool_call_id}: edited arguments must be a JSON object")
            answer["arguments"] = dict(arguments)
        self._answers[tool_call_id] = answer
        return self

    def deny(self, tool_call_id: str, *, reason: str | None = None) -> ResumeBatch:
        """Deny an approval item; `reason` is shown to the model (a default message without one)."""
        self._item(tool_call_id, "approvals")
        self._answers[tool_call_id] = {"action": "deny"} if reason is None else {"action": "deny", "reason": reason}
        return self

    def answer(self, tool_call_id: str, value: Any) -> ResumeBatch:
        """Answer an external call or a question with its result (any JSON value)."""
        self._item(tool_call_id, "calls")
        self._answers[tool_call_id] = {"status": "returned", "value": value}
        return self

    def fail(self, tool_call_id: str, message: str) -> ResumeBatch:
        """Answer an external call or a question with a failure the model sees as the tool's error."""
        self._item(tool_call_id, "calls")
        self._answers[tool_call_id] = {"status": "failed", "message": str(message)}
        return self

    def with_input(self, text: str) -> ResumeBatch:
        """A message to the agent sent with the answers (optional)."""
        self._input = {"content": [{"type": "text", "text": text}]}
        return self

    def body(self) -> dict[str, Any]:
        """The resume body; `IncompleteBatch` unless every pending item has an answer."""
        missing = self.missing()
        if missing:
            raise IncompleteBatch(missing)
        body: dict[str, Any] = {"approvals": {}, "calls": {}}
        for call_id, item in self._pending.items():
            body[item.group][call_id] = self._answers[call_id]
        if self._input is not None:
            body["input"] = self._input
        return body

    def _item(self, tool_call_id: str, group: str) -> PendingItem:
        item = self._pending.get(tool_call_id)
        if item is None:
            raise IncompleteBatch([], [tool_call_id])
        if item.group != group:
            verb = "approve or deny" if item.group == "approvals" else "answer or fail"
            raise ValueError(f"{tool_call_id} is a {item.kind} item: {verb} it")
        return item
