"""Outbox staging, claim/settle, webhook delivery, redeliver, retention and gauges (§9, S-106..S-117, S-119).

Every test runs on SQLite and PostgreSQL (`db`), against a real HTTP receiver on 127.0.0.1.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import delete, select, update

from candor.service.control.backlog import BacklogAlarm, purge_outbox, report_backlog
from candor.service.errors import Conflict
from candor.service.metrics import OUTBOX_BACKLOG_ALERT, OUTBOX_DEAD
from candor.service.outbox.delivery import deliver_outbox
from candor.service.outbox.webhooks import canonical_body, sign, verify_signature
from candor.service.store.outbox.backlog import redeliver
from candor.service.store.outbox.claims import claim_rows, settle
from candor.service.store.runs.outbox_staging import enqueue_once, stage_run_event
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import checkpoints, outbox, subscriptions
from candor.service.worker import WorkerLoop

from outbox import support
from outbox.support import add_subscription, make_due, outbox_row, outbox_rows
from transactions import statements_sent
from worker import support as worker_support
from worker.support import add_thread_run, run_row


async def _stage_one(db: Any, tenant: Any, url: str) -> str:
    async with db.engine.begin() as conn:
        await add_subscription(conn, tenant, url=url, events=["run.accepted"])
        ref = await add_thread_run(conn, tenant)
        assert await stage_run_event(conn, event_type="run.accepted", run_row_or_id=ref.run_id) == 1
    (row,) = await outbox_rows(db.engine, kind="webhook")
    row_id: str = row["id"]
    return row_id


async def test_enqueue_once_ignores_a_second_row_with_the_same_key(db, tenant) -> None:
    """S-107: a second `enqueue_once` with the same `(kind, dedupe_key)` adds no row."""
    async with db.engine.begin() as conn:
        first = await enqueue_once(
            conn,
            kind="checkpoint_cleanup",
            dedupe_key="run_x",
            target="run_x",
            payload={"run_id": "run_x"},
            workspace_id=tenant.workspace_id,
        )
        second = await enqueue_once(
            conn,
            kind="checkpoint_cleanup",
            dedupe_key="run_x",
            target="run_x",
            payload={"run_id": "other"},
            workspace_id=tenant.workspace_id,
        )
    assert (first, second) == (True, False)
    (row,) = await outbox_rows(db.engine)
    assert row["payload"] == {"run_id": "run_x"} and row["status"] == "pending"


async def test_staging_rolls_back_with_its_transaction(db, tenant, receiver) -> None:
    """S-106: rows staged in a transaction that rolls back are never delivered."""
    async with db.engine.begin() as conn:
        await add_subscription(conn, tenant, url=receiver.url)
        ref = await add_thread_run(conn, tenant)
    with pytest.raises(RuntimeError):
        async with db.engine.begin() as conn:
            await stage_run_event(conn, event_type="run.accepted", run_row_or_id=ref.run_id)
            raise RuntimeError("roll back")
    assert await outbox_rows(db.engine) == []


async def test_run_lifecycle_stages_every_transition_in_its_transaction(db, tenant, receiver, clock) -> None:
    """S-106: claim, attempt start and seal stage their webhooks; the seal also stages `checkpoint_cleanup`;
    a subscription filter on another agent stages nothing."""
    service = support.make_service(db.url, db.engine, clock=clock)
    async with db.engine.begin() as conn:
        await add_subscription(conn, tenant, url=receiver.url)
        await add_subscription(conn, tenant, url=receiver.url, filter={"agent": "someone_else"})
        ref = await add_thread_run(conn, tenant)
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    assert (await run_row(db.engine, ref.run_id))["status"] == "completed"

    webhooks = await outbox_rows(db.engine, kind="webhook")
    types = sorted(row["payload"]["type"] for row in webhooks)
    assert types == sorted(
        ["run.running", "run_attempt.leased", "run_attempt.running", "run.completed", "run_attempt.succeeded"]
    )
    completed = next(row for row in webhooks if row["payload"]["type"] == "run.completed")
    assert completed["payload"]["data"]["run"]["status"] == "completed"
    (cleanup,) = await outbox_rows(db.engine, kind="checkpoint_cleanup")
    assert cleanup["dedupe_key"] == ref.run_id

    counts = await deliver_outbox(service)
    assert counts["webhook"] == 5 and counts["checkpoint_cleanup"] == 1
    assert len(receiver.received) == 5
    assert {row["status"] for row in await outbox_rows(db.engine)} == {"delivered"}


async def test_a_run_without_subscriptions_never_looks_them_up(db, tenant) -> None:
    """S-106, issue 12: the claim and the fence read whether the workspace has an enabled subscription, so the
    transitions of a run in a workspace with none (the claim, the attempt start, the seal) stage no webhook
    without a lookup of their own; the seal still stages its `checkpoint_cleanup` row, and the run's own rows are
    not read back to stage it."""
    service = support.make_service(db.url, db.engine)
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant)
    with statements_sent(db.engine) as sent:
        await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    assert (await run_row(db.engine, ref.run_id))["status"] == "completed"
    assert [s for s in sent if s.startswith("SELECT SUBSCRIPTIONS.")] == []
    assert [s for s in sent if s.startswith("SELECT RUNS.WORKSPACE_ID")] == []  # the seal's former read-back
    (cleanup,) = await outbox_rows(db.engine, kind="checkpoint_cleanup")
    assert cleanup["dedupe_key"] == ref.run_id
    assert await outbox_rows(db.engine, kind="webhook") == []


async def test_a_subscription_of_another_workspace_stages_nothing(db, tenant, receiver) -> None:
    """S-106, §4.4: `workspace_has_subscriptions` is the run's own workspace's: another workspace's subscription
    neither stages a webhook nor makes a lookup find one."""
    service = support.make_service(db.url, db.engine)
    async with db.engine.begin() as conn:
        other_tenant = await worker_support.add_tenant(conn)
        await add_subscription(conn, other_tenant, url=receiver.url)
        ref = await add_thread_run(conn, tenant)
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    assert (await run_row(db.engine, ref.run_id))["status"] == "completed"
    assert await outbox_rows(db.engine, kind="webhook") == []


async def test_delivery_is_signed_and_id_matches_header(db, tenant, receiver, clock) -> None:
    """S-113, S-108: `Candor-Signature` is `v1=` HMAC-SHA256 of "{ts}.{id}.{body}"; payload id = delivery id;
    a 2xx answer settles `delivered`."""
    service = support.make_service(db.url, db.engine, clock=clock)
    row_id = await _stage_one(db, tenant, receiver.url)
    assert (await deliver_outbox(service))["webhook"] == 1

    (request,) = receiver.received
    headers = request.headers
    assert headers["Candor-Delivery-Id"] == row_id
    body = json.loads(request.body)
    assert body["id"] == row_id and body["type"] == "run.accepted" and set(body) == {"id", "type", "created_at", "data"}
    timestamp = int(headers["Candor-Timestamp"])
    assert timestamp == int(clock.now().timestamp())
    assert headers["Candor-Signature"] == sign(
        support.SECRET, timestamp=timestamp, delivery_id=row_id, body=request.body
    )
    assert verify_signature(support.SECRET, headers, request.body, now=timestamp + 10)
    assert not verify_signature(support.SECRET, headers, request.body + b" ", now=timestamp)
    assert not verify_signature("wrong", headers, request.body, now=timestamp)
    assert not verify_signature(support.SECRET, headers, request.body, now=timestamp + 301)
    row = await outbox_row(db.engine, row_id)
    assert row["status"] == "delivered" and row["delivered_at"] is not None and row["settled_at"] is not None
    assert row["lease_token_hash"] is None


async def test_redirect_is_a_failure_retried_with_backoff(db, tenant, receiver, clock) -> None:
    """S-108, S-109: a 3xx is a failure, is not followed, and the row waits 2^attempts × U(0.8, 1.0) s."""
    receiver.script = ["redirect"]
    service = support.make_service(db.url, db.engine, clock=clock)
    row_id = await _stage_one(db, tenant, receiver.url)
    before = await support.db_time(db.engine)
    await deliver_outbox(service)
    after = await support.db_time(db.engine)
    assert [r.path for r in receiver.received] == ["/hook"]  # /elsewhere never requested
    row = await outbox_row(db.engine, row_id)
    assert row["status"] == "pending" and row["attempts"] == 1 and "302" in row["last_error"]
    assert before + 2 * 0.8 - 0.01 <= row["available_at"] <= after + 2.0 + 0.01
    assert (await deliver_outbox(service))["webhook"] == 0  # not due yet
    await make_due(db.engine, row_id)
    await deliver_outbox(service)
    assert (await outbox_row(db.engine, row_id))["status"] == "delivered"


async def test_failures_until_max_attempts_make_the_row_dead(db, tenant, receiver, clock) -> None:
    """S-109: a failure at `attempts ≥ max_attempts` settles `dead`; the error is kept."""
    receiver.default = 500
    service = support.make_service(db.url, db.engine, clock=clock, webhook={"max_attempts": 3})
    row_id = await _stage_one(db, tenant, receiver.url)
    for attempt in (1, 2, 3):
        await make_due(db.engine, row_id)
        await deliver_outbox(service)
        row = await outbox_row(db.engine, row_id)
        assert row["attempts"] == attempt
    assert row["status"] == "dead" and row["last_error"] == "http_status: 500" and row["settled_at"] is not None
    assert len(receiver.received) == 3


async def test_timeout_is_a_failure(db, tenant, receiver, clock) -> None:
    """S-108: no answer within `control.webhook_timeout` is a failure (retry)."""
    receiver.script = ["hang"]
    service = support.make_service(db.url, db.engine, clock=clock, timeout=0.3)
    row_id = await _stage_one(db, tenant, receiver.url)
    await deliver_outbox(service)
    row = await outbox_row(db.engine, row_id)
    assert row["status"] == "pending" and row["last_error"] == "timeout" and row["attempts"] == 1


async def test_insecure_target_is_refused(db, tenant, receiver, clock) -> None:
    """§9.4: an `http://` URL without `webhook_allow_insecure` settles `dead` with `target_refused`, unsent."""
    service = support.make_service(db.url, db.engine, clock=clock, insecure=False)
    row_id = await _stage_one(db, tenant, receiver.url)
    await deliver_outbox(service)
    row = await outbox_row(db.engine, row_id)
    assert (row["status"], row["last_error"]) == ("dead", "target_refused")
    assert receiver.received == []


async def test_lapsed_last_claim_becomes_dead_unsettled(db, tenant, receiver) -> None:
    """S-110: a row whose last allowed claim lapsed without a settle is `dead`/`unsettled` at its next claim."""
    row_id = await _stage_one(db, tenant, receiver.url)
    (claimed,) = await claim_rows(db.engine, kind="webhook", limit=5, lease_seconds=10, max_attempts=1)
    assert claimed.attempts == 1
    assert await claim_rows(db.engine, kind="webhook", limit=5, lease_seconds=10, max_attempts=1) == []  # leased
    async with db.engine.begin() as conn:
        await conn.execute(update(outbox).values(lease_expires_at=db_now() - 1))
    assert await claim_rows(db.engine, kind="webhook", limit=5, lease_seconds=10, max_attempts=1) == []
    row = await outbox_row(db.engine, row_id)
    assert (row["status"], row["last_error"]) == ("dead", "unsettled")
    assert not await settle(db.engine, row_id=row_id, token=claimed.token, outcome="delivered")


async def test_stale_token_settle_changes_nothing(db, tenant, receiver) -> None:
    """S-111: after the lease lapsed and the row was claimed again, the first claimer's settle changes nothing."""
    row_id = await _stage_one(db, tenant, receiver.url)
    (first,) = await claim_rows(db.engine, kind="webhook", limit=1, lease_seconds=10, max_attempts=5)
    async with db.engine.begin() as conn:
        await conn.execute(update(outbox).values(lease_expires_at=db_now() - 1))
    (second,) = await claim_rows(db.engine, kind="webhook", limit=1, lease_seconds=10, max_attempts=5)
    assert second.attempts == 2
    assert not await settle(db.engine, row_id=row_id, token=first.token, outcome="dead", error="stale")
    row = await outbox_row(db.engine, row_id)
    assert row["status"] == "pending" and row["last_error"] is None
    assert await settle(db.engine, row_id=row_id, token=second.token, outcome="delivered")
    assert (await outbox_row(db.engine, row_id))["status"] == "delivered"


