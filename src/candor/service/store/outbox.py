"""The outbox (§9): staging rows in the caller's transaction, claiming them under a lease, settling, purging.

* `enqueue_once(conn, …)` inserts one row unless `(kind, dedupe_key)` exists (S-107); `stage_run_event` stages the
  webhook rows of one run or attempt transition for every matching enabled subscription (S-106), and
  `stage_seal_rows` the `checkpoint_cleanup` (and, on a child thread, `child_result`) row of a seal. Both run
  inside the transaction that makes the change. (The cleanup itself is in `store/cleanup.py`.)
* `claim_rows` leases due rows per kind (§9.2), `FOR UPDATE SKIP LOCKED` on PostgreSQL and `BEGIN IMMEDIATE` on
  SQLite; a row already at `max_attempts` becomes `dead`/`unsettled` instead (S-110).
* `settle_many` settles a batch in one transaction, each row fenced by its own claim token (S-111); `settle` is
  the one-row form; `deferred` gives the attempt back (S-112).
* `purge` removes settled rows past their retention (S-115); `redeliver` resets a `dead` row (S-114).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import and_, bindparam, delete, func, or_, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..errors import Conflict, NotFound
from ..metrics import RUNS_ACCEPTED, RUNS_SEALED
from ..protocol.backoff import is_unsettled_at_claim
from ..protocol.children import stages_child_result
from ..protocol.fencing import hash_lease_token, new_lease_token
from ..protocol.webhook_filter import subscription_wants
from .dialect import db_now, dialect_name, insert_ignoring_conflicts
from .engine import after_commit, key_ring_of, read_transaction, write_transaction
from .tables import outbox, run_attempts, runs, subscriptions, threads

__all__ = (
    "BACKLOG_COUNT_CAP",
    "ClaimedRow",
    "Backlog",
    "new_outbox_id",
    "enqueue_once",
    "stage_run_event",
    "stage_run_transition",
    "stage_seal_rows",
    "count_accepted",
    "claim_rows",
    "Settlement",
    "settlement_values",
    "group_settlements",
    "settle_many",
    "settle",
    "purge",
    "redeliver",
    "read_backlog",
    "read_runs_backlog",
    "has_dead",
)

BACKLOG_COUNT_CAP = 10000
"""`candor_backlog_size` counts at most this many rows (§10.4)."""

Outcome = Literal["delivered", "dead", "retry", "deferred"]

_RUN_VIEW_FIELDS = (
    "id", "thread_id", "agent", "status", "trigger", "lineage", "parent_run_id", "wait_reason", "attempts",
    "max_attempts", "checkpoint_seq", "failure", "created_at", "started_at", "sealed_at",
)
_ATTEMPT_VIEW_FIELDS = (
    "id", "run_id", "number", "status", "start_reason", "replaces_attempt_id", "worker_id", "yield_reason", "failure",
    "created_at", "started_at", "finished_at",
)


def new_outbox_id(token_hex: Callable[[int], str] = secrets.token_hex) -> str:
    return "obx_" + token_hex(16)


@dataclass(frozen=True, kw_only=True, slots=True)
class ClaimedRow:
    """One leased outbox row; `token` fences its settle (S-111)."""

    id: str
    kind: str
    dedupe_key: str
    target: str | None
    payload: dict[str, Any]
    signing_secret: str | None
    subscription_id: str | None
    attempts: int
    created_at: float
    token: bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class Backlog:
    size: int
    """Due or leased pending rows, capped at `BACKLOG_COUNT_CAP`."""
    oldest_age_seconds: float


# --- staging (inside the caller's transaction) -------------------------------------------------------------------


async def enqueue_once(
    conn: AsyncConnection,
    *,
    kind: str,
    dedupe_key: str,
    target: str | None,
    payload: Mapping[str, Any],
    workspace_id: str,
    subscription_id: str | None = None,
    signing_secret: str | None = None,
    status: Literal["pending", "dead"] = "pending",
    last_error: str | None = None,
    row_id: str | None = None,
) -> bool:
    """S-107: insert one row unless `(kind, dedupe_key)` already exists; returns whether a row was added."""
    now = db_now()
    values = dict(
        id=row_id or new_outbox_id(),
        workspace_id=workspace_id,
        kind=kind,
        dedupe_key=dedupe_key,
        target=target,
        payload=dict(payload),
        signing_secret=signing_secret,
        subscription_id=subscription_id,
        status=status,
        available_at=now,
        attempts=0,
        last_error=None if last_error is None else last_error[:1024],
        created_at=now,
        settled_at=now if status != "pending" else None,
    )
    statement = insert_ignoring_conflicts(outbox, dialect_name(conn), index_elements=("kind", "dedupe_key"))
    result = await conn.execute(statement.values(**values))
    return bool(result.rowcount)


def _view(row: Mapping[Any, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {name: row[name] for name in names}


async def stage_run_event(
    conn: AsyncConnection,
    *,
    event_type: str,
    run_row_or_id: Mapping[str, Any] | Any,
    workspace_id: str | None = None,
    attempt_id: str | None = None,
) -> int:
    """S-106: stage one `webhook` row per enabled subscription of the run's workspace that wants `event_type`.

    Call it in the transaction that makes the transition, after the write, so the payload shows the new state.
    `run_attempt.*` events need `attempt_id`. The row copies the subscription's URL and encrypted secret (S-119);
    a secret that cannot be decrypted now is staged `dead` with `signing_secret_unavailable` (§9.4). Returns the
    number of rows staged.
    """
    run_id = run_row_or_id if isinstance(run_row_or_id, str) else getattr(run_row_or_id, "id", None)
    if run_id is None:
        run_id = run_row_or_id["id"]
    if workspace_id is None:
        workspace_id = (await conn.execute(select(runs.c.workspace_id).where(runs.c.id == run_id))).scalar_one()
    subs = (
        await conn.execute(
            select(subscriptions).where(subscriptions.c.workspace_id == workspace_id, subscriptions.c.enabled)
        )
    ).mappings().all()
    if not subs:
        return 0
    run = (await conn.execute(select(runs).where(runs.c.id == run_id))).mappings().one()
    wanted = [sub for sub in subs if subscription_wants(sub, event_type, run)]
    if not wanted:
        return 0
    if event_type.startswith("run_attempt."):
        if attempt_id is None:
            raise ValueError(f"{event_type} needs attempt_id")
        attempt = (await conn.execute(select(run_attempts).where(run_attempts.c.id == attempt_id))).mappings().one()
        data: dict[str, Any] = {"attempt": _view(attempt, _ATTEMPT_VIEW_FIELDS)}
    else:
        data = {"run": _view(run, _RUN_VIEW_FIELDS)}
    created_at = float((await conn.execute(select(db_now()))).scalar_one())
    payload = {"type": event_type, "created_at": created_at, "data": data}
    staged = 0
    for sub in wanted:
        readable = key_ring_of(conn).decrypt_secret(sub["signing_secret"]) is not None
        # One row per (subscription, event, run, attempt): each transition happens once.
        key = f"{sub['id']}:{event_type}:{run_id}:{attempt_id or '-'}"
        staged += await enqueue_once(
            conn,
            kind="webhook",
            dedupe_key=key,
            target=sub["url"],
            payload=payload,
            workspace_id=workspace_id,
            subscription_id=sub["id"],
            signing_secret=sub["signing_secret"],
            status="pending" if readable else "dead",
            last_error=None if readable else "signing_secret_unavailable",
        )
    return staged


async def stage_run_transition(
    conn: AsyncConnection,
    *,
    run_id: str,
    run_status: str | None,
    attempt_id: str | None = None,
    attempt_status: str | None = None,
    workspace_id: str | None = None,
) -> None:
    """Stage `run.<run_status>` and/or `run_attempt.<attempt_status>` for one transition (S-106)."""
    if run_status is not None:
        await stage_run_event(
            conn, event_type=f"run.{run_status}", run_row_or_id=run_id, workspace_id=workspace_id,
            attempt_id=attempt_id,
        )
    if attempt_status is not None and attempt_id is not None:
        await stage_run_event(
            conn, event_type=f"run_attempt.{attempt_status}", run_row_or_id=run_id, workspace_id=workspace_id,
            attempt_id=attempt_id,
        )


def count_accepted(conn: AsyncConnection, *, trigger: str) -> None:
    """`candor_runs_accepted_total{trigger}` once the creating transaction commits."""
    after_commit(conn, RUNS_ACCEPTED.labels(trigger=trigger).inc)


async def stage_seal_rows(conn: AsyncConnection, *, run_id: str, attempt_id: str | None) -> None:
    """§7.10: a sealed run's `run.<status>` and `run_attempt.<status>` webhooks, its `checkpoint_cleanup` row and,
    on a child thread, its `child_result` row (§9.5)."""
    query = select(
        runs.c.workspace_id, runs.c.thread_id, runs.c.status, runs.c.failure, runs.c.wait_reason
    ).where(runs.c.id == run_id)
    run = (await conn.execute(query)).one()
    attempt_status = None
    if attempt_id is not None:
        attempt_status = (
            await conn.execute(select(run_attempts.c.status).where(run_attempts.c.id == attempt_id))
        ).scalar_one_or_none()
    await stage_run_transition(
        conn, run_id=run_id, run_status=run.status, attempt_id=attempt_id, attempt_status=attempt_status,
        workspace_id=run.workspace_id,
    )
    reason = (run.failure or {}).get("code") or run.wait_reason or run.status
    after_commit(conn, RUNS_SEALED.labels(status=run.status, reason=reason).inc)
    await enqueue_once(
        conn, kind="checkpoint_cleanup", dedupe_key=run_id, target=run_id, payload={"run_id": run_id},
        workspace_id=run.workspace_id,
    )
    origin = (
        await conn.execute(select(threads.c.origin, threads.c.origin_thread_id).where(threads.c.id == run.thread_id))
    ).one()
    if stages_child_result(thread_origin=origin.origin, status=run.status):
        # §7.10, S-118: one `child_result` row per non-waiting seal on a child thread; target = the parent thread.
        await enqueue_once(
            conn, kind="child_result", dedupe_key=run_id, target=origin.origin_thread_id,
            payload={"child_run_id": run_id}, workspace_id=run.workspace_id,
        )


# --- claim and settle (own transactions) -------------------------------------------------------------------------


async def claim_rows(
    engine: AsyncEngine,
    *,
    kind: str,
    limit: int,
    lease_seconds: float,
    max_attempts: int,
    owner: str | None = None,
    randbytes: Callable[[int], bytes] = secrets.token_bytes,
) -> list[ClaimedRow]:
    """§9.2 in one transaction: lease up to `limit` due rows of `kind`, oldest `available_at` first.

    Each claim increments `attempts` and stores the hashed token with `lease_expires_at = now + lease_seconds`. A
    row already at `max_attempts` (its last claim lapsed without a settle) is settled `dead`/`unsettled` (S-110)
    and not returned.
    """
    if limit < 1:
        return []
    o = outbox.c
    claimed: list[ClaimedRow] = []
    async with write_transaction(engine) as conn:
        now = float((await conn.execute(select(db_now()))).scalar_one())
        rows = (
            await conn.execute(
                select(outbox)
                .where(
                    o.kind == kind,
                    o.status == "pending",
                    o.available_at <= now,
                    or_(o.lease_expires_at.is_(None), o.lease_expires_at <= now),
                )
                .order_by(o.available_at, o.id)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
        ).mappings().all()
        lapsed = {
            row["id"] for row in rows if is_unsettled_at_claim(attempts=row["attempts"], max_attempts=max_attempts)
        }
        if lapsed:
            await conn.execute(
                update(outbox)
                .where(o.id.in_(sorted(lapsed)))
                .values(status="dead", last_error="unsettled", settled_at=now, lease_token_hash=None,
                        lease_expires_at=None, lease_owner=None)
            )
        leases: list[dict[str, Any]] = []
        for row in rows:
            if row["id"] in lapsed:
                continue
            token = new_lease_token(randbytes)
            leases.append({"claimed_id": row["id"], "claimed_hash": hash_lease_token(token)})
            claimed.append(
                ClaimedRow(
                    id=row["id"], kind=row["kind"], dedupe_key=row["dedupe_key"], target=row["target"],
                    payload=dict(row["payload"] or {}), signing_secret=row["signing_secret"],
                    subscription_id=row["subscription_id"], attempts=row["attempts"] + 1,
                    created_at=row["created_at"], token=token,
                )
            )
        if leases:  # one executemany (a single pipelined round trip on asyncpg), not one UPDATE per row
            await conn.execute(
                update(outbox)
                .where(o.id == bindparam("claimed_id"))
                .values(attempts=o.attempts + 1, lease_owner=owner, lease_token_hash=bindparam("claimed_hash"),
                        lease_expires_at=now + lease_seconds),
                leases,
            )
    return claimed


@dataclass(frozen=True, kw_only=True, slots=True)
class Settlement:
    """How one claimed row is to be settled; `token` is the claim's token, which fences the settle (S-111)."""

    row_id: str
    token: bytes
    outcome: Outcome
    error: str | None = None
    delay_seconds: float = 0.0
    payload: Mapping[str, Any] | None = None


