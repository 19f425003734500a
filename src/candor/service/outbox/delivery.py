"""One `deliver_outbox` pass (§9.2): per kind, claim → handler → settle; kinds run concurrently.

A pass claims at most `batch` rows of a kind, `parallel` at a time, and begins no further sub-batch once it has run
for one lease period, so it ends within two. A handler gets at most `lease_seconds / 2`. Its exception (or timeout)
settles `retry` with backoff, or `dead` at `max_attempts` (S-109). A sub-batch's outcomes are settled together in
one transaction, each row fenced by its own claim token (S-111): if this process dies between handler and settle,
the lease lapses and the row is claimed again (at least once).

`DeliveryLoop` is what the control role's sweep runs: one pooled HTTP client kept across passes (connections are
reused, §9.4), and `wants_another_pass` to start the next pass at once while a kind still fills its `batch`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, assert_never

from .. import failpoints
from ..core import Service
from ..errors import StoreUnavailable
from ..metrics import OUTBOX_DELIVERIES
from ..protocol.backoff import outbox_backoff_seconds, outbox_failure_settlement
from ..protocol.children import CHILD_RESULT_DEFER_SECONDS
from ..settings import ServiceSettings
from ..store.db import WriteConnection, write_transaction
from ..store.outbox import (
    ClaimedRow,
    Settlement,
    claim_rows,
    claim_rows_locked,
    cleanup_page_locked,
    settle_many,
    settle_many_locked,
)
from ..store.threads import deliver_child_result
from .webhooks import WebhookClient, post_webhook, target_allowed, webhook_client

__all__ = (
    "HandlerResult",
    "Handler",
    "InDatabaseHandler",
    "HANDLERS",
    "DeliveryLoop",
    "deliver_outbox",
    "deliver_kind",
    "settlement_for",
    "wants_another_pass",
    "handle_webhook",
    "handle_child_result",
    "handle_checkpoint_cleanup",
)

log = logging.getLogger("candor.outbox")


@dataclass(frozen=True, kw_only=True, slots=True)
class HandlerResult:
    """What a handler decided for its row; `failed` becomes `retry` or `dead` by the attempt count (S-109)."""

    outcome: Literal["delivered", "dead", "failed", "deferred"]
    error: str | None = None
    delay_seconds: float = 0.0
    payload: Mapping[str, Any] | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class DeliveryContext:
    service: Service
    client: WebhookClient
    secrets: dict[str, str | None] = field(default_factory=dict)
    """Signing secrets decrypted during this pass, by encrypted value: the rows of one subscription carry the same
    copy, and a Fernet decryption costs more than the rest of a delivery's signing. Kept for one pass only, so a key
    removed from the ring stops decrypting at the next pass (§9.4)."""

    def signing_secret(self, encrypted: str | None) -> str | None:
        if encrypted is None:
            return None
        if encrypted not in self.secrets:
            self.secrets[encrypted] = self.service.key_ring.decrypt_secret(encrypted)
        return self.secrets[encrypted]


Handler = Callable[[ClaimedRow, DeliveryContext], Awaitable[HandlerResult]]


async def handle_webhook(row: ClaimedRow, ctx: DeliveryContext) -> HandlerResult:
    """§9.4: decrypt the copied secret, check the URL against the outbound policy, POST signed."""
    control = ctx.service.settings.control
    if not target_allowed(row.target, allow_insecure=control.webhook_allow_insecure):
        return HandlerResult(outcome="dead", error="target_refused")
    secret = ctx.signing_secret(row.signing_secret)
    if secret is None:
        return HandlerResult(outcome="dead", error="signing_secret_unavailable")
    assert row.target is not None
    result = await post_webhook(
        ctx.client,
        url=row.target,
        secret=secret,
        delivery_id=row.id,
        payload=row.payload,
        timestamp=int(ctx.service.clock.now().timestamp()),
        timeout=control.webhook_timeout,
        allow_insecure=control.webhook_allow_insecure,
    )
    match result.result:
        case "delivered":
            return HandlerResult(outcome="delivered")
        case "refused":
            return HandlerResult(outcome="dead", error=result.error)
        case _:
            return HandlerResult(outcome="failed", error=result.error)


@dataclass(frozen=True, slots=True)
class InDatabaseHandler:
    """A handler whose whole effect is database writes (§9.6 checkpoint cleanup). A pass claims its rows, runs
    `work` and settles them in ONE transaction on one connection: a crash or an error anywhere leaves neither the
    work nor the claim behind, and a row costs one commit instead of three (claim, handler, settle).

    Called like any other handler (`handler(row, ctx)`), `work` runs in a transaction of its own: the path a pass
    falls back to when the one transaction fails, so a failing row still gets its attempts, backoff and dead end
    (S-109)."""

    work: Callable[[WriteConnection, ClaimedRow, DeliveryContext], Awaitable[HandlerResult]]

    async def __call__(self, row: ClaimedRow, ctx: DeliveryContext) -> HandlerResult:
        async with write_transaction(ctx.service.engine) as conn:
            return await self.work(conn, row, ctx)


async def _cleanup_page(conn: WriteConnection, row: ClaimedRow, ctx: DeliveryContext) -> HandlerResult:
    """§9.6: reclaim the sealed run's unreachable checkpoint data, one page per invocation (cursor `after`)."""
    run_id = row.payload.get("run_id") or row.dedupe_key
    _, after = await cleanup_page_locked(conn, run_id=run_id, after=int(row.payload.get("after", 0)))
    if after is not None:  # more pages: keep the cursor, come back without using up an attempt (S-112)
        return HandlerResult(outcome="deferred", payload={**row.payload, "after": after})
    return HandlerResult(outcome="delivered")


