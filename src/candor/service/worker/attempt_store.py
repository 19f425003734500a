"""An attempt's database calls, retried through a blip within the lease (S-25, S-50, §7.8.1).

Every read and write of an attempt goes through `AttemptStore`. A transient fault (`protocol.db_faults`) is tried
again after a jittered backoff (`protocol.store_retry`) while the next try starts more than `database.timeout`
before the local lease deadline (renewals move it); after that the fault reaches the attempt. A write tried again
first looks for its own result (`store.landed`): found, it is not sent again, so a commit is never applied twice,
mistaken for a lost lease, or a webhook staged twice. Each retry and the giving up log one line, no traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Literal, TypeVar

from pydantic import JsonValue

from ..core import Service
from ..errors import LeaseLost, StoreUnavailable
from ..protocol.authority import AuthorityVerdict
from ..protocol.db_faults import classify_database_error, describe_database_error
from ..protocol.outcomes import RecoveryDecision
from ..protocol.store_retry import next_store_retry, own_end_landed
from ..protocol.transitions import attempt_end
from ..store.attempts import (
    AttemptStart,
    CommitResult,
    SealRequest,
    commit_checkpoint,
    find_own_checkpoint,
    load_attempt_start,
    read_assigned_entries,
    read_attempt_end,
    recover_attempt,
    seal_run,
)
from ..store.checkpoints import EncodedEnvelope, EncodedMessage
from ..store.runs import read_authority, start_attempt
from ..store.threads import NewStreamEntry
from .handle import AttemptHandle

__all__ = ("AttemptStore",)

log = logging.getLogger("candor.worker")

T = TypeVar("T")


class AttemptStore:
    """The database calls of one attempt, each retried through transient faults within the lease."""

    def __init__(self, service: Service, handle: AttemptHandle) -> None:
        self.service = service
        self.handle = handle
        self.lease = handle.lease
        self.offered: set[str] = set()
        """Ids of the entries already passed to the stream (`steer`): a commit found landed offers only the others."""

    # -- the window ------------------------------------------------------------------------------------------------

    def guard(self) -> None:
        """S-24, S-25: no fenced write too close to the local lease deadline (or after a deadline cancellation)."""
        now = self.service.clock.monotonic()
        if not self.handle.may_write(now, db_timeout=self.service.settings.database.timeout):
            raise LeaseLost("local_deadline")

    async def retrying(
        self,
        what: str,
        call: Callable[[], Awaitable[T]],
        *,
        fenced: bool,
        landed: Callable[[], Awaitable[T | None]] | None = None,
    ) -> T:
        """`call()`, tried again after each transient fault while the window is open; `landed()` (a write's own
        result, or None) is asked before every try after the first. A fenced call checks the window (`guard`)
        before each try and raises `LeaseLost` when it has closed; otherwise the last fault is raised."""
        tries = 0
        while True:
            if fenced:
                self.guard()
            try:
                if tries and landed is not None and (found := await landed()) is not None:
                    log.info("Database write had committed", extra=self._extra(what, tries=tries))
                    return found
                return await call()
            except StoreUnavailable as error:
                tries += 1
                delay = self._next_delay(error, tries)
                cause = describe_database_error(error)
                if delay is None:
                    log.warning("Database retries ended", extra=self._extra(what, tries=tries, cause=cause))
                    raise
                extra = self._extra(what, tries=tries, cause=cause, retry_in_ms=int(delay * 1000))
                log.warning("Database call failed; retrying", extra=extra)
                await self.service.clock.sleep(delay)

    def _next_delay(self, error: StoreUnavailable, tries: int) -> float | None:
        last_start = self.handle.deadline - self.service.settings.database.timeout  # S-25, moves with renewals
        if self.handle.deadline_cancelled:
            return None
        return next_store_retry(
            classify_database_error(error),
            tries=tries,
            now=self.service.clock.monotonic(),
            last_start=last_start,
            random_fraction=self.service.entropy.random().random(),
        )

    def _extra(self, what: str, **fields: str | int) -> dict[str, str | int]:
        return {"run_id": self.lease.run_id, "attempt": self.lease.attempt_number, "call": what, **fields}

    # -- reads -----------------------------------------------------------------------------------------------------

    async def authority(self, principal_id: str) -> AuthorityVerdict:
        """§7.7 step 1; *unavailable* only once the window has closed on a database that does not answer."""
        engine = self.service.engine
        try:
            return await self.retrying("authority check", lambda: read_authority(engine, principal_id), fenced=False)
        except StoreUnavailable:
            return "unavailable"

    async def load_start(self) -> AttemptStart:
        """§7.7 step 2's reads for the claimed run (`CheckpointCorrupt` is not retried: it is no blip)."""
        engine, claimed = self.service.engine, self.handle.claimed
        return await self.retrying("load start", lambda: load_attempt_start(engine, claimed), fenced=False)

    # -- writes ----------------------------------------------------------------------------------------------------

    async def start(self, harness_run_id: str) -> None:
        """S-16 `leased → running`; found already running with this harness run id, it had committed."""
        engine = self.service.engine

        async def call() -> bool:
            await start_attempt(engine, self.lease, harness_run_id=harness_run_id)
            return True

        async def landed() -> bool | None:
            row = await read_attempt_end(engine, self.lease.attempt_id)
            return True if row is not None and row["status"] == "running" else None

        await self.retrying("start attempt", call, fenced=True, landed=landed)

    async def commit(
        self,
        *,
        expected_seq: int,
        base_id: str | None,
        base_encoded: Sequence[EncodedMessage],
        new_encoded: list[EncodedMessage],
        envelope: EncodedEnvelope,
        source_entry_consumed: bool,
        usage: Mapping[str, JsonValue] | None,
        stream_entries: Sequence[NewStreamEntry],
        boundary_sequence: int,
        incorporated_keys: Sequence[str],
        delivery_count: int,
        delivery_bytes: int,
        seal: SealRequest | None,
    ) -> CommitResult:
        """§7.8's fenced commit (`seals.commit_checkpoint`); found committed, its result is rebuilt from its rows."""
        engine, lease = self.service.engine, self.lease

        async def call() -> CommitResult:
            return await commit_checkpoint(
                engine,
                lease,
                expected_seq=expected_seq,
                base_id=base_id,
                base_encoded=base_encoded,
                new_encoded=new_encoded,
                envelope=envelope,
                incorporated_keys=incorporated_keys,
                source_entry_consumed=source_entry_consumed,
                usage=usage,
                seal=seal,
                stream_entries=stream_entries,
                boundary_sequence=boundary_sequence,
                delivery_count=delivery_count,
                delivery_bytes=delivery_bytes,
            )

        async def landed() -> CommitResult | None:
            own = await find_own_checkpoint(
                engine, run_id=lease.run_id, seq=expected_seq + 1, attempt=lease.attempt_number
            )
            if own is None:
                return None
            fresh = new_encoded[own.kept :]
            written = len(envelope.text) + len(envelope.digest) + sum(len(m.body) + len(m.digest) for m in fresh)
            assigned = () if seal is not None else await read_assigned_entries(engine, lease.run_id)
            return CommitResult(
                checkpoint_id=own.id,
                seq=own.seq,
                kept=own.kept,
                count=own.count,
                bytes_written=written,
                assigned=tuple(entry for entry in assigned if entry.id not in self.offered),
                sealed=seal is not None,
                queued=seal is not None and seal.status == "completed",  # the thread advance finds out (§8.5)
            )

        return await self.retrying("checkpoint commit", call, fenced=True, landed=landed)

    async def seal(self, request: SealRequest, *, usage: Mapping[str, JsonValue] | None) -> None:
        """§7.10 without a final commit (`failed`/`cancelled`); found sealed by this attempt, it had committed."""
        engine, lease = self.service.engine, self.lease
        end = request.attempt
        code = request.failure.get("code") if request.failure else None

        async def call() -> bool:
            await seal_run(engine, lease, request, usage=usage)
            return True

        async def landed() -> bool | None:
            row = await read_attempt_end(engine, lease.attempt_id)
            return True if own_end_landed(row, status=end.status, failure_code=code) else None

        await self.retrying("seal", call, fenced=True, landed=landed)

    async def recover(
        self,
        *,
        outcome: Literal["failed", "yielded"],
        failure_code: str | None,
        failure_message: str | None,
        usage: Mapping[str, JsonValue] | None,
    ) -> RecoveryDecision | None:
        """§7.6 for this attempt (a transient failure or a handoff), fenced; None when it is found done already."""
        engine, lease = self.service.engine, self.lease
        end = attempt_end("handoff" if outcome == "yielded" else "recovery")

        async def call() -> RecoveryDecision | Literal[False] | None:
            return await recover_attempt(
                engine,
                run_id=lease.run_id,
                attempt_id=lease.attempt_id,
                outcome=outcome,
                failure_code=failure_code,
                failure_message=failure_message,
                lease=lease,
                usage=usage,
            )

        async def landed() -> Literal[False] | None:
            row = await read_attempt_end(engine, lease.attempt_id)
            found = own_end_landed(row, status=end.status, failure_code=failure_code, yield_reason=end.yield_reason)
            return False if found else None

        result = await self.retrying("recovery", call, fenced=True, landed=landed)
        if result is False:  # it had committed: wake the workers in case the run is due now (cheap if not)
            self.service.wake_workers()
            return None
        return result