def settlement_values(settlement: Settlement, *, now: Any) -> dict[str, Any]:
    """The column values a settle writes (§9.2): the lease is cleared; `retry`/`deferred` make the row due after
    `delay_seconds` and `deferred` gives the attempt back (S-112); `error` is kept, `payload` replaces the stored
    one (a handler's cursor)."""
    values: dict[str, Any] = {"lease_token_hash": None, "lease_expires_at": None, "lease_owner": None}
    if settlement.error is not None:
        values["last_error"] = settlement.error[:1024]
    if settlement.payload is not None:
        values["payload"] = dict(settlement.payload)
    match settlement.outcome:
        case "delivered":
            values.update(status="delivered", delivered_at=now, settled_at=now)
        case "dead":
            values.update(status="dead", settled_at=now)
        case "retry":
            values.update(available_at=now + settlement.delay_seconds)
        case "deferred":
            values.update(available_at=now + settlement.delay_seconds, attempts=outbox.c.attempts - 1)
        case _:
            raise ValueError(f"unknown outcome {settlement.outcome!r}")
    return values


def group_settlements(settlements: Sequence[Settlement]) -> list[list[Settlement]]:
    """Settlements that write the same values, in first-seen order, so each group is one UPDATE.

    The common case, a batch of `delivered` rows, is one group. A settlement with a `payload` is its own group
    (payloads differ per row); retries usually differ in their random backoff. Within a group every row is still
    matched on its own `(id, token hash)` pair, so each settle stays fenced by its own token (S-111).
    """
    groups: dict[tuple[Any, ...], list[Settlement]] = {}
    for index, settlement in enumerate(settlements):
        key: tuple[Any, ...] = (settlement.outcome, settlement.error, settlement.delay_seconds)
        if settlement.payload is not None:
            key = ("payload", index)
        groups.setdefault(key, []).append(settlement)
    return list(groups.values())


