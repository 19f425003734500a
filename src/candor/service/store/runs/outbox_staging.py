"""Outbox staging (§9.1): the rows a state change stages in its own transaction.

* `enqueue_once(conn, …)` inserts one row unless `(kind, dedupe_key)` exists (S-107);
* `stage_run_event` stages the webhook rows of one run or attempt transition for every matching enabled
  subscription (S-106), `stage_run_transition` the run and attempt events of one transition;
* `stage_seal_rows` the webhooks, the `checkpoint_cleanup` row and, on a child thread, the `child_result` row of a
  seal. All run inside the transaction that makes the change.

Claiming and settling rows is `store/outbox/claims.py`; purge, redelivery and the backlog gauges are
`store/outbox/backlog.py`; the cleanup itself is `store/outbox/cleanup.py`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import ColumnElement, Label, RowMapping, exists, select
from sqlalchemy.ext.asyncio import AsyncConnection

from ...metrics import RUNS_ACCEPTED, RUNS_SEALED
from ...protocol.children import stages_child_result
from ...protocol.webhook_filter import subscription_wants
from ..db.dialect import dialect_name
from ..db.engine import after_commit, key_ring_of
from ..schema.dialect import db_now, insert_ignoring_conflicts
from ..schema.tables import outbox, run_attempts, runs, subscriptions, threads
from .current_checkpoint import run_columns

__all__ = (
    "new_outbox_id",
    "enqueue_once",
    "stage_run_event",
    "stage_run_transition",
    "stage_seal_rows",
    "SealedRun",
    "workspace_has_subscriptions",
    "count_accepted",
)

_RUN_VIEW_FIELDS = (
    "id",
    "thread_id",
    "agent",
    "status",
    "trigger",
    "lineage",
    "parent_run_id",
    "wait_reason",
    "attempts",
    "max_attempts",
    "checkpoint_seq",
    "failure",
    "created_at",
    "started_at",
    "sealed_at",
)
_ATTEMPT_VIEW_FIELDS = (
    "id",
    "run_id",
    "number",
    "status",
    "start_reason",
    "replaces_attempt_id",
    "worker_id",
    "yield_reason",
    "failure",
    "created_at",
    "started_at",
    "finished_at",
)


def new_outbox_id(token_hex: Callable[[int], str] = secrets.token_hex) -> str:
    return "obx_" + token_hex(16)


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


def workspace_has_subscriptions(workspace_id: ColumnElement[Any]) -> Label[bool]:
    """Whether the workspace of `workspace_id` (a column of the caller's query) has an enabled subscription, as a
    column named `workspace_has_subscriptions`.

    A transition's own read (the claim, the fence, a resume's thread lock) carries it, so a transition in a
    workspace without subscriptions stages no webhook without looking them up (`has_subscriptions=False`, S-106).
    Read in the transaction that stages, it sees what that transaction's own lookup would have seen.
    """
    s = subscriptions.c
    return exists().where(s.workspace_id == workspace_id, s.enabled).label("workspace_has_subscriptions")


async def _enabled_subscriptions(conn: AsyncConnection, workspace_id: str) -> Sequence[RowMapping]:
    query = select(subscriptions).where(subscriptions.c.workspace_id == workspace_id, subscriptions.c.enabled)
    return (await conn.execute(query)).mappings().all()


async def stage_run_event(
    conn: AsyncConnection,
    *,
    event_type: str,
    run_row_or_id: Mapping[str, Any] | Any,
    workspace_id: str | None = None,
    attempt_id: str | None = None,
    has_subscriptions: bool | None = None,
) -> int:
    """S-106: stage one `webhook` row per enabled subscription of the run's workspace that wants `event_type`.

    Call it in the transaction that makes the transition, after the write, so the payload shows the new state.
    `run_attempt.*` events need `attempt_id`. The row copies the subscription's URL and encrypted secret (S-119);
    a secret that cannot be decrypted now is staged `dead` with `signing_secret_unavailable` (§9.4). Returns the
    number of rows staged. `has_subscriptions=False`: the caller read, in this transaction, that the workspace has
    no enabled subscription (`workspace_has_subscriptions`), so there is nothing to look up.
    """
    return await _stage_run_events(
        conn,
        event_types=(event_type,),
        run_row_or_id=run_row_or_id,
        workspace_id=workspace_id,
        attempt_id=attempt_id,
        has_subscriptions=has_subscriptions,
    )


async def _stage_run_events(
    conn: AsyncConnection,
    *,
    event_types: Sequence[str],
    run_row_or_id: Mapping[str, Any] | Any,
    workspace_id: str | None,
    attempt_id: str | None,
    has_subscriptions: bool | None,
) -> int:
    """`stage_run_event` for the events of one transition, with one lookup of the subscriptions for all of them."""
    if has_subscriptions is False or not event_types:
        return 0
    run_id = run_row_or_id if isinstance(run_row_or_id, str) else getattr(run_row_or_id, "id", None)
    if run_id is None:
        run_id = run_row_or_id["id"]
    if workspace_id is None:
        workspace_id = (await conn.execute(select(runs.c.workspace_id).where(runs.c.id == run_id))).scalar_one()
    subs = await _enabled_subscriptions(conn, workspace_id)
    if not subs:
        return 0
    run = (await conn.execute(select(*run_columns()).where(runs.c.id == run_id))).mappings().one()
    staged = 0
    for event_type in event_types:
        wanted = [sub for sub in subs if subscription_wants(sub, event_type, run)]
        if not wanted:
            continue
        if event_type.startswith("run_attempt."):
            if attempt_id is None:
                raise ValueError(f"{event_type} needs attempt_id")
            query = select(run_attempts).where(run_attempts.c.id == attempt_id)
            attempt = (await conn.execute(query)).mappings().one()
            data: dict[str, Any] = {"attempt": _view(attempt, _ATTEMPT_VIEW_FIELDS)}
        else:
            data = {"run": _view(run, _RUN_VIEW_FIELDS)}
        created_at = float((await conn.execute(select(db_now()))).scalar_one())
        payload = {"type": event_type, "created_at": created_at, "data": data}
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
    has_subscriptions: bool | None = None,
) -> None:
    """Stage `run.<run_status>` and/or `run_attempt.<attempt_status>` for one transition (S-106), looking the
    workspace's subscriptions up once for both; `has_subscriptions` as for `stage_run_event`."""
    event_types = []
    if run_status is not None:
        event_types.append(f"run.{run_status}")
    if attempt_status is not None and attempt_id is not None:
        event_types.append(f"run_attempt.{attempt_status}")
    await _stage_run_events(
        conn,
        event_types=event_types,
        run_row_or_id=run_id,
        workspace_id=workspace_id,
        attempt_id=attempt_id,
        has_subscriptions=has_subscriptions,
    )


