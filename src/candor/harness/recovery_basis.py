"""What each recovery decided and why, recorded in the `candor.recovery` namespace (docs/mcp.md).

The unknown-outcome result has a fixed shape (§3.10, H-43), so the reason a call was or was not re-run cannot
travel on the return itself. Each recovery that decides at least one call adds one entry per call to this
namespace: the action, the planner's reason, where the tool's retry-safety came from (`annotation`, `override`,
`decorator` or `none`) and whether the server now declares it differently from what the checkpoint recorded.
The service's run view reads it (`GET /v1/runs/{id}`, `recovery[]`). The namespace keeps the latest
`MAX_BASIS_ENTRIES` calls; it holds no arguments or results, and calls a recovery batch answered are left out: the
host's answers leave no trace in any namespace (H-95).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic_ai.tools import ToolDefinition

from .capability_store import _current_store
from .mcp_policy import DECLARATION_CHANGED_METADATA_KEY, RETRY_SAFE_SOURCE_METADATA_KEY
from .recovery import RecoveryDecision
from .recovery_tools import RECOVERY_RETRY_SAFE_METADATA_KEY

__all__ = (
    "RECOVERY_BASIS_NAMESPACE",
    "RECOVERY_BASIS_VERSION",
    "MAX_BASIS_ENTRIES",
    "basis_entry",
    "merged_basis",
    "record_recovery_basis",
)

RECOVERY_BASIS_NAMESPACE = "candor.recovery"
RECOVERY_BASIS_VERSION = "1"
MAX_BASIS_ENTRIES = 128
_SOURCES = frozenset({"annotation", "override", "decorator", "none"})
_BATCH_REASONS = frozenset({"accepted_answer", "accepted_denial"})
"""Calls the host's accepted batch answered (H-93): no recovery judgement, and no trace of the batch (H-95)."""


def basis_entry(decision: RecoveryDecision, tool_def: ToolDefinition | None) -> dict[str, Any]:
    """One call's entry: what recovery did and where its tool's retry-safety came from (None: tool gone, H-48).

    `candor.mcp` sets the source on the definitions it prepares; otherwise the retry-safe key means the decorator
    (or equivalent metadata, H-53) and its absence means no declaration.
    """
    metadata = (tool_def.metadata or {}) if tool_def is not None else {}
    source = metadata.get(RETRY_SAFE_SOURCE_METADATA_KEY)
    if source not in _SOURCES:
        source = "decorator" if metadata.get(RECOVERY_RETRY_SAFE_METADATA_KEY) is True else "none"
    return {
        "tool_name": decision.call.tool_name,
        "action": decision.action,
        "reason": decision.reason,
        "declared_by": source,
        "declaration_changed": metadata.get(DECLARATION_CHANGED_METADATA_KEY) is True,
    }


def merged_basis(
    previous: Any, entries: Iterable[tuple[str, dict[str, Any]]], *, limit: int = MAX_BASIS_ENTRIES
) -> dict[str, Any]:
    """The namespace data after adding `entries` (call id → entry) to `previous`: newest last, at most `limit`.

    A reused call id (H-81) takes the newer entry; data in another shape is replaced, never repaired.
    """
    calls: dict[str, Any] = {}
    if isinstance(previous, Mapping) and isinstance(previous.get("calls"), Mapping):
        calls.update(previous["calls"])
    for call_id, entry in entries:
        calls.pop(call_id, None)
        calls[call_id] = entry
    kept = list(calls.items())[-limit:]
    return {"calls": dict(kept)}


def record_recovery_basis(decisions: Iterable[RecoveryDecision], surface: Mapping[str, ToolDefinition]) -> None:
    """Add the decisions' entries to the active run's `candor.recovery` namespace (nothing outside a run)."""
    store = _current_store.get()
    entries = [
        (d.call.tool_call_id, basis_entry(d, surface.get(d.call.tool_name)))
        for d in decisions
        if d.reason not in _BATCH_REASONS
    ]
    if store is None or not entries:
        return
    raw = store._raw(RECOVERY_BASIS_NAMESPACE)
    previous = raw[1] if raw is not None and raw[0] == RECOVERY_BASIS_VERSION else None
    store._put(RECOVERY_BASIS_NAMESPACE, RECOVERY_BASIS_VERSION, merged_basis(previous, entries))
