"""The pending items of a waiting run (§5.7) and the strict resume that answers them (§8.6).

``build_pending`` turns the harness's ``DeferredToolRequests`` into ``runs.pending``; ``coverage_mismatch`` and
``resume_shape_problem`` are the pure resume checks; ``resume_body_to_results`` maps a stored resume body to the
pydantic-ai ``DeferredToolResults`` the successor's first attempt passes on.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator
from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import ToolCallPart

__all__ = (
    "MAX_PENDING_ITEMS",
    "PendingKind",
    "PendingCode",
    "PendingCall",
    "Pending",
    "PendingInvalid",
    "pending_problem",
    "build_pending",
    "WaitReason",
    "wait_reason",
    "CoverageMismatch",
    "coverage_mismatch",
    "resume_shape_problem",
    "resume_body_to_results",
)

MAX_PENDING_ITEMS: Final = 128
"""§5.7, S-79, S-89: at most 128 pending items (and so at most 128 resume results); ``candor.MAX_DEFERRED_ITEMS``."""

_RESERVED_METADATA_PREFIX: Final = "candor."

PendingKind = Literal["approval", "external", "question"]
WaitReason = Literal["multiple", "approval", "call"]
PendingCode = Literal["deferred_requests_empty", "deferred_requests_too_large", "deferred_request_duplicate"]


class PendingCall(BaseModel):
    """One item of ``runs.pending``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tool_call_id: str = Field(min_length=1)
    tool_name: str
    arguments: dict[str, JsonValue]
    """The call's arguments as a JSON object (``ToolCallPart.args_as_dict()``)."""
    kind: PendingKind
    metadata: dict[str, JsonValue]
    """The request metadata of this call, without keys starting with ``candor.``."""


class Pending(BaseModel):
    """``runs.pending``: approvals, and external calls plus questions (S-89)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    approvals: tuple[PendingCall, ...] = ()
    calls: tuple[PendingCall, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> Pending:
        if (code := pending_problem(self.approvals, self.calls)) is not None:
            raise ValueError(code)
        if any(item.kind != "approval" for item in self.approvals):
            raise ValueError("approvals may only hold items of kind 'approval'")
        if any(item.kind == "approval" for item in self.calls):
            raise ValueError("calls may only hold items of kind 'external' or 'question'")
        return self


class PendingInvalid(ValueError):
    """The deferred requests cannot become ``runs.pending``; ``code`` is the matching harness code (H-66, H-72)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def pending_problem(approvals: Sequence[PendingCall], calls: Sequence[PendingCall]) -> PendingCode | None:
    """S-89: 1–128 items with ids unique across both groups; the first violated rule, or ``None``."""
    ids = [item.tool_call_id for item in (*approvals, *calls)]
    if not ids:
        return "deferred_requests_empty"
    if len(ids) > MAX_PENDING_ITEMS:
        return "deferred_requests_too_large"
    if len(set(ids)) != len(ids):
        return "deferred_request_duplicate"
    return None


def build_pending(requests: DeferredToolRequests) -> Pending:
    """S-89, §5.7: ``runs.pending`` from the harness's deferred requests; raises ``PendingInvalid``."""
    try:
        approvals = tuple(_pending_call(requests, part) for part in requests.approvals)
        calls = tuple(_pending_call(requests, part) for part in requests.calls)
    except ValidationError as exc:
        raise PendingInvalid("deferred_request_invalid") from exc
    if (code := pending_problem(approvals, calls)) is not None:
        raise PendingInvalid(code)
    return Pending(approvals=approvals, calls=calls)


def _pending_call(requests: DeferredToolRequests, part: ToolCallPart) -> PendingCall:
    metadata = requests.metadata.get(part.tool_call_id) or {}
    return PendingCall(
        tool_call_id=part.tool_call_id,
        tool_name=part.tool_name,
        arguments=part.args_as_dict(),
        kind=requests.kind(part.tool_call_id),
        metadata={k: v for k, v in metadata.items() if not k.startswith(_RESERVED_METADATA_PREFIX)},
    )


def wait_reason(pending: Pending) -> WaitReason:
    """S-89: ``multiple`` when both groups are non-empty, else ``approval`` or ``call``."""
    if pending.approvals and pending.calls:
        return "multiple"
    if pending.approvals:
        return "approval"
    if pending.calls:
        return "call"
    raise ValueError("a waiting run has at least one pending item")


