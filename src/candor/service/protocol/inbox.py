"""Which pending steer entries a commit hands to the active run (§7.8 step 6, §8.5)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ("SteerCandidate", "SteerBatch", "is_steer_compatible", "select_steer_batch")


@dataclass(frozen=True, kw_only=True, slots=True)
class SteerCandidate:
    """A ``pending`` entry with ``delivery = steer`` on the run's thread."""

    entry_id: str
    position: int
    size: int
    """``inbox_entries.size`` in bytes."""
    agent: str | None = None
    """The agent the entry explicitly names, ``None`` when omitted."""
    options_digest: str | None = None
    """The digest of the entry's options, ``None`` when options were omitted."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SteerBatch:
    """The entries to mark ``assigned`` to the run in this commit, in position order."""

    entry_ids: tuple[str, ...]
    size: int
    """Total bytes of the batch (≤ ``worker.delivery_bytes``)."""


def is_steer_compatible(
    *, entry_agent: str | None, entry_options_digest: str | None, run_agent: str, run_options_digest: str
) -> bool:
    """S-66, S-68: same agent (or none named) and same options digest (or options omitted)."""
    agent_ok = entry_agent is None or entry_agent == run_agent
    options_ok = entry_options_digest is None or entry_options_digest == run_options_digest
    return agent_ok and options_ok


def select_steer_batch(
    candidates: Iterable[SteerCandidate],
    *,
    run_agent: str,
    run_options_digest: str,
    delivery_count: int,
    delivery_bytes: int,
) -> SteerBatch:
    """S-66, S-67: the FIFO batch of compatible entries, at most ``delivery_count`` entries and ``delivery_bytes``.

    Entries are taken in position order. Incompatible entries are skipped (they wait for a run of their own);
    the batch stops at the first compatible entry that would exceed either limit, so no later entry overtakes it.
    """
    if delivery_count < 1 or delivery_bytes < 1:
        raise ValueError("delivery limits must be ≥ 1")
    chosen: list[str] = []
    total = 0
    for entry in sorted(candidates, key=lambda c: c.position):
        compatible = is_steer_compatible(
            entry_agent=entry.agent,
            entry_options_digest=entry.options_digest,
            run_agent=run_agent,
            run_options_digest=run_options_digest,
        )
        if not compatible:
            continue
        if len(chosen) + 1 > delivery_count or total + entry.size > delivery_bytes:
            break
        chosen.append(entry.entry_id)
        total += entry.size
    return SteerBatch(entry_ids=tuple(chosen), size=total)