async def test_deferred_settle_gives_the_attempt_back(db, tenant, receiver) -> None:
    """S-112: `deferred` makes the row due later without using up an attempt."""
    row_id = await _stage_one(db, tenant, receiver.url)
    (claimed,) = await claim_rows(db.engine, kind="webhook", limit=1, lease_seconds=10, max_attempts=5)
    assert await settle(db.engine, row_id=row_id, token=claimed.token, outcome="deferred", delay_seconds=30)
    row = await outbox_row(db.engine, row_id)
    assert row["attempts"] == 0 and row["status"] == "pending" and row["lease_token_hash"] is None
    assert row["available_at"] > await support.db_time(db.engine) + 25


async def test_redeliver_only_dead_rows(db, tenant, receiver, clock) -> None:
    """S-114: redeliver of a pending row → 409 `not_dead`; of a dead row → pending, attempts 0, same id."""
    service = support.make_service(db.url, db.engine, clock=clock, webhook={"max_attempts": 1})
    receiver.script = [500]
    row_id = await _stage_one(db, tenant, receiver.url)
    async with db.engine.begin() as conn:
        with pytest.raises(Conflict) as raised:
            await redeliver(conn, row_id)
    assert raised.value.reason == "not_dead"
    await deliver_outbox(service)
    assert (await outbox_row(db.engine, row_id))["status"] == "dead"
    async with db.engine.begin() as conn:
        await redeliver(conn, row_id)
    row = await outbox_row(db.engine, row_id)
    assert (row["status"], row["attempts"], row["settled_at"]) == ("pending", 0, None)
    await deliver_outbox(service)
    assert (await outbox_row(db.engine, row_id))["status"] == "delivered"
    assert {r.headers["Candor-Delivery-Id"] for r in receiver.received} == {row_id}