@dataclass(frozen=True, kw_only=True, slots=True)
class CoverageMismatch:
    """S-78: a resume map whose key set differs from its pending group (→ 400 ``invalid_argument``)."""

    field: Literal["approvals", "calls"]
    missing: tuple[str, ...]
    """Pending ids of the group that the map does not answer, sorted."""
    unexpected: tuple[str, ...]
    """Ids in the map that are not pending in the group, sorted."""

    def details(self) -> dict[str, Any]:
        """The error ``details`` of §8.6 step 5."""
        return {
            "field": self.field,
            "reason": "pending_coverage_mismatch",
            "missing": list(self.missing),
            "unexpected": list(self.unexpected),
        }


def coverage_mismatch(
    pending: Pending, body_approval_ids: Collection[str], body_call_ids: Collection[str]
) -> CoverageMismatch | None:
    """S-78, §8.6 step 5: each map must answer exactly its pending group; approvals are checked first."""
    groups: tuple[tuple[Literal["approvals", "calls"], Sequence[PendingCall], Collection[str]], ...] = (
        ("approvals", pending.approvals, body_approval_ids),
        ("calls", pending.calls, body_call_ids),
    )
    for name, items, answered in groups:
        expected = {item.tool_call_id for item in items}
        given = set(answered)
        if expected != given:
            return CoverageMismatch(
                field=name, missing=tuple(sorted(expected - given)), unexpected=tuple(sorted(given - expected))
            )
    return None


def resume_shape_problem(
    body_approval_ids: Collection[str], body_call_ids: Collection[str]
) -> Literal["overlap", "too_many"] | None:
    """S-79, §8.6 step 1: no id in both maps, and at most 128 results."""
    if set(body_approval_ids) & set(body_call_ids):
        return "overlap"
    if len(body_approval_ids) + len(body_call_ids) > MAX_PENDING_ITEMS:
        return "too_many"
    return None


def resume_body_to_results(body: Mapping[str, Any]) -> DeferredToolResults:
    """S-132, §8.6: ``approve`` → ``ToolApproved()`` (``ToolApproved(override_args=arguments)`` with edited
    arguments), ``deny`` → ``ToolDenied(reason or default)``,
    ``returned`` → the plain value, ``failed`` → ``ToolFailed(message)``. Raises ``ValueError`` on other shapes."""
    results = DeferredToolResults()
    for call_id, answer in _mapping(body, "approvals").items():
        match answer:
            case {"action": "approve"}:
                results.approvals[call_id] = _approval(call_id, answer.get("arguments"))
            case {"action": "deny"}:
                results.approvals[call_id] = _denial(call_id, answer.get("reason"))
            case _:
                raise ValueError(f"approval {call_id!r}: expected action 'approve' or 'deny'")
    for call_id, answer in _mapping(body, "calls").items():
        match answer:
            case {"status": "returned", "value": value}:
                results.calls[call_id] = value
            case {"status": "failed", "message": str(message)}:
                results.calls[call_id] = ToolFailed(message)
            case _:
                raise ValueError(f"call {call_id!r}: expected status 'returned' with value or 'failed' with message")
    return results


def _approval(call_id: str, arguments: object) -> ToolApproved:
    # Edited arguments (an issue-13 addition to §8.6) become pydantic-ai's `override_args`.
    if arguments is None:
        return ToolApproved()
    if not isinstance(arguments, Mapping) or not all(isinstance(key, str) for key in arguments):
        raise ValueError(f"approval {call_id!r}: arguments must be a JSON object")
    return ToolApproved(override_args=dict(arguments))


def _denial(call_id: str, reason: object) -> ToolDenied:
    # An absent, null or empty reason gets pydantic-ai's default denial message.
    if reason is None or reason == "":
        return ToolDenied()
    if not isinstance(reason, str):
        raise ValueError(f"approval {call_id!r}: reason must be text")
    return ToolDenied(reason)


def _mapping(body: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = body.get(key)
    if not isinstance(value, Mapping):
        raise ValueError(f"resume body needs the {key!r} map")
    return value
