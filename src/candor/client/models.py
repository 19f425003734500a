"""What the client returns: thin typed views over the API's JSON (spec §8.4), keeping the raw JSON in `.raw`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ("TERMINAL_STATUSES", "PendingItem", "RecoveredCall", "Run", "Accepted", "Page")

TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})
"""A run in one of these never changes again; `waiting` is sealed too but ends when a resume answers it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PendingItem:
    """§5.7: one call a waiting run waits on. `kind` is `approval` (answered in `approvals`), `external` or
    `question` (answered in `calls`)."""

    tool_call_id: str
    tool_name: str
    arguments: dict[str, Any]
    kind: Literal["approval", "external", "question"]
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def group(self) -> Literal["approvals", "calls"]:
        """The resume map that answers this item."""
        return "approvals" if self.kind == "approval" else "calls"

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> PendingItem:
        return cls(
            tool_call_id=raw["tool_call_id"],
            tool_name=raw["tool_name"],
            arguments=dict(raw["arguments"]),
            kind=raw["kind"],
            metadata=dict(raw.get("metadata") or {}),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class RecoveredCall:
    """A tool call that recovery closed when an attempt continued from a checkpoint with unanswered calls.
    `outcome`: `replayed` (a retry-safe call ran again), `reconciled` (its reconciler confirmed the effect),
    `rerun` (its reconciler said the effect had not happened; the call ran again) or `unknown` (the call got the
    unknown-outcome result: it may or may not have taken effect)."""

    tool_call_id: str
    tool_name: str
    outcome: Literal["replayed", "reconciled", "rerun", "unknown"]

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> RecoveredCall:
        return cls(tool_call_id=raw["tool_call_id"], tool_name=raw["tool_name"], outcome=raw["outcome"])


@dataclass(frozen=True, kw_only=True, slots=True)
class Run:
    """A RunView. `pending` lists approvals first, then calls, as the run holds them."""

    id: str
    thread_id: str
    agent: str
    principal_id: str | None
    """The API key the run acts for (None from a server older than this field)."""
    status: str
    wait_reason: str | None
    pending: tuple[PendingItem, ...]
    output: Any
    failure: dict[str, Any] | None
    parent_run_id: str | None
    tool_recovery: Literal["declared", "never", "always"] | None
    """What a recovering attempt does with unanswered tool calls, fixed at acceptance (None from a server older
    than this field)."""
    recovery: tuple[RecoveredCall, ...] | None
    """The calls recovery closed, in history order: filled by `get_run` and `wait_for_run`; None from a run list,
    which does not carry them."""
    version: int
    raw: dict[str, Any]

    @property
    def sealed(self) -> bool:
        """Completed, failed, cancelled or waiting: the worker is done with it."""
        return self.status in TERMINAL_STATUSES or self.status == "waiting"

    @property
    def etag(self) -> str:
        return f'"{self.id}:{self.version}"'

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Run:
        pending = raw.get("pending") or {}
        items = [*(pending.get("approvals") or ()), *(pending.get("calls") or ())]
        return cls(
            id=raw["id"],
            thread_id=raw["thread_id"],
            agent=raw["agent"],
            principal_id=raw.get("principal_id"),
            status=raw["status"],
            wait_reason=raw.get("wait_reason"),
            pending=tuple(PendingItem.of(item) for item in items),
            output=raw.get("output"),
            failure=raw.get("failure"),
            parent_run_id=raw.get("parent_run_id"),
            tool_recovery=raw.get("tool_recovery"),
            recovery=None if raw.get("recovery") is None else tuple(RecoveredCall.of(c) for c in raw["recovery"]),
            version=raw["version"],
            raw=dict(raw),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Accepted:
    """What creating a thread or posting a message answered: the thread, the entry and the run it started
    (None while the entry waits in the inbox). `created` is False for a replay (200)."""

    thread: dict[str, Any]
    entry: dict[str, Any]
    run: Run | None
    created: bool

    @property
    def thread_id(self) -> str:
        return str(self.thread["id"])

    @classmethod
    def of(cls, raw: Mapping[str, Any], *, created: bool) -> Accepted:
        run = raw.get("run")
        return cls(
            thread=dict(raw["thread"]),
            entry=dict(raw["entry"]),
            run=None if run is None else Run.of(run),
            created=created,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Page:
    """One page of a list; pass `next_cursor` back for the next (None on the last page)."""

    items: list[Any]
    next_cursor: str | None
