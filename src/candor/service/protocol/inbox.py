"""Inbox decisions (§8.5): which pending steer entries a commit hands to the active run (§7.8 step 6), whether a
change fits the inbox limits (S-73), who may edit or withdraw an entry in which status (S-74), and how a reorder
renumbers the pending entries (S-74)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from .json_types import JsonObject

__all__ = (
    "SteerCandidate",
    "SteerBatch",
    "is_steer_compatible",
    "select_steer_batch",
    "inbox_would_overflow",
    "EntryChangeRefusal",
    "entry_change_refusal",
    "OrderMismatch",
    "order_mismatch",
    "reordered_positions",
)


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


def inbox_would_overflow(
    *, count: int, size: int, added_count: int, added_bytes: int, count_limit: int, bytes_limit: int
) -> bool:
    """S-73: whether a change adding `added_count` entries and `added_bytes` bytes to a thread whose pending plus
    assigned entries are `count` entries of `size` bytes exceeds a limit. A change that adds no entries (or no
    bytes) never fails that limit, so an edit that shrinks an entry stays possible after the limits were lowered."""
    over_count = added_count > 0 and count + added_count > count_limit
    over_bytes = added_bytes > 0 and size + added_bytes > bytes_limit
    return over_count or over_bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class EntryChangeRefusal:
    """Why an entry may not be edited or withdrawn: → 403 `forbidden`, or 409 `conflict` with `reason`."""

    kind: Literal["not_submitter", "not_pending"]
    reason: str
    """`not_submitter`, or `entry_<status>` (§12.2)."""


def entry_change_refusal(*, status: str, submitter_id: str | None, caller_id: str) -> EntryChangeRefusal | None:
    """S-74: only the submitter may edit or withdraw an entry, and only while it is `pending`.

    The submitter is checked first, like every permission before state (§8.2); an entry without one (a child
    result) has no submitter, so nobody may change it.
    """
    if submitter_id is None or submitter_id != caller_id:
        return EntryChangeRefusal(kind="not_submitter", reason="not_submitter")
    if status != "pending":
        return EntryChangeRefusal(kind="not_pending", reason=f"entry_{status}")
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class OrderMismatch:
    """S-74: a reorder list that is not exactly the pending entries (→ 400 `invalid_argument`)."""

    missing: tuple[str, ...]
    """Pending entries the list leaves out, in position order."""
    unexpected: tuple[str, ...]
    """Listed ids that are not pending entries of the thread, in list order."""
    duplicated: tuple[str, ...]
    """Ids listed more than once, in list order."""

    def details(self) -> JsonObject:
        """The error `details`, naming entry ids only (as the resume coverage error does, §8.6 step 5)."""
        return {
            "field": "entry_ids",
            "reason": "inbox_order_mismatch",
            "missing": list(self.missing),
            "unexpected": list(self.unexpected),
            "duplicated": list(self.duplicated),
        }


def order_mismatch(pending_ids: Sequence[str], listed_ids: Sequence[str]) -> OrderMismatch | None:
    """S-74: `listed_ids` must name every pending entry exactly once and nothing else."""
    pending = set(pending_ids)
    listed = set(listed_ids)
    duplicated = tuple(i for i, n in Counter(listed_ids).items() if n > 1)
    missing = tuple(i for i in pending_ids if i not in listed)
    unexpected = tuple(dict.fromkeys(i for i in listed_ids if i not in pending))
    if missing or unexpected or duplicated:
        return OrderMismatch(missing=missing, unexpected=unexpected, duplicated=duplicated)
    return None


def reordered_positions(pending: Sequence[tuple[str, int]], order: Sequence[str]) -> tuple[tuple[str, int], ...]:
    """The `(entry_id, position)` moves that put the pending entries in `order` (S-74).

    The pending entries keep the set of positions they hold, handed out in the new order: other entries of the
    thread keep theirs, so positions stay positive and unique per thread. Only entries whose position changes are
    returned. `order` must be a permutation of the pending ids (`order_mismatch` is `None`).
    """
    if sorted(order) != sorted(entry_id for entry_id, _ in pending):
        raise ValueError("order must list exactly the pending entries")
    current = dict(pending)
    slots = sorted(current.values())
    return tuple((entry_id, slot) for entry_id, slot in zip(order, slots, strict=True) if current[entry_id] != slot)