async def settle_many(engine: AsyncEngine, settlements: Sequence[Settlement]) -> set[str]:
    """§9.2 for a batch in one transaction: settle each row only while it is `pending` and its own token is its
    current claim (S-111); a stale settlement changes nothing and the others still apply. Returns the ids of
    the rows that changed."""
    if not settlements:
        return set()
    o = outbox.c
    now = db_now()
    changed: set[str] = set()
    async with write_transaction(engine) as conn:
        for group in group_settlements(settlements):
            fences = [(item.row_id, hash_lease_token(item.token)) for item in group]
            result = await conn.execute(
                update(outbox)
                .where(o.status == "pending", tuple_(o.id, o.lease_token_hash).in_(fences))
                .values(**settlement_values(group[0], now=now))
                .returning(o.id)
            )
            changed.update(result.scalars().all())
    return changed


async def settle(
    engine: AsyncEngine,
    *,
    row_id: str,
    token: bytes,
    outcome: Outcome,
    error: str | None = None,
    delay_seconds: float = 0.0,
    payload: Mapping[str, Any] | None = None,
) -> bool:
    """§9.2: settle one claimed row; only while it is `pending` and `token` is its current claim (S-111).

    `retry` and `deferred` make it due again after `delay_seconds`; `deferred` also gives the attempt back (S-112).
    `payload`, when given, replaces the stored payload (a handler's cursor). Returns whether the row changed.
    """
    settlement = Settlement(
        row_id=row_id, token=token, outcome=outcome, error=error, delay_seconds=delay_seconds, payload=payload
    )
    return row_id in await settle_many(engine, [settlement])