async def test_purge_respects_retention_and_never_removes_pending(db, tenant, clock) -> None:
    """S-115: only settled rows older than their kind's retention for their status are removed."""
    service = support.make_service(
        db.url, db.engine, clock=clock, webhook={"delivered_retention_seconds": 100, "dead_retention_seconds": 1000}
    )
    async with db.engine.begin() as conn:
        for key, status in (
            ("old_ok", "delivered"),
            ("new_ok", "delivered"),
            ("old_dead", "dead"),
            ("mid_dead", "dead"),
            ("pending", "pending"),
        ):
            await enqueue_once(
                conn,
                kind="webhook",
                dedupe_key=key,
                target="https://x.test",
                payload={},
                workspace_id=tenant.workspace_id,
                status="dead" if status == "dead" else "pending",
            )
        now = db_now()
        ages = {"old_ok": 200, "new_ok": 50, "old_dead": 2000, "mid_dead": 500, "pending": 5000}
        for key, age in ages.items():
            values: dict[str, Any] = {"settled_at": now - age, "created_at": now - age}
            if key.endswith("_ok"):
                values["status"] = "delivered"
            if key == "pending":
                values = {"created_at": now - age, "available_at": now - age}
            await conn.execute(update(outbox).where(outbox.c.dedupe_key == key).values(**values))
    assert await purge_outbox(service) == 2
    left = {row["dedupe_key"] for row in await outbox_rows(db.engine)}
    assert left == {"new_ok", "mid_dead", "pending"}


