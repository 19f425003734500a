"""Leases and the fence predicate that every execution-dependent write must pass (§7.3, §7.4).

Two clocks appear here. Fence, renewal and expiry checks compare database timestamps (``datetime``, read after the
locks are taken). The local deadline of §7.4 steps 3–4 is kept on the worker's own monotonic clock (``float``
seconds), because it must hold even when the database cannot be reached.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final, Literal

from .canonical import sha256_hex
from .transitions import AttemptStatus, RunStatus, is_attempt_live

__all__ = (
    "LEASE_TOKEN_BYTES",
    "Lease",
    "new_lease_token",
    "hash_lease_token",
    "lease_expiry",
    "FenceSnapshot",
    "FenceReason",
    "FenceVerdict",
    "check_fence",
    "should_renew",
    "is_renewable",
    "is_expired_for_recovery",
    "local_deadline",
    "local_deadline_reached",
    "renewal_due_locally",
    "may_start_fenced_write",
)

LEASE_TOKEN_BYTES: Final = 32
"""§7.2: a fresh 32-byte random token per claim."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Lease:
    """What a worker holds for one claimed attempt; the token exists only in worker memory (§7.3)."""

    run_id: str
    attempt_id: str
    thread_id: str
    attempt_number: int
    """The attempt's ``number`` (1, 2, …)."""
    worker_id: str
    token: bytes = field(repr=False)
    """The raw lease token; only ``hash_lease_token(token)`` is ever stored (S-21). Kept out of ``repr``."""


def new_lease_token(randbytes: Callable[[int], bytes]) -> bytes:
    """A fresh lease token drawn from the injected random source (e.g. ``secrets.token_bytes``)."""
    token = randbytes(LEASE_TOKEN_BYTES)
    if len(token) != LEASE_TOKEN_BYTES:
        raise ValueError(f"random source returned {len(token)} bytes, expected {LEASE_TOKEN_BYTES}")
    return token


def hash_lease_token(token: bytes) -> str:
    """S-21: the SHA-256 hex digest stored in ``lease_token_hash``."""
    return sha256_hex(token)


def lease_expiry(now: datetime, lease_seconds: float) -> datetime:
    """§7.2, S-15, S-23: the expiry a claim or renewal sets, ``now + worker.lease_seconds``."""
    return now + timedelta(seconds=lease_seconds)


@dataclass(frozen=True, kw_only=True, slots=True)
class FenceSnapshot:
    """The run and attempt columns the fence reads under lock (thread → run → attempt)."""

    run_status: RunStatus
    run_current_attempt_id: str | None
    attempt_id: str
    attempt_status: AttemptStatus
    attempt_worker_id: str
    lease_token_hash: str
    lease_expires_at: datetime


FenceReason = Literal[
    "run_not_running",
    "attempt_not_current",
    "attempt_not_live",
    "worker_mismatch",
    "token_mismatch",
    "lease_expired",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class FenceVerdict:
    """The answer of ``check_fence``: ``ok`` or the first condition that failed."""

    ok: bool
    reason: FenceReason | None = None
    """``None`` exactly when ``ok``; otherwise the first failed condition in §7.3 order."""


_OK: Final = FenceVerdict(ok=True)


def check_fence(snapshot: FenceSnapshot, lease: Lease, now: datetime) -> FenceVerdict:
    """S-20, S-21: the §7.3 fence predicate. A failed verdict means the write must raise ``LeaseLost``."""
    if snapshot.run_status != "running":
        return FenceVerdict(ok=False, reason="run_not_running")
    if not (snapshot.run_current_attempt_id == snapshot.attempt_id == lease.attempt_id):
        return FenceVerdict(ok=False, reason="attempt_not_current")
    if not is_attempt_live(snapshot.attempt_status):
        return FenceVerdict(ok=False, reason="attempt_not_live")
    if snapshot.attempt_worker_id != lease.worker_id:
        return FenceVerdict(ok=False, reason="worker_mismatch")
    # S-21: constant-time comparison of the stored hash with the hash of the token held in memory.
    expected = snapshot.lease_token_hash.encode()
    if not hmac.compare_digest(expected, hash_lease_token(lease.token).encode()):
        return FenceVerdict(ok=False, reason="token_mismatch")
    if not snapshot.lease_expires_at > now:
        return FenceVerdict(ok=False, reason="lease_expired")
    return _OK


def should_renew(now: datetime, lease_expires_at: datetime, lease_seconds: float) -> bool:
    """S-23: renew a lease that has not run out and has no more than 2/3 of ``lease_seconds`` remaining."""
    remaining = lease_expires_at - now
    if remaining <= timedelta(0):
        return False
    # remaining ≤ 2/3 · lease, compared as 3 · remaining ≤ 2 · lease to stay exact on microseconds.
    return remaining * 3 <= timedelta(seconds=lease_seconds) * 2


def is_renewable(snapshot: FenceSnapshot, *, now: datetime, lease_seconds: float) -> bool:
    """S-23: the attempt is live, unexpired and current for a running run, and due for renewal (the rule that
    ``store.leases.select_renewable`` runs in SQL; a test holds the two equal)."""
    return (
        snapshot.run_status == "running"
        and snapshot.run_current_attempt_id == snapshot.attempt_id
        and is_attempt_live(snapshot.attempt_status)
        and should_renew(now, snapshot.lease_expires_at, lease_seconds)
    )


def is_expired_for_recovery(snapshot: FenceSnapshot, *, now: datetime) -> bool:
    """S-27: re-checked under lock by ``expire_leases``: a live, current attempt of a running run, past due."""
    return (
        snapshot.run_status == "running"
        and snapshot.run_current_attempt_id == snapshot.attempt_id
        and is_attempt_live(snapshot.attempt_status)
        and snapshot.lease_expires_at < now
    )


def local_deadline(sent_at: float, lease_seconds: float) -> float:
    """§7.4 step 3: the send time of the claim or last successful renewal + ``worker.lease_seconds`` (local clock)."""
    return sent_at + lease_seconds


def local_deadline_reached(now: float, local_deadline: float, lease_seconds: float) -> bool:
    """S-24: once a third of the lease remains unconfirmed, cancel the attempt and write nothing more for it."""
    return now + lease_seconds / 3 >= local_deadline


def renewal_due_locally(now: float, local_deadline: float, lease_seconds: float) -> bool:
    """S-23 seen from the worker: whether a heartbeat needs its renewal transaction for this lease.

    The local deadline counts from the *send* time of the claim or last confirmed renewal, so it never lies past
    the expiry the database stored; a lease with more than 2/3 of ``lease_seconds`` left locally has at least that
    much left in the database, which renews only at 2/3 or less (``should_renew``). Skipping it changes nothing;
    a lease the database thinks due a few milliseconds earlier (its clock running a little fast) is renewed at
    the next heartbeat, with about 2/3 of the lease still left. Safety never rests on this: the local deadline
    (S-24) moves only on a confirmed renewal.
    """
    # remaining ≤ 2/3 · lease, compared as 3 · remaining ≤ 2 · lease, as in should_renew
    return (local_deadline - now) * 3 <= lease_seconds * 2


def may_start_fenced_write(now: float, local_deadline: float, db_timeout: float) -> bool:
    """S-25: a fenced write may start only while more than ``database.timeout`` remains before the local deadline."""
    return local_deadline - now > db_timeout