async def purge(
    engine: AsyncEngine,
    *,
    kind: str,
    delivered_retention_seconds: float,
    dead_retention_seconds: float,
    batch: int,
) -> int:
    """S-115: delete at most `batch` settled rows of `kind` whose `settled_at` is older than their retention."""
    o = outbox.c
    async with write_transaction(engine) as conn:
        now = float((await conn.execute(select(db_now()))).scalar_one())
        expired = or_(
            and_(o.status == "delivered", o.settled_at < now - delivered_retention_seconds),
            and_(o.status == "dead", o.settled_at < now - dead_retention_seconds),
        )
        ids = (
            await conn.execute(
                select(o.id).where(o.kind == kind, o.status != "pending", expired).order_by(o.settled_at).limit(batch)
            )
        ).scalars().all()
        if not ids:
            return 0
        result = await conn.execute(delete(outbox).where(o.id.in_(ids), o.status != "pending"))
    return int(result.rowcount or 0)


async def redeliver(conn: AsyncConnection, row_id: str, *, workspace_id: str | None = None) -> None:
    """S-114 (§9.7): a `dead` webhook row back to `pending` with `attempts = 0`, same id, URL, payload and secret.

    Raises `NotFound`, `Conflict("not_dead")`, or `Conflict("signing_secret_unavailable")`.
    """
    o = outbox.c
    query = select(o.id, o.kind, o.status, o.signing_secret, o.workspace_id).where(o.id == row_id)
    row = (await conn.execute(query.with_for_update())).mappings().one_or_none()
    if row is None or (workspace_id is not None and row["workspace_id"] != workspace_id):
        raise NotFound("delivery", row_id)
    if row["status"] != "dead":
        raise Conflict("not_dead", kind="delivery", id=row_id)
    if row["kind"] == "webhook" and key_ring_of(conn).decrypt_secret(row["signing_secret"]) is None:
        raise Conflict("signing_secret_unavailable", kind="delivery", id=row_id)
    await conn.execute(
        update(outbox)
        .where(o.id == row_id, o.status == "dead")
        .values(status="pending", attempts=0, available_at=db_now(), settled_at=None, delivered_at=None,
                lease_token_hash=None, lease_expires_at=None, lease_owner=None)
    )