def count_accepted(conn: AsyncConnection, *, trigger: str) -> None:
    """`candor_runs_accepted_total{trigger}` once the creating transaction commits."""
    after_commit(conn, RUNS_ACCEPTED.labels(trigger=trigger).inc)


@dataclass(frozen=True, kw_only=True, slots=True)
class SealedRun:
    """What a seal already knows about the run it sealed, so staging its rows reads none of it again."""

    workspace_id: str
    thread_id: str
    status: str
    failure: Mapping[str, Any] | None
    wait_reason: str | None
    attempt_status: str | None
    thread_origin: str
    origin_thread_id: str | None
    workspace_has_subscriptions: bool | None

    @property
    def reason(self) -> str:
        """`candor_runs_sealed_total`'s label: the failure code, else the wait reason, else the status."""
        return (self.failure or {}).get("code") or self.wait_reason or self.status


async def _read_sealed_run(conn: AsyncConnection, *, run_id: str, attempt_id: str | None) -> SealedRun:
    r, t = runs.c, threads.c
    query = (
        select(r.workspace_id, r.thread_id, r.status, r.failure, r.wait_reason, t.origin, t.origin_thread_id)
        .join_from(runs, threads, t.id == r.thread_id)
        .where(r.id == run_id)
    )
    run = (await conn.execute(query)).one()
    attempt_status = None
    if attempt_id is not None:
        query = select(run_attempts.c.status).where(run_attempts.c.id == attempt_id)
        attempt_status = (await conn.execute(query)).scalar_one_or_none()
    return SealedRun(
        workspace_id=run.workspace_id,
        thread_id=run.thread_id,
        status=run.status,
        failure=run.failure,
        wait_reason=run.wait_reason,
        attempt_status=attempt_status,
        thread_origin=run.origin,
        origin_thread_id=run.origin_thread_id,
        workspace_has_subscriptions=None,
    )


async def stage_seal_rows(
    conn: AsyncConnection, *, run_id: str, attempt_id: str | None, sealed: SealedRun | None = None
) -> None:
    """§7.10: a sealed run's `run.<status>` and `run_attempt.<status>` webhooks, its `checkpoint_cleanup` row and,
    on a child thread, its `child_result` row (§9.5). `sealed`: what the sealing transaction knows of the run as it
    now is; without it, that is read."""
    run = sealed if sealed is not None else await _read_sealed_run(conn, run_id=run_id, attempt_id=attempt_id)
    await stage_run_transition(
        conn,
        run_id=run_id,
        run_status=run.status,
        attempt_id=attempt_id,
        attempt_status=run.attempt_status,
        workspace_id=run.workspace_id,
        has_subscriptions=run.workspace_has_subscriptions,
    )
    after_commit(conn, RUNS_SEALED.labels(status=run.status, reason=run.reason).inc)
    await enqueue_once(
        conn,
        kind="checkpoint_cleanup",
        dedupe_key=run_id,
        target=run_id,
        payload={"run_id": run_id},
        workspace_id=run.workspace_id,
    )
    if stages_child_result(thread_origin=run.thread_origin, status=run.status):
        # §7.10, S-118: one `child_result` row per non-waiting seal on a child thread; target = the parent thread.
        await enqueue_once(
            conn,
            kind="child_result",
            dedupe_key=run_id,
            target=run.origin_thread_id,
            payload={"child_run_id": run_id},
            workspace_id=run.workspace_id,
        )
