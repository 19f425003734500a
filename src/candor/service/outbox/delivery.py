"""One `deliver_outbox` pass (§9.2): per kind, claim → handler → settle; kinds run concurrently.

A pass claims at most `batch` rows of a kind, `parallel` at a time, and begins no further sub-batch once it has run
for one lease period, so it ends within two. A handler gets at most `lease_seconds / 2`. Its exception (or timeout)
settles `retry` with backoff, or `dead` at `max_attempts` (S-109). The settle is fenced by the claim token (S-111):
if this process dies between handler and settle, the lease lapses and the row is claimed again (at least once).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, assert_never

import httpx

from .. import failpoints
from ..core import Service
from ..metrics import OUTBOX_DELIVERIES
from ..protocol.backoff import outbox_backoff_seconds, outbox_failure_settlement
from ..signing_keys import decrypt_secret
from ..protocol.children import CHILD_RESULT_DEFER_SECONDS
from ..store.children import deliver_child_result
from ..store.outbox import ClaimedRow, claim_rows, cleanup_checkpoint_page, settle
from .webhooks import post_webhook, target_allowed

__all__ = (
    "HandlerResult", "Handler", "HANDLERS", "deliver_outbox", "deliver_kind", "handle_webhook", "handle_child_result",
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
    client: httpx.AsyncClient


Handler = Callable[[ClaimedRow, DeliveryContext], Awaitable[HandlerResult]]


async def handle_webhook(row: ClaimedRow, ctx: DeliveryContext) -> HandlerResult:
    """§9.4: decrypt the copied secret, check the URL against the outbound policy, POST signed."""
    control = ctx.service.settings.control
    if not target_allowed(row.target, allow_insecure=control.webhook_allow_insecure):
        return HandlerResult(outcome="dead", error="target_refused")
    secret = decrypt_secret(row.signing_secret)
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


async def handle_checkpoint_cleanup(row: ClaimedRow, ctx: DeliveryContext) -> HandlerResult:
    """§9.6: reclaim the sealed run's unreachable checkpoint data, one page per invocation (cursor `after`)."""
    run_id = row.payload.get("run_id") or row.dedupe_key
    _, after = await cleanup_checkpoint_page(ctx.service.engine, run_id=run_id, after=int(row.payload.get("after", 0)))
    if after is not None:  # more pages: keep the cursor, come back without using up an attempt (S-112)
        return HandlerResult(outcome="deferred", payload={**row.payload, "after": after})
    return HandlerResult(outcome="delivered")


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


async def deliver_outbox(
    service: Service,
    *,
    client: httpx.AsyncClient | None = None,
    handlers: Mapping[str, Handler] | None = None,
    owner: str | None = None,
) -> dict[str, int]:
    """One pass over every kind with a handler, kinds concurrently; returns how many rows each kind settled."""
    table = dict(handlers if handlers is not None else HANDLERS)
    rng = service.entropy.random()
    own_client = client is None
    http = client if client is not None else httpx.AsyncClient(follow_redirects=False)
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


async def deliver_kind(
    service: Service,
    kind: str,
    handler: Handler,
    *,
    ctx: DeliveryContext,
    rng: random.Random,
    owner: str | None = None,
) -> int:
    """§9.2 for one kind: sub-batches of `parallel` up to `batch`, none begun after one lease period."""
    policy = service.settings.outbox.policy(kind)  # type: ignore[arg-type]
    clock = service.clock
    started = clock.monotonic()
    remaining = policy.batch
    settled = 0
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
            *(_deliver_one(service, row, handler, ctx=ctx, rng=rng, max_attempts=policy.max_attempts,
                           time_limit=policy.lease_seconds / 2) for row in rows)
        )
        settled += sum(results)
    return settled


async def _deliver_one(
    service: Service,
    row: ClaimedRow,
    handler: Handler,
    *,
    ctx: DeliveryContext,
    rng: random.Random,
    max_attempts: int,
    time_limit: float,
) -> bool:
    try:
        result = await asyncio.wait_for(handler(row, ctx), timeout=time_limit)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - §9.2: a handler exception is a failed attempt
        result = HandlerResult(outcome="failed", error=f"handler_error: {type(exc).__name__}")
    failpoints.hit(failpoints.OUTBOX_BEFORE_SETTLE)
    outcome: Literal["delivered", "dead", "retry", "deferred"]
    delay = result.delay_seconds
    if result.outcome == "failed":
        outcome = outbox_failure_settlement(attempts=row.attempts, max_attempts=max_attempts)
        delay = outbox_backoff_seconds(row.attempts, rng)  # S-109
    else:
        outcome = result.outcome
    changed = await settle(
        service.engine, row_id=row.id, token=row.token, outcome=outcome, error=result.error, delay_seconds=delay,
        payload=result.payload,
    )
    if not changed:
        return False  # S-111: our claim lapsed and someone else owns the row now
    OUTBOX_DELIVERIES.labels(kind=row.kind, result=outcome).inc()
    fields = {"outbox_id": row.id, "kind": row.kind, "attempts": row.attempts}
    if outcome == "delivered":
        log.info("Outbox delivered", extra=fields)
    elif outcome == "dead":
        log.warning("Outbox delivery dead", extra={**fields, "error": result.error})
    elif outcome == "retry":
        log.info("Outbox delivery failed", extra={**fields, "error": result.error, "delay_seconds": delay})
    return True
