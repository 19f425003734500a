"""Runs under leases: claims, the fence, attempt start, lease renewal, the derived current checkpoint, and the
outbox rows a run transition stages in its own transaction.

This is the face code outside `store/` imports; modules inside `store/` import each other directly.
"""

from __future__ import annotations

from .claims import ClaimedRun, claim_runs, start_attempt
from .leases import HeartbeatFacts, read_authority, read_heartbeat_facts, renew_leases

__all__ = (
    "ClaimedRun",
    "HeartbeatFacts",
    "claim_runs",
    "read_authority",
    "read_heartbeat_facts",
    "renew_leases",
    "start_attempt",
)
