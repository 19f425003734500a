"""Which tool calls a run closed by recovery, read from the messages it added (pydantic-ai message JSON).

The harness marks what recovery did on the return it records (docs/state-and-resume.md): `candor.recovery` is
"replayed" (a retry-safe call ran again), "reconciled" (the tool's reconciler confirmed the effect), "rerun" (the
reconciler said the effect had not happened, so the call ran again); `candor.unknown_outcome` marks the
unknown-outcome result. Nothing else counts, so an ordinary return never shows up here.

Why recovery did what it did is in the checkpoint's `candor.recovery` namespace (harness/recovery_basis.py; the
unknown-outcome result's shape is fixed, H-43): `with_basis` adds it to the calls found in the messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from candor.tools import RECOVERY_METADATA_KEY, UNKNOWN_OUTCOME_METADATA_KEY

__all__ = ("RecoveredCall", "RecoveryOutcome", "recovered_calls", "with_basis", "DECLARATION_SOURCES")

RecoveryOutcome = Literal["replayed", "reconciled", "rerun", "unknown"]
_TAGGED: frozenset[str] = frozenset({"replayed", "reconciled", "rerun"})
DECLARATION_SOURCES: frozenset[str] = frozenset({"annotation", "override", "decorator", "none"})


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveredCall:
    tool_call_id: str
    tool_name: str
    outcome: RecoveryOutcome
    reason: str | None = None
    """The planner's reason (`retry_safe`, `not_retry_safe`, `mode_never`, …); None when not recorded."""
    declared_by: str | None = None
    """Where the tool's retry-safety came from: `annotation`, `override`, `decorator` or `none`."""
    declaration_changed: bool | None = None
    """Whether the MCP server declared the tool differently when recovery ran than when the call was made."""


def recovered_calls(messages: Iterable[Mapping[str, object]]) -> list[RecoveredCall]:
    """The recovered calls, in history order, from message JSON (`ModelMessagesTypeAdapter` dumps)."""
    found: list[RecoveredCall] = []
    for message in messages:
        if message.get("kind") != "request":
            continue
        parts = message.get("parts")
        for part in parts if isinstance(parts, list) else ():
            outcome = _outcome(part) if isinstance(part, Mapping) else None
            if outcome is not None:
                found.append(
                    RecoveredCall(
                        tool_call_id=str(part.get("tool_call_id")),
                        tool_name=str(part.get("tool_name")),
                        outcome=outcome,
                    )
                )
    return found


def _outcome(part: Mapping[str, object]) -> RecoveryOutcome | None:
    if part.get("part_kind") != "tool-return":
        return None
    metadata = part.get("metadata")
    if not isinstance(metadata, Mapping):
        return None
    if metadata.get(UNKNOWN_OUTCOME_METADATA_KEY) is True:
        return "unknown"
    tag = metadata.get(RECOVERY_METADATA_KEY)
    return tag if isinstance(tag, str) and tag in _TAGGED else None  # type: ignore[return-value]


def with_basis(calls: list[RecoveredCall], basis: object) -> list[RecoveredCall]:
    """`calls` with the entries of a `candor.recovery` namespace's data (`{"calls": {id: entry}}`) added by call id.

    An entry for another tool name (a reused id, H-81) or in another shape is ignored: the call keeps None fields.
    """
    entries = basis.get("calls") if isinstance(basis, Mapping) else None
    if not isinstance(entries, Mapping):
        return calls
    found: list[RecoveredCall] = []
    for call in calls:
        entry = entries.get(call.tool_call_id)
        if not isinstance(entry, Mapping) or entry.get("tool_name") != call.tool_name:
            found.append(call)
            continue
        reason, source, changed = entry.get("reason"), entry.get("declared_by"), entry.get("declaration_changed")
        found.append(
            replace(
                call,
                reason=reason if isinstance(reason, str) else None,
                declared_by=source if source in DECLARATION_SOURCES else None,
                declaration_changed=changed if isinstance(changed, bool) else None,
            )
        )
    return found