async def test_dead_gauge_and_sustained_backlog_alert(db, tenant, receiver, clock) -> None:
    """S-116: `candor_outbox_dead` is 1 while a dead row is retained, 0 after redeliver.
    S-117: `candor_outbox_backlog_alert` becomes 1 only after the breach lasted `backlog_alert_seconds`."""
    service = support.make_service(
        db.url, db.engine, clock=clock, webhook={"backlog_count": 1, "backlog_alert_seconds": 60}
    )
    alarm = BacklogAlarm()
    row_id = await _stage_one(db, tenant, receiver.url)
    gauge = OUTBOX_BACKLOG_ALERT.labels(kind="webhook")
    await report_backlog(service, alarm=alarm)
    assert gauge._value.get() == 0  # breached, but not for long enough
    clock.advance(59)
    await report_backlog(service, alarm=alarm)
    assert gauge._value.get() == 0
    clock.advance(1)
    await report_backlog(service, alarm=alarm)
    assert gauge._value.get() == 1
    assert OUTBOX_DEAD.labels(kind="webhook")._value.get() == 0

    async with db.engine.begin() as conn:
        await conn.execute(update(outbox).where(outbox.c.id == row_id).values(status="dead", settled_at=db_now()))
    await report_backlog(service, alarm=alarm)
    assert gauge._value.get() == 0  # recovered: no pending rows
    assert OUTBOX_DEAD.labels(kind="webhook")._value.get() == 1
    async with db.engine.begin() as conn:
        await redeliver(conn, row_id)
    await report_backlog(service, alarm=alarm)
    assert OUTBOX_DEAD.labels(kind="webhook")._value.get() == 0
    assert gauge._value.get() == 0  # a new breach starts a new timer


