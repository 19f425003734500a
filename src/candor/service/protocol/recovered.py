"""Which tool calls a run closed by recovery, read from the messages it added (pydantic-ai message JSON).

The harness marks what recovery did on the return it records (docs/state-and-resume.md): `candor.recovery` is
"replayed" (a retry-safe call ran again), "reconciled" (the tool's reconciler confirmed the effect), "rerun" (the
reconciler said the effect had not happened, so the call ran again); `candor.unknown_outcome` marks the
unknown-outcome result. Nothing else counts, so an ordinary return never shows up here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from candor.tools import RECOVERY_METADATA_KEY, UNKNOWN_OUTCOME_METADATA_KEY

__all__ = ("RecoveredCall", "RecoveryOutcome", "recovered_calls")

RecoveryOutcome = Literal["replayed", "reconciled", "rerun", "unknown"]
_TAGGED: frozenset[str] = frozenset({"replayed", "reconciled", "rerun"})


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveredCall:
    tool_call_id: str
    tool_name: str
    outcome: RecoveryOutcome


def recovered_calls(messages: Iterable[Mapping[str, Any]]) -> list[RecoveredCall]:
    """The recovered calls, in history order, from message JSON (`ModelMessagesTypeAdapter` dumps)."""
    found: list[RecoveredCall] = []
    for message in messages:
        if message.get("kind") != "request":
            continue
        for part in message.get("parts") or ():
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


def _outcome(part: Mapping[str, Any]) -> RecoveryOutcome | None:
    if part.get("part_kind") != "tool-return":
        return None
    metadata = part.get("metadata")
    if not isinstance(metadata, Mapping):
        return None
    if metadata.get(UNKNOWN_OUTCOME_METADATA_KEY) is True:
        return "unknown"
    tag = metadata.get(RECOVERY_METADATA_KEY)
    return tag if isinstance(tag, str) and tag in _TAGGED else None  # type: ignore[return-value]
