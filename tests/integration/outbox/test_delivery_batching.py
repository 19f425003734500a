"""Delivery throughput without weaker rules: batch settles fenced per row, pooled keep-alive connections, and the
sweep's next pass at once after a full batch (§9.2, §9.4, §10.2; S-108, S-109, S-111, S-112).

The database tests run on SQLite and PostgreSQL (`db`), against a real HTTP receiver on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx
from sqlalchemy import update

from candor.service.control.sweeps import Sweep, run_sweep
from candor.service.outbox.delivery import DeliveryLoop, HandlerResult, settlement_for, wants_another_pass
from candor.service.outbox.webhooks import DRAIN_LIMIT_BYTES, drainable_body, webhook_client
from candor.service.runtime import FakeClock
from candor.service.settings import ServiceSettings
from candor.service.store.outbox.claims import ClaimedRow, Settlement, claim_rows, group_settlements, settle_many
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import outbox

from outbox import support
from outbox.support import outbox_row


def _claimed(attempts: int) -> ClaimedRow:
    return ClaimedRow(
        id="obx_1",
        kind="webhook",
        dedupe_key="k",
        target="https://example.test/hook",
        payload={},
        signing_secret=None,
        subscription_id=None,
        attempts=attempts,
        created_at=0.0,
        token=b"t" * 16,
    )


async def _claim(db: Any, limit: int) -> list[ClaimedRow]:
    return await claim_rows(db.engine, kind="webhook", limit=limit, lease_seconds=10, max_attempts=5)


async def test_batch_settle_with_one_stale_token_changes_only_the_fresh_rows(db, tenant, receiver) -> None:
    """S-111: in one batch settle, the row whose claim lapsed and was taken again is left to its new claimer;
    the rows settled with their current tokens are delivered."""
    ids = await support.stage_webhooks(db.engine, tenant, url=receiver.url, count=3)
    first = await _claim(db, 3)
    stale_id = first[0].id
    async with db.engine.begin() as conn:
        await conn.execute(update(outbox).where(outbox.c.id == stale_id).values(lease_expires_at=db_now() - 1))
    (again,) = await _claim(db, 3)
    assert again.id == stale_id

    changed = await settle_many(
        db.engine, [Settlement(row_id=row.id, token=row.token, outcome="delivered") for row in first]
    )
    assert changed == set(ids) - {stale_id}
    stale = await outbox_row(db.engine, stale_id)
    assert (stale["status"], stale["attempts"], stale["delivered_at"]) == ("pending", 2, None)
    assert stale["lease_token_hash"] is not None  # still the second claimer's lease
    assert await settle_many(
        db.engine, [Settlement(row_id=stale_id, token=again.token, outcome="dead", error="x")]
    ) == {stale_id}
    assert {(await outbox_row(db.engine, row_id))["status"] for row_id in ids} == {"delivered", "dead"}


async def test_batch_settle_applies_each_outcome_to_its_own_row(db, tenant, receiver) -> None:
    """S-112, S-109: one batch with delivered, retry, deferred (with a cursor payload) and dead settles each row as
    its own settle would; the deferred row gets its attempt back."""
    await support.stage_webhooks(db.engine, tenant, url=receiver.url, count=4)
    done, retry, deferred, dead = await _claim(db, 4)
    before = await support.db_time(db.engine)
    changed = await settle_many(
        db.engine,
        [
            Settlement(row_id=done.id, token=done.token, outcome="delivered"),
            Settlement(row_id=retry.id, token=retry.token, outcome="retry", error="http_status: 500", delay_seconds=7),
            Settlement(
                row_id=deferred.id, token=deferred.token, outcome="deferred", delay_seconds=30, payload={"after": 5}
            ),
            Settlement(row_id=dead.id, token=dead.token, outcome="dead", error="target_refused"),
        ],
    )
    assert changed == {done.id, retry.id, deferred.id, dead.id}
    rows = {row_id: await outbox_row(db.engine, row_id) for row_id in changed}
    assert rows[done.id]["status"] == "delivered" and rows[done.id]["delivered_at"] is not None
    assert (rows[retry.id]["status"], rows[retry.id]["attempts"], rows[retry.id]["last_error"]) == (
        "pending",
        1,
        "http_status: 500",
    )
    assert rows[retry.id]["available_at"] >= before + 7 - 0.01
    assert (rows[deferred.id]["attempts"], rows[deferred.id]["payload"]) == (0, {"after": 5})
    assert rows[deferred.id]["available_at"] >= before + 30 - 0.01
    assert (rows[dead.id]["status"], rows[dead.id]["last_error"]) == ("dead", "target_refused")
    assert all(row["lease_token_hash"] is None for row in rows.values())


def test_settlements_are_grouped_by_the_values_they_write() -> None:
    """S-111: equal settlements share one UPDATE (each row still fenced by its own token); a payload or a
    different delay makes its own group."""
    token = b"t" * 16
    delivered = [Settlement(row_id=f"obx_{n}", token=token, outcome="delivered") for n in range(3)]
    retry_a = Settlement(row_id="obx_r1", token=token, outcome="retry", delay_seconds=2.1)
    retry_b = Settlement(row_id="obx_r2", token=token, outcome="retry", delay_seconds=3.4)
    cursor_a = Settlement(row_id="obx_c1", token=token, outcome="deferred", payload={"after": 1})
    cursor_b = Settlement(row_id="obx_c2", token=token, outcome="deferred", payload={"after": 1})
    groups = group_settlements([delivered[0], retry_a, delivered[1], cursor_a, retry_b, cursor_b, delivered[2]])
    assert groups == [delivered, [retry_a], [cursor_a], [retry_b], [cursor_b]]


def test_a_failed_handler_settles_retry_with_backoff_then_dead_at_max_attempts() -> None:
    """S-109: `failed` below `max_attempts` is a retry after 2^attempts × U(0.8, 1.0) s; at `max_attempts` dead,
    with the handler's error kept; other outcomes settle as the handler said (S-112: deferred keeps its delay)."""
    rng = random.Random(3)
    failed = HandlerResult(outcome="failed", error="timeout")
    retry = settlement_for(_claimed(3), failed, max_attempts=5, rng=rng)
    assert (retry.outcome, retry.error) == ("retry", "timeout") and 8 * 0.8 <= retry.delay_seconds <= 8
    dead = settlement_for(_claimed(5), failed, max_attempts=5, rng=rng)
    assert (dead.outcome, dead.error) == ("dead", "timeout")
    deferred = settlement_for(
        _claimed(5), HandlerResult(outcome="deferred", delay_seconds=30, payload={"a": 1}), max_attempts=5, rng=rng
    )
    assert (deferred.outcome, deferred.delay_seconds, deferred.payload) == ("deferred", 30, {"a": 1})