handle_checkpoint_cleanup = InDatabaseHandler(_cleanup_page)


async def handle_child_result(row: ClaimedRow, ctx: DeliveryContext) -> HandlerResult:
    """§9.5, S-118: one `child_result` entry in the parent thread; archived parent ignored, full inbox deferred."""
    service = ctx.service
    outcome = await deliver_child_result(
        service.engine,
        child_run_id=str(row.payload.get("child_run_id") or row.dedupe_key),
        parent_thread_id=row.target,
        settings=service.settings,
        agent_names=service.agents.names(),
        entropy=service.entropy,
    )
    if outcome.started_run_id is not None:
        service.wake_workers()
        log.info(
            "Run accepted",
            extra={"run_id": outcome.started_run_id, "thread_id": row.target, "trigger": "child_result"},
        )
    match outcome.plan:
        case "insert" | "duplicate" | "ignore_archived":
            return HandlerResult(outcome="delivered")
        case "defer_inbox_full":  # never dropped: comes back later without using up an attempt (S-112)
            return HandlerResult(outcome="deferred", error="inbox_full", delay_seconds=CHILD_RESULT_DEFER_SECONDS)
        case "invalid_target":
            return HandlerResult(outcome="dead", error="invalid_target")
        case other:
            assert_never(other)


HANDLERS: dict[str, Handler] = {
    "webhook": handle_webhook,
    "child_result": handle_child_result,
    "checkpoint_cleanup": handle_checkpoint_cleanup,
}


def _webhook_connections(settings: ServiceSettings) -> int:
    return settings.outbox.policy("webhook").parallel


async def deliver_outbox(
    service: Service,
    *,
    client: WebhookClient | None = None,
    handlers: Mapping[str, Handler] | None = None,
    owner: str | None = None,
) -> dict[str, int]:
    """One pass over every kind with a handler, kinds concurrently; returns how many rows each kind settled.

    Without `client` the pass opens (and closes) its own; a caller running passes repeatedly passes one that
    lives across them (`DeliveryLoop`) so connections are reused."""
    table = dict(handlers if handlers is not None else HANDLERS)
    rng = service.entropy.random()
    own_client = client is None
    http = client if client is not None else webhook_client(connections=_webhook_connections(service.settings))
    try:
        ctx = DeliveryContext(service=service, client=http)
        kinds = list(table)
        counts = await asyncio.gather(
            *(deliver_kind(service, kind, table[kind], ctx=ctx, rng=rng, owner=owner) for kind in kinds)
        )
    finally:
        if own_client:
            await http.aclose()
    return dict(zip(kinds, counts, strict=True))


