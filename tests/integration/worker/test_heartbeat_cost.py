"""What one supervisor heartbeat costs the database (§7.4, S-23): a worker heartbeats every
`worker.authority_seconds` whether or not its runs make progress, so an idle or waiting worker pays it all the time.
One read statement reads the runs with their principals' authority facts; the renewal's write transaction runs
only when a lease is due by the local clock."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import event, select, update

from candor.service.protocol.fencing import local_deadline, renewal_due_locally
from candor.service.store.runs.claims import claim_runs
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import principals, run_attempts, runs
from candor.service.worker.handle import AttemptHandle
from candor.service.worker.supervisor import Supervisor

from worker.support import add_thread_run


@contextmanager
def transactions_begun(engine: Any) -> Iterator[list[str]]:
    """One entry per transaction begun on the engine meanwhile."""
    begun: list[str] = []

    def begin(_conn: Any) -> None:
        begun.append("begin")

    event.listen(engine.sync_engine, "begin", begin)
    try:
        yield begun
    finally:
        event.remove(engine.sync_engine, "begin", begin)


async def _claimed_handle(db: Any, tenant: Any, service: Any, *, locally_left: float) -> tuple[Any, AttemptHandle]:
    """A claimed attempt whose handle has `locally_left` of the service's lease left by the local clock."""
    lease_seconds = service.settings.worker.lease_seconds
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant)
    [claimed] = await claim_runs(
        db.engine,
        worker_id="w1",
        agents=("scripted",),
        limit=1,
        lease_seconds=lease_seconds,
        randbytes=secrets.token_bytes,
    )
    sent_at = service.clock.monotonic() - (lease_seconds - locally_left)
    return ref, AttemptHandle(claimed=claimed, lease_seconds=lease_seconds, sent_at=sent_at)


async def _stored_left(db: Any, attempt_id: str) -> float:
    async with db.engine.connect() as conn:
        expires = await conn.execute(select(run_attempts.c.lease_expires_at).where(run_attempts.c.id == attempt_id))
        now = (await conn.execute(select(db_now()))).scalar_one()
        return float(expires.scalar_one() - now)


async def test_a_heartbeat_with_no_lease_due_is_one_read_transaction(db, service, tenant) -> None:
    """§7.4, S-23: supervision and authority share one transaction; a lease with more than 2/3 left locally is not
    due in the database either, so no renewal transaction is begun and nothing is written."""
    lease_seconds = service.settings.worker.lease_seconds
    _, handle = await _claimed_handle(db, tenant, service, locally_left=lease_seconds * 0.95)
    before = await _stored_left(db, handle.lease.attempt_id)
    supervisor = Supervisor(service, handles=lambda: [handle])
    with transactions_begun(db.engine) as begun:
        renewed = await supervisor.heartbeat()
    assert renewed == set()
    assert len(begun) == 1
    assert handle.stop_reason is None
    assert await _stored_left(db, handle.lease.attempt_id) <= before


async def test_a_heartbeat_renews_a_lease_due_by_the_local_clock(db, service, tenant) -> None:
    """S-23, §7.4 step 3: a lease due locally (and in the database) is renewed in a second transaction, and the
    confirmed renewal moves the handle's local deadline."""
    lease_seconds = service.settings.worker.lease_seconds
    _, handle = await _claimed_handle(db, tenant, service, locally_left=lease_seconds * 0.4)
    async with db.engine.begin() as conn:  # the stored expiry, as the local deadline implies it
        await conn.execute(
            update(run_attempts)
            .where(run_attempts.c.id == handle.lease.attempt_id)
            .values(lease_expires_at=db_now() + lease_seconds * 0.4)
        )
    deadline_before = handle.deadline
    supervisor = Supervisor(service, handles=lambda: [handle])
    with transactions_begun(db.engine) as begun:
        renewed = await supervisor.heartbeat()
    assert renewed == {handle.lease.attempt_id}
    assert len(begun) == 2
    assert handle.deadline > deadline_before
    assert await _stored_left(db, handle.lease.attempt_id) > lease_seconds * 0.9


async def test_one_read_stops_a_cancelled_run_and_a_refused_principals_run(db, service, tenant) -> None:
    """S-57, S-61: two attempts, one of a run asked to cancel, then the principal loses `run`: each stops with its
    own reason (the first reason wins for the cancelled one), from the one read transaction."""
    lease_seconds = service.settings.worker.lease_seconds
    first_ref, first = await _claimed_handle(db, tenant, service, locally_left=lease_seconds * 0.95)
    _, second = await _claimed_handle(db, tenant, service, locally_left=lease_seconds * 0.95)
    async with db.engine.begin() as conn:
        await conn.execute(update(runs).where(runs.c.id == first_ref.run_id).values(cancel_requested_at=db_now()))
    supervisor = Supervisor(service, handles=lambda: [first, second])
    with transactions_begun(db.engine) as begun:
        await supervisor.heartbeat()
    assert (first.stop_reason, second.stop_reason) == ("cancelled", None)
    assert len(begun) == 1
    async with db.engine.begin() as conn:
        await conn.execute(
            update(principals).where(principals.c.id == tenant.principal_id).values(permissions=["read"])
        )
    await supervisor.heartbeat()
    assert (first.stop_reason, second.stop_reason) == ("cancelled", "authority_revoked")


@given(
    lease_seconds=st.floats(min_value=3, max_value=600),
    sent_at=st.floats(min_value=0, max_value=1e6),
    elapsed=st.floats(min_value=0, max_value=700),
    send_lag=st.floats(min_value=0, max_value=5),
)
def test_not_due_locally_means_not_due_in_the_database(
    lease_seconds: float, sent_at: float, elapsed: float, send_lag: float
) -> None:
    """S-23: the database stamps its expiry `send_lag` after the worker's send time, so its lease has at least the
    local remaining time left; whenever the local clock says "not due", the database would not renew either."""
    now = sent_at + elapsed
    deadline = local_deadline(sent_at, lease_seconds)
    stored_left = deadline + send_lag - now  # seconds left by the database's expiry, measured at `now`
    database_would_renew = stored_left > 0 and stored_left * 3 <= lease_seconds * 2
    if database_would_renew:
        assert renewal_due_locally(now, deadline, lease_seconds)


def test_renewal_is_due_locally_at_two_thirds() -> None:
    """S-23: due at 2/3 of the lease left, not a moment before."""
    assert not renewal_due_locally(0.0, 20.001, 30)
    assert renewal_due_locally(0.0, 20.0, 30)
    assert renewal_due_locally(0.0, 1.0, 30)