async def test_staged_rows_survive_subscription_edits_and_unreadable_secrets_stage_dead(
    db, tenant, receiver, clock
) -> None:
    """S-119: rows copy URL and secret when staged, so later edits or deletion do not affect them.
    §9.4: a secret that cannot be decrypted at staging time stages the row `dead`/`signing_secret_unavailable`."""
    service = support.make_service(db.url, db.engine, clock=clock)
    row_id = await _stage_one(db, tenant, receiver.url)
    async with db.engine.begin() as conn:
        await conn.execute(delete(subscriptions))
        await add_subscription(conn, tenant, url=receiver.url, events=["run.accepted"], encrypted="not-a-token")
        ref = await add_thread_run(conn, tenant)
        await stage_run_event(conn, event_type="run.accepted", run_row_or_id=ref.run_id)
    await deliver_outbox(service)
    assert (await outbox_row(db.engine, row_id))["status"] == "delivered"
    (unreadable,) = [row for row in await outbox_rows(db.engine) if row["id"] != row_id]
    assert (unreadable["status"], unreadable["last_error"]) == ("dead", "signing_secret_unavailable")
    assert len(receiver.received) == 1


async def test_checkpoint_cleanup_keeps_the_run_readable(db, tenant, clock) -> None:
    """§9.6, S-47: cleanup clears superseded envelopes but never data reachable from a current checkpoint."""
    from candor.service.store.checkpoints.incremental import load_state

    service = support.make_service(db.url, db.engine, clock=clock)
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="tools")
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    run = await run_row(db.engine, ref.run_id)
    assert run["status"] == "completed"
    assert (await deliver_outbox(service))["checkpoint_cleanup"] == 1
    async with db.engine.connect() as conn:
        rows = (
            await conn.execute(
                select(checkpoints.c.id, checkpoints.c.envelope)
                .where(checkpoints.c.run_id == ref.run_id)
                .order_by(checkpoints.c.seq)
            )
        ).all()
        assert len(rows) >= 2
        assert all(row.envelope is None for row in rows[:-1]) and rows[-1].envelope is not None
        state = await load_state(conn, run["checkpoint_id"])
    assert state is not None
    assert canonical_body(delivery_id="x", payload={"type": "t", "created_at": 1}) == (
        b'{"created_at":1,"data":{},"id":"x","type":"t"}'
    )


