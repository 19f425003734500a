"""The pending items of a waiting run (§5.7) and the strict resume that answers them (§8.6).

``build_pending`` turns the harness's ``DeferredToolRequests`` into ``runs.pending``; ``coverage_mismatch`` and
``resume_shape_problem`` are the pure resume checks; the answers themselves are ``protocol.resume.ResumeAnswers``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator
from pydantic_ai import DeferredToolRequests
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
    "GroupMismatch",
    "coverage_mismatch",
    "resume_shape_problem",
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


def _pending_call(requests: DeferredToolRequests, part: ToolCallPart[object]) -> PendingCall:
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
class GroupMismatch:
    """How one resume map differs from its pending group."""

    missing: tuple[str, ...]
    """Pending ids of the group that the map does not answer, sorted."""
    unexpected: tuple[str, ...]
    """Ids in the map that are not pending in the group, sorted."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CoverageMismatch:
    """S-78: resume maps whose key sets differ from their pending groups (→ 400 ``invalid_argument``); every
    differing group is reported at once, so one corrected request can succeed."""

    groups: Mapping[Literal["approvals", "calls"], GroupMismatch]
    """Only the groups that differ, approvals first."""

    @property
    def field(self) -> str:
        """`approvals` or `calls` when one map differs, `body` when both do."""
        return next(iter(self.groups)) if len(self.groups) == 1 else "body"

    @property
    def misplaced(self) -> tuple[str, ...]:
        """Ids answered in the other map than the one their pending group belongs to, sorted."""
        missing = {id_ for group in self.groups.values() for id_ in group.missing}
        unexpected = {id_ for group in self.groups.values() for id_ in group.unexpected}
        return tuple(sorted(missing & unexpected))

    def details(self) -> dict[str, object]:
        """The error ``details`` of §8.6 step 5: `missing` and `unexpected` over both maps, `misplaced`, and the
        same per map in `by_field`."""
        return {
            "field": self.field,
            "reason": "pending_coverage_mismatch",
            "missing": sorted(id_ for group in self.groups.values() for id_ in group.missing),
            "unexpected": sorted(id_ for group in self.groups.values() for id_ in group.unexpected),
            "misplaced": list(self.misplaced),
            "by_field": {
                name: {"missing": list(group.missing), "unexpected": list(group.unexpected)}
                for name, group in self.groups.items()
            },
        }


def coverage_mismatch(
    pending: Pending, body_approval_ids: Collection[str], body_call_ids: Collection[str]
) -> CoverageMismatch | None:
    """S-78, §8.6 step 5: each map must answer exactly its pending group; every differing map is reported."""
    groups: tuple[tuple[Literal["approvals", "calls"], Sequence[PendingCall], Collection[str]], ...] = (
        ("approvals", pending.approvals, body_approval_ids),
        ("calls", pending.calls, body_call_ids),
    )
    differing: dict[Literal["approvals", "calls"], GroupMismatch] = {}
    for name, items, answered in groups:
        expected = {item.tool_call_id for item in items}
        given = set(answered)
        if expected != given:
            differing[name] = GroupMismatch(
                missing=tuple(sorted(expected - given)), unexpected=tuple(sorted(given - expected))
            )
    return CoverageMismatch(groups=differing) if differing else None


def resume_shape_problem(
    body_approval_ids: Collection[str], body_call_ids: Collection[str]
) -> Literal["overlap", "too_many"] | None:
    """S-79, §8.6 step 1: no id in both maps, and at most 128 results."""
    if set(body_approval_ids) & set(body_call_ids):
        return "overlap"
    if len(body_approval_ids) + len(body_call_ids) > MAX_PENDING_ITEMS:
        return "too_many"
    return None
