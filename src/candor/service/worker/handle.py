"""AttemptHandle: the remote control of one running attempt, shared by the loop, the supervisor and drain.

The supervisor asks an attempt to stop (cancellation, revoked authority), cancels its task at the local lease
deadline, and moves the deadline when a renewal is confirmed; drain flags it for handoff. The attempt itself
reads the flags at its boundaries and asks `may_write()` before every fenced write (S-25).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from candor import RunStream

from ..protocol.fencing import Lease, local_deadline, local_deadline_reached, may_start_fenced_write
from ..store.runs import ClaimedRun

__all__ = ("StopReason", "AgentRunStream", "AttemptHandle")

StopReason = Literal["cancelled", "authority_revoked"]

AgentRunStream: TypeAlias = RunStream[object]
"""The run stream of whichever agent the run names: the worker never relies on the output's type, it only stores
the output as JSON."""


@dataclass(kw_only=True, eq=False)
class AttemptHandle:
    """One claimed lease while its attempt task runs."""

    claimed: ClaimedRun
    lease_seconds: float
    sent_at: float
    """Process monotonic time at which the claim (or the last confirmed renewal) was sent (§7.4 step 3)."""
    task: asyncio.Task[None] | None = None
    stream: AgentRunStream | None = None
    """The attempt's run stream once started; `request_stop()` cancels it (H-105)."""
    stop_reason: StopReason | None = None
    handoff_requested: bool = False
    deadline_cancelled: bool = False
    lease_lost: bool = False
    """A fenced write found the lease gone (S-20): nothing more may run for it."""
    started_at: float = field(default=0.0)
    """Monotonic time the attempt task started (for `duration_ms`)."""
    monotonic: Callable[[], float] = time.monotonic
    """The clock of `sent_at` (the service's), for `lease_held()` asked from a tool."""

    @property
    def lease(self) -> Lease:
        return self.claimed.lease

    @property
    def deadline(self) -> float:
        """The local lease deadline on the monotonic clock (§7.4 step 3)."""
        return local_deadline(self.sent_at, self.lease_seconds)

    def renewed(self, sent_at: float) -> None:
        """A renewal sent at `sent_at` was confirmed: the local deadline moves (§7.4 step 3)."""
        self.sent_at = max(self.sent_at, sent_at)

    def deadline_reached(self, now: float) -> bool:
        """S-24: a third of the lease remains unconfirmed."""
        return local_deadline_reached(now, self.deadline, self.lease_seconds)

    def may_write(self, now: float, *, db_timeout: float) -> bool:
        """S-24, S-25: no fenced write after a deadline cancellation or within `database.timeout` of the deadline."""
        return not self.deadline_cancelled and may_start_fenced_write(now, self.deadline, db_timeout)

    def lease_held(self, now: float) -> bool:
        """Whether an effect may still start under this lease: not known lost, not cancelled at
        the deadline, and the local deadline (S-24: a third of the lease left unconfirmed) not reached."""
        return not (self.lease_lost or self.deadline_cancelled or self.deadline_reached(now))

    def request_stop(self, reason: StopReason) -> None:
        """S-57, S-61: stop the attempt with this outcome; the first reason wins. Running tools are cancelled."""
        if self.stop_reason is not None:
            return
        self.stop_reason = reason
        if self.stream is not None:
            self.stream.cancel()

    def request_handoff(self) -> None:
        """§7.11: yield at the next model boundary (or at once, before the harness starts)."""
        self.handoff_requested = True

    def cancel_for_deadline(self) -> bool:
        """S-24: cancel the attempt task once; returns whether this call cancelled it."""
        if self.deadline_cancelled:
            return False
        self.deadline_cancelled = True
        if self.task is not None and not self.task.done():
            self.task.cancel()
        return True