async def test_recovery_stages_accepted_and_failed_attempt(db, tenant, receiver, clock) -> None:
    """S-106, §7.6 step 3: a lease-expiry recovery stages `run.accepted` and `run_attempt.failed`."""
    from candor.service.control.sweeps import expire_leases
    from candor.service.store.runs.claims import claim_runs
    from candor.service.store.schema.tables import run_attempts

    service = support.make_service(db.url, db.engine, clock=clock)
    async with db.engine.begin() as conn:
        await add_subscription(
            conn, tenant, url=receiver.url, events=["run.accepted", "run_attempt.failed", "run_attempt.leased"]
        )
        ref = await add_thread_run(conn, tenant)
    (claimed,) = await claim_runs(
        db.engine, worker_id="w1", agents=["scripted"], limit=1, lease_seconds=10, randbytes=service.entropy.token_bytes
    )
    async with db.engine.begin() as conn:
        await conn.execute(update(run_attempts).values(lease_expires_at=db_now() - 1))
    assert await expire_leases(service) == 1
    rows = await outbox_rows(db.engine, kind="webhook")
    assert sorted(row["payload"]["type"] for row in rows) == [
        "run.accepted",
        "run_attempt.failed",
        "run_attempt.leased",
    ]
    failed = next(row for row in rows if row["payload"]["type"] == "run_attempt.failed")
    assert failed["payload"]["data"]["attempt"]["id"] == claimed.lease.attempt_id
    assert (await run_row(db.engine, ref.run_id))["status"] == "accepted"


@pytest.mark.parametrize("stored", ["message rows", "packed"])
async def test_checkpoint_cleanup_deletes_rows_shadowed_by_a_history_rewrite(db, tenant, stored) -> None:
    """§9.6, S-47, S-40: after a rewrite (a later checkpoint keeps fewer messages than its base), the base's message
    rows beyond `kept` (checkpoints written before migration 0007) are deleted and its envelope cleared; messages
    packed in the base's own row stay (insert-only). Either way the run's current checkpoint still loads, and a
    checkpoint that is another run's start keeps everything."""
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    from candor.service.store.checkpoints.incremental import encode_message, load_state
    from candor.service.store.outbox.cleanup import cleanup_checkpoints
    from candor.service.store.schema.tables import checkpoint_messages, checkpoints, runs

    def message(text: str):
        return encode_message(ModelRequest(parts=[UserPromptPart(content=text)]))

    legacy = stored == "message rows"
    a, b, c, d = (message(x) for x in "abcd")
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant)
        first = await insert_checkpoint_for(conn, ref, seq=1, base=None, base_encoded=(), new=[a, b, c])
        second = await insert_checkpoint_for(conn, ref, seq=2, base=first, base_encoded=[a, b, c], new=[a, d])
        if legacy:
            await as_message_rows(conn, first, 0, [a, b, c])
            await as_message_rows(conn, second, 1, [d])
        packed = (await conn.execute(select(checkpoints.c.messages).where(checkpoints.c.id == first))).scalar_one()
        await conn.execute(update(runs).where(runs.c.id == ref.run_id).values(checkpoint_id=second, checkpoint_seq=2))
    # rows 1, 2 of `first` + its envelope; packed: the envelope only
    assert await cleanup_checkpoints(db.engine, run_id=ref.run_id) == (3 if legacy else 1)
    async with db.engine.connect() as conn:
        left = (
            await conn.execute(
                select(checkpoint_messages.c.checkpoint_id, checkpoint_messages.c.index).order_by(
                    checkpoint_messages.c.checkpoint_id, checkpoint_messages.c.index
                )
            )
        ).all()
        kept_rows = [(False, 1), (True, 0)] if legacy else []
        assert sorted((row.checkpoint_id == first, row.index) for row in left) == kept_rows
        after = (await conn.execute(select(checkpoints.c.messages).where(checkpoints.c.id == first))).scalar_one()
        assert after == packed
        loaded = await load_state(conn, second)
    assert [m.digest for m in loaded.encoded] == [a.digest, d.digest]

    # A checkpoint that is some run's start is protected.
    async with db.engine.begin() as conn:
        other = await add_thread_run(conn, tenant)
        third = await insert_checkpoint_for(conn, other, seq=1, base=None, base_encoded=(), new=[a, b])
        fourth = await insert_checkpoint_for(conn, other, seq=2, base=third, base_encoded=[a, b], new=[c])
        await conn.execute(update(runs).where(runs.c.id == other.run_id).values(checkpoint_id=fourth, checkpoint_seq=2))
        await conn.execute(update(runs).where(runs.c.id == ref.run_id).values(start_checkpoint_id=third))
    assert await cleanup_checkpoints(db.engine, run_id=other.run_id) == 0