# --- backlog (report_backlog) ------------------------------------------------------------------------------------


async def read_backlog(engine: AsyncEngine, *, kind: str) -> Backlog:
    """Pending rows of `kind` that are due (count capped) and the age of the oldest one (§10.4)."""
    o = outbox.c
    async with read_transaction(engine) as conn:
        now = float((await conn.execute(select(db_now()))).scalar_one())
        due = select(o.available_at).where(o.kind == kind, o.status == "pending", o.available_at <= now)
        size = (await conn.execute(select(func.count()).select_from(due.limit(BACKLOG_COUNT_CAP).subquery()))).scalar()
        oldest = (await conn.execute(select(func.min(o.available_at)).where(
            o.kind == kind, o.status == "pending", o.available_at <= now))).scalar()
    return Backlog(size=int(size or 0), oldest_age_seconds=0.0 if oldest is None else max(0.0, now - oldest))


async def read_runs_backlog(engine: AsyncEngine) -> Backlog:
    """Accepted runs that are due (count capped) and the age of the oldest one (`queue="runs"`)."""
    r = runs.c
    async with read_transaction(engine) as conn:
        now = float((await conn.execute(select(db_now()))).scalar_one())
        due = select(r.id).where(r.status == "accepted", r.available_at <= now)
        size = (await conn.execute(select(func.count()).select_from(due.limit(BACKLOG_COUNT_CAP).subquery()))).scalar()
        oldest = (await conn.execute(select(func.min(r.available_at)).where(
            r.status == "accepted", r.available_at <= now))).scalar()
    return Backlog(size=int(size or 0), oldest_age_seconds=0.0 if oldest is None else max(0.0, now - oldest))


async def has_dead(engine: AsyncEngine, *, kind: str) -> bool:
    """S-116: whether any `dead` row of `kind` is retained."""
    async with read_transaction(engine) as conn:
        found = (
            await conn.execute(select(outbox.c.id).where(outbox.c.kind == kind, outbox.c.status == "dead").limit(1))
        ).first()
    return found is not None