def test_only_small_announced_response_bodies_are_drained() -> None:
    """§9.4: the body never decides anything; it is drained (to keep the connection) only when it is absent by
    status or announced small, else the connection is closed instead."""
    assert drainable_body(204, httpx.Headers())
    assert drainable_body(200, httpx.Headers({"Content-Length": "2"}))
    assert drainable_body(500, httpx.Headers({"Content-Length": str(DRAIN_LIMIT_BYTES)}))
    assert not drainable_body(200, httpx.Headers({"Content-Length": str(DRAIN_LIMIT_BYTES + 1)}))
    assert not drainable_body(200, httpx.Headers({"Transfer-Encoding": "chunked"}))
    assert not drainable_body(200, httpx.Headers())
    assert not drainable_body(200, httpx.Headers({"Content-Length": "-1"}))


async def test_delivery_loop_reuses_one_kept_alive_connection(db, tenant, clock) -> None:
    """S-108, §9.4: passes of one `DeliveryLoop` POST every row over the same kept-alive connection; 2xx and 5xx
    answers still decide delivered and retry."""
    receiver = await support.Receiver(keep_alive=True, script=[200, 500, 202]).start()
    service = support.make_service(db.url, db.engine, clock=clock, webhook={"parallel": 1})
    loop = DeliveryLoop(service)
    try:
        ids = await support.stage_webhooks(db.engine, tenant, url=receiver.url, count=4)
        assert (await loop.run_pass())["webhook"] == 4
    finally:
        await loop.aclose()
        await receiver.stop()
    # Claims go in (available_at, id) order and the ids are random, so compare as sets of rows, each POSTed once.
    assert sorted(request.headers["Candor-Delivery-Id"] for request in receiver.received) == sorted(ids)
    assert receiver.connections == 1
    statuses = [(await outbox_row(db.engine, row_id))["status"] for row_id in ids]
    assert sorted(statuses) == ["delivered", "delivered", "delivered", "pending"]


def test_another_pass_is_wanted_only_after_a_full_batch() -> None:
    """§9.2, §10.2: a pass that settled a full `batch` of some kind asks for the next pass at once."""
    settings = ServiceSettings(outbox={"by_kind": {"webhook": {"batch": 10}}})
    assert wants_another_pass({"webhook": 10, "child_result": 0}, settings)
    assert not wants_another_pass({"webhook": 9, "child_result": 0}, settings)
    assert wants_another_pass({"webhook": 0, "child_result": settings.outbox.policy("child_result").batch}, settings)


async def test_sweep_runs_again_at_once_while_its_pass_asks_for_more() -> None:
    """§10.2, S-125: a pass whose `again` is true is followed by the next one without waiting a period; then the
    sweep waits its period again; `close` runs when the sweep stops."""
    clock = FakeClock()
    passes: list[int] = []
    closed = asyncio.Event()

    async def one_pass() -> int:
        passes.append(len(passes))
        return len(passes)

    async def close() -> None:
        closed.set()

    sweep = Sweep(name="again_demo", period=10.0, run=one_pass, timeout=1.0, again=lambda done: done < 3, close=close)
    task = asyncio.create_task(run_sweep(sweep, clock=clock, rng=random.Random(1)))
    try:
        await clock.settle()
        clock.advance(10.0)  # past the initial jitter
        await clock.settle(rounds=100)
        assert len(passes) == 3 and clock.sleepers == 1  # two "again" passes after the first, no clock movement
        clock.advance(10.0)
        await clock.settle(rounds=100)
        assert len(passes) == 4
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert closed.is_set()


def test_webhook_proxies_come_from_the_environment_once(monkeypatch) -> None:
    """§9.4 delivery keeps honouring `HTTP(S)_PROXY` and `NO_PROXY` (as the httpx client did), read once when the
    client is made and remembered per origin."""
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "hooks.local")
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    monkeypatch.delenv("ALL_PROXY", raising=False)
    client = webhook_client(connections=1)
    monkeypatch.setenv("HTTPS_PROXY", "http://changed.internal:1")  # read at creation only
    assert client.proxy_for("https://example.com/hook") == "http://proxy.internal:3128"
    assert client.proxy_for("https://hooks.local/hook") is None
    assert client.proxy_for("http://example.com/hook") is None
    for name in ("HTTPS_PROXY", "NO_PROXY", "https_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert webhook_client(connections=1).proxy_for("https://example.com/hook") is None