async def as_message_rows(conn, checkpoint_id, first_index, messages) -> None:
    """Store a checkpoint's new messages as a checkpoint written before migration 0007 did: one row each."""
    from sqlalchemy import insert

    from candor.service.store.schema.tables import checkpoint_messages, checkpoints

    await conn.execute(update(checkpoints).where(checkpoints.c.id == checkpoint_id).values(messages=None))
    for offset, encoded in enumerate(messages):
        await conn.execute(
            insert(checkpoint_messages).values(
                checkpoint_id=checkpoint_id, index=first_index + offset, body=encoded.body, digest=encoded.digest
            )
        )


async def insert_checkpoint_for(conn, ref, *, seq, base, base_encoded, new) -> str:
    from candor.service.store.checkpoints.incremental import CheckpointEnvelope, insert_checkpoint

    written = await insert_checkpoint(
        conn,
        thread_id=ref.thread_id,
        run_id=ref.run_id,
        seq=seq,
        attempt=1,
        base_id=base,
        base_encoded=list(base_encoded),
        new_encoded=list(new),
        envelope=CheckpointEnvelope(thread_id=ref.thread_id),
    )
    return written.id


async def test_checkpoint_cleanup_pages_with_a_cursor_and_deferred_settles(db, tenant, clock, monkeypatch) -> None:
    """§9.6, S-112: the cleanup handler stores its cursor `after` in the payload and settles `deferred` between
    pages (no attempt used up), `delivered` when done."""
    import functools

    from candor.service.outbox import delivery
    from candor.service.store.outbox.cleanup import cleanup_page_locked

    monkeypatch.setattr(delivery, "cleanup_page_locked", functools.partial(cleanup_page_locked, limit=1))
    service = support.make_service(db.url, db.engine, clock=clock)
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="tools")
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    for _ in range(10):
        await deliver_outbox(service)
        (row,) = await outbox_rows(db.engine, kind="checkpoint_cleanup")
        if row["status"] == "delivered":
            break
        await make_due(db.engine, row["id"])
    assert row["status"] == "delivered" and row["attempts"] == 1
    assert row["payload"]["after"] >= 2  # paged
    async with db.engine.connect() as conn:
        envelopes = (
            (
                await conn.execute(
                    select(checkpoints.c.envelope).where(checkpoints.c.run_id == ref.run_id).order_by(checkpoints.c.seq)
                )
            )
            .scalars()
            .all()
        )
    assert len(envelopes) >= 3 and all(e is None for e in envelopes[:-1]) and envelopes[-1] is not None