def wants_another_pass(settled: Mapping[str, int], settings: ServiceSettings) -> bool:
    """Whether a pass settled a full `batch` of some kind, so more rows are probably due and the next pass should
    start now rather than one `control.scan_seconds` later (§10.2). Each pass is still bounded on its own (§9.2)."""
    return any(count >= settings.outbox.policy(kind).batch for kind, count in settled.items())  # type: ignore[arg-type]


class DeliveryLoop:
    """The `deliver_outbox` sweep's state across passes: one pooled HTTP client (sized from the webhook kind's
    `parallel`), so deliveries reuse kept-alive connections instead of opening one per POST. `aclose` when done."""

    def __init__(self, service: Service, *, handlers: Mapping[str, Handler] | None = None) -> None:
        self.service = service
        self.handlers = handlers
        self.client = webhook_client(connections=_webhook_connections(service.settings))

    async def run_pass(self) -> dict[str, int]:
        return await deliver_outbox(self.service, client=self.client, handlers=self.handlers)

    def wants_another_pass(self, settled: Mapping[str, int]) -> bool:
        return wants_another_pass(settled, self.service.settings)

    async def aclose(self) -> None:
        await self.client.aclose()


async def deliver_kind(
    service: Service,
    kind: str,
    handler: Handler,
    *,
    ctx: DeliveryContext,
    rng: random.Random,
    owner: str | None = None,
) -> int:
    """§9.2 for one kind: sub-batches of `parallel` up to `batch`, none begun after one lease period.

    A sub-batch's settle transaction runs while the next sub-batch is claimed and its handlers run, so the
    database round trips of one overlap the HTTP waits of the other instead of adding to them. At most `parallel`
    handlers run at a time and a row is claimed only when its handler is about to start; a row settled `deferred`
    with no delay is picked up by the next pass (its claim is still live while the next sub-batch is claimed)."""
    policy = service.settings.outbox.policy(kind)  # type: ignore[arg-type]
    clock = service.clock
    started = clock.monotonic()
    remaining = policy.batch
    settled = 0
    if isinstance(handler, InDatabaseHandler):
        settled, remaining = await _deliver_in_one_transaction(
            service, kind, handler, ctx=ctx, rng=rng, owner=owner, started=started
        )
    settling: asyncio.Task[int] | None = None
    try:
        while remaining > 0 and clock.monotonic() - started < policy.lease_seconds:
            rows = await claim_rows(
                service.engine,
                kind=kind,
                limit=min(policy.parallel, remaining),
                lease_seconds=policy.lease_seconds,
                max_attempts=policy.max_attempts,
                owner=owner,
                randbytes=service.entropy.token_bytes,
            )
            if not rows:
                break
            remaining -= len(rows)
            results = await asyncio.gather(
                *(_run_handler(row, handler, ctx=ctx, time_limit=policy.lease_seconds / 2) for row in rows)
            )
            settlements = []
            for row, result in zip(rows, results, strict=True):
                failpoints.hit(failpoints.OUTBOX_BEFORE_SETTLE)
                settlements.append(settlement_for(row, result, max_attempts=policy.max_attempts, rng=rng))
            if settling is not None:
                settled += await settling
            settling = asyncio.create_task(_settle_and_record(service, rows, settlements))
    finally:
        if settling is not None:
            settled += await settling  # never left running: a pass ends with every sub-batch settled
    return settled


async def _deliver_in_one_transaction(
    service: Service,
    kind: str,
    handler: InDatabaseHandler,
    *,
    ctx: DeliveryContext,
    rng: random.Random,
    owner: str | None,
    started: float,
) -> tuple[int, int]:
    """§9.2 for an in-database kind: up to `parallel` rows claimed, worked and settled per transaction, under the
    same `batch` and lease-period bounds. Returns the rows settled and how many of `batch` are left; when a
    transaction fails (a handler error, a timeout) it rolled back whole and the pass goes on with the usual path,
    which gives the failing row its own claim, handler transaction and settle."""
    policy = service.settings.outbox.policy(kind)  # type: ignore[arg-type]
    clock = service.clock
    remaining, settled = policy.batch, 0
    while remaining > 0 and clock.monotonic() - started < policy.lease_seconds:
        try:
            async with asyncio.timeout(policy.lease_seconds / 2):
                async with write_transaction(service.engine) as conn:
                    rows = await claim_rows_locked(
                        conn,
                        kind=kind,
                        limit=min(policy.parallel, remaining),
                        lease_seconds=policy.lease_seconds,
                        max_attempts=policy.max_attempts,
                        owner=owner,
                        randbytes=service.entropy.token_bytes,
                    )
                    settlements = []
                    for row in rows:
                        result = await handler.work(conn, row, ctx)
                        failpoints.hit(failpoints.OUTBOX_BEFORE_SETTLE)
                        settlements.append(settlement_for(row, result, max_attempts=policy.max_attempts, rng=rng))
                    changed = await settle_many_locked(conn, settlements)
        except StoreUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - rolled back whole; the usual path takes over for this pass
            log.info(
                "Outbox batch fell back to separate transactions",
                extra={"kind": kind, "error_type": type(exc).__name__},
            )
            return settled, remaining
        if not rows:
            break
        remaining -= len(rows)
        settled += len(changed)
        for row, settlement in zip(rows, settlements, strict=True):
            if settlement.row_id in changed:
                _record(row, settlement)
    return settled, 0


async def _settle_and_record(service: Service, rows: list[ClaimedRow], settlements: list[Settlement]) -> int:
    changed = await settle_many(service.engine, settlements)
    for row, settlement in zip(rows, settlements, strict=True):
        if settlement.row_id in changed:  # S-111: otherwise our claim lapsed and someone else owns the row
            _record(row, settlement)
    return len(changed)


async def _run_handler(row: ClaimedRow, handler: Handler, *, ctx: DeliveryContext, time_limit: float) -> HandlerResult:
    try:
        async with asyncio.timeout(time_limit):  # not wait_for: on 3.11 it can swallow a cancellation
            return await handler(row, ctx)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - §9.2: a handler exception is a failed attempt
        return HandlerResult(outcome="failed", error=f"handler_error: {type(exc).__name__}")


def settlement_for(row: ClaimedRow, result: HandlerResult, *, max_attempts: int, rng: random.Random) -> Settlement:
    """How a handler's result settles its row (§9.2): `failed` becomes `retry` with backoff, or `dead` at
    `max_attempts` (S-109); the other outcomes settle as they are, with the handler's delay and payload."""
    if result.outcome == "failed":
        return Settlement(
            row_id=row.id,
            token=row.token,
            error=result.error,
            outcome=outbox_failure_settlement(attempts=row.attempts, max_attempts=max_attempts),
            delay_seconds=outbox_backoff_seconds(row.attempts, rng),
        )
    return Settlement(
        row_id=row.id,
        token=row.token,
        outcome=result.outcome,
        error=result.error,
        delay_seconds=result.delay_seconds,
        payload=result.payload,
    )


def _record(row: ClaimedRow, settlement: Settlement) -> None:
    outcome = settlement.outcome
    OUTBOX_DELIVERIES.labels(kind=row.kind, result=outcome).inc()
    fields = {"outbox_id": row.id, "kind": row.kind, "attempts": row.attempts}
    if outcome == "delivered":
        log.info("Outbox delivered", extra=fields)
    elif outcome == "dead":
        log.warning("Outbox delivery dead", extra={**fields, "error": settlement.error})
    elif outcome == "retry":
        log.info(
            "Outbox delivery failed",
            extra={**fields, "error": settlement.error, "delay_seconds": settlement.delay_seconds},
        )
