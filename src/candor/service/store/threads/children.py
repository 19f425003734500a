"""Child runs in the store (§7.13, §9.5): the fenced spawn of a child thread and run, and the delivery of its result.

`spawn_child()` is an execution-dependent write of the parent's attempt: it starts with `runs.lock_fenced()`, so it
holds the parent's thread → run → attempt locks while it looks for an earlier spawn of the same tool call, counts
the run's children, measures the nesting depth and inserts the child thread, its first entry and its `accepted`
run. Holding the parent run's lock makes "look up, then insert" race-free per (parent run, tool call id): a replay
after a crash returns the child the first call created (docs/child-runs.md).

`deliver_child_result()` is the body of the `child_result` outbox handler: under the parent thread's lock it asks
`protocol.children.plan_child_result()`, inserts the entry, and starts the parent's next run if it is idle (§8.5).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ...protocol.children import (
    ChildResultPlan,
    SpawnRefusal,
    child_input_payload,
    child_result_payload,
    plan_child_result,
    spawn_refusal,
)
from ...protocol.fencing import Lease
from ...runtime import Entropy
from ...settings import ServiceSettings
from ..db.engine import write_transaction
from ..runs.claims import lock_fenced
from ..schema.tables import inbox_entries, runs, threads
from .submit import (
    NewEntry,
    NewRun,
    advance_thread,
    append_entry,
    inbox_usage,
    insert_thread,
    lock_thread,
    new_id,
    payload_size,
    start_run,
    touch_thread,
)

__all__ = (
    "ChildSpawn",
    "SpawnedChild",
    "ChildResultOutcome",
    "select_child_of_call",
    "count_children",
    "select_thread_origin",
    "select_parent_run",
    "select_child_result_facts",
    "select_entry_of_child_run",
    "spawn_child",
    "deliver_child_result",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class ChildSpawn:
    """What the parent's `start_child_run` call asks for."""

    agent: str
    text: str
    """The child's input: the text of its thread's first entry."""
    tool_call_id: str
    """The parent's tool call; with the parent run it identifies the spawn (idempotent replay)."""
    allowed_agents: Collection[str]
    """`agents.<parent agent>.children` ∩ configured agents."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SpawnedChild:
    """The child a spawn created, or found when the same call was replayed (`created = False`)."""

    thread_id: str
    run_id: str
    created: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class ChildResultOutcome:
    """What the `child_result` handler did; `started_run_id` is a parent run it started (trigger `child_result`)."""

    plan: ChildResultPlan
    entry_id: str | None = None
    started_run_id: str | None = None


# --- statements --------------------------------------------------------------------------------------------------


def select_child_of_call(*, parent_run_id: str, tool_call_id: str) -> Select[Any]:
    """The child thread an earlier execution of this tool call created, with its spawned run."""
    t = threads.c
    return (
        select(t.id, runs.c.id.label("run_id"))
        .join(runs, (runs.c.thread_id == t.id) & (runs.c.trigger == "spawned"))
        .where(t.origin == "child", t.origin_run_id == parent_run_id, t.origin_tool_call_id == tool_call_id)
    )


def count_children(parent_run_id: str) -> Select[Any]:
    """§7.13: the child threads (one run each at spawn) a run started."""
    return (
        select(func.count())
        .select_from(threads)
        .where(threads.c.origin == "child", threads.c.origin_run_id == parent_run_id)
    )


def select_thread_origin(thread_id: str) -> Select[Any]:
    return select(threads.c.origin, threads.c.origin_thread_id).where(threads.c.id == thread_id)


def select_parent_run(run_id: str) -> Select[Any]:
    """What a child inherits from the parent run: its workspace, principal and frozen authority (§4.3)."""
    return select(runs.c.workspace_id, runs.c.principal_id, runs.c.authority).where(runs.c.id == run_id)


def select_child_result_facts(child_run_id: str) -> Select[Any]:
    """The child run's result and the origin of its thread."""
    return (
        select(
            runs.c.status,
            runs.c.output,
            runs.c.failure,
            runs.c.sealed_at,
            threads.c.origin,
            threads.c.origin_thread_id,
        )
        .join(threads, threads.c.id == runs.c.thread_id)
        .where(runs.c.id == child_run_id)
    )


def select_entry_of_child_run(child_run_id: str) -> Select[Any]:
    return select(inbox_entries.c.id).where(inbox_entries.c.child_run_id == child_run_id)


# --- operations --------------------------------------------------------------------------------------------------


async def _nesting_depth(conn: AsyncConnection, thread_id: str, *, limit: int) -> int:
    """How many child hops lead from `thread_id` up to a thread that is not a child (counted at most to `limit`)."""
    depth = 0
    current: str | None = thread_id
    while current is not None and depth <= limit:
        row = (await conn.execute(select_thread_origin(current))).one_or_none()
        if row is None or row.origin != "child":
            break
        depth += 1
        current = row.origin_thread_id
    return depth


async def spawn_child(
    engine: AsyncEngine,
    lease: Lease,
    spawn: ChildSpawn,
    *,
    settings: ServiceSettings,
    entropy: Entropy,
) -> SpawnedChild | SpawnRefusal:
    """§7.13 in one fenced transaction of the parent's attempt; raises `LeaseLost` before writing anything.

    A replay of the same tool call returns the child it created. Otherwise the limits are checked
    (`spawn_refusal`); a refusal writes nothing. A new child is a thread (`origin = child`, origin ids) with one
    `next_run` entry holding the input and an `accepted` run (trigger `spawned`, lineage `root`) acting with the
    parent run's principal and frozen authority.
    """
    async with write_transaction(engine) as conn:
        await lock_fenced(conn, lease)
        existing = (
            await conn.execute(select_child_of_call(parent_run_id=lease.run_id, tool_call_id=spawn.tool_call_id))
        ).first()
        if existing is not None:
            return SpawnedChild(thread_id=existing.id, run_id=existing.run_id, created=False)
        payload = child_input_payload(spawn.text)
        refusal = spawn_refusal(
            agent=spawn.agent,
            allowed_agents=spawn.allowed_agents,
            input_bytes=payload_size(payload) if spawn.text.strip() else 0,
            input_limit=settings.control.inbox_bytes,
            started_children=int((await conn.execute(count_children(lease.run_id))).scalar_one()),
            parent_depth=await _nesting_depth(conn, lease.thread_id, limit=settings.worker.child_depth),
            child_count=settings.worker.child_count,
            child_depth=settings.worker.child_depth,
        )
        if refusal is not None:
            return refusal
        parent = (await conn.execute(select_parent_run(lease.run_id))).one()
        thread_id = new_id("thr", entropy)
        await insert_thread(
            conn,
            thread_id=thread_id,
            workspace_id=parent.workspace_id,
            agent=spawn.agent,
            origin="child",
            origin_thread_id=lease.thread_id,
            origin_run_id=lease.run_id,
            origin_tool_call_id=spawn.tool_call_id,
        )
        entry = await append_entry(
            conn,
            NewEntry(
                workspace_id=parent.workspace_id,
                thread_id=thread_id,
                delivery="next_run",
                payload=payload,
                principal_id=parent.principal_id,
                authority=dict(parent.authority),
            ),
            entropy=entropy,
        )
        run = await start_run(
            conn,
            NewRun(
                workspace_id=parent.workspace_id,
                thread_id=thread_id,
                agent=spawn.agent,
                principal_id=parent.principal_id,
                authority=dict(parent.authority),
                options={},
                trigger="spawned",
                lineage="root",
                max_attempts=settings.worker.max_attempts,
                start_checkpoint_id=None,
                tool_recovery=settings.tool_recovery_for(spawn.agent, {}),
                source_entry_id=entry.id,
            ),
            entropy=entropy,
        )
    return SpawnedChild(thread_id=thread_id, run_id=run.id, created=True)


async def deliver_child_result(
    engine: AsyncEngine,
    *,
    child_run_id: str,
    parent_thread_id: str | None,
    settings: ServiceSettings,
    agent_names: Collection[str],
    entropy: Entropy,
) -> ChildResultOutcome:
    """§9.5, S-118 in one transaction: the parent thread gets at most one `child_result` entry for the child run.

    The entry is a `steer` entry without options, so an active parent run receives it at a later commit; an idle
    parent starts a run with trigger `child_result` right here (§8.5, `advance_thread`).
    """
    async with write_transaction(engine) as conn:
        facts = (await conn.execute(select_child_result_facts(child_run_id))).one_or_none()
        parent = (
            None if parent_thread_id is None else await lock_thread(conn, thread_id=parent_thread_id, workspace_id=None)
        )
        target_valid = (
            parent is not None
            and facts is not None
            and facts.origin == "child"
            and facts.origin_thread_id == parent_thread_id
            and facts.sealed_at is not None
            and facts.status != "waiting"
        )
        payload: dict[str, Any] = {}
        usage_count = usage_bytes = 0
        already_entered = False
        if target_valid:
            assert facts is not None and parent_thread_id is not None
            payload = child_result_payload(
                child_run_id=child_run_id, status=facts.status, output=facts.output, failure=facts.failure
            )
            already_entered = (await conn.execute(select_entry_of_child_run(child_run_id))).first() is not None
            usage = await inbox_usage(conn, thread_id=parent_thread_id)
            usage_count, usage_bytes = usage.count, usage.bytes
        plan = plan_child_result(
            target_valid=target_valid,
            parent_archived=parent is not None and parent.archived_at is not None,
            already_entered=already_entered,
            inbox_count=usage_count,
            inbox_bytes=usage_bytes,
            entry_bytes=payload_size(payload),
            count_limit=settings.control.inbox_count,
            bytes_limit=settings.control.inbox_bytes,
        )
        if plan != "insert":
            return ChildResultOutcome(plan=plan)
        assert parent is not None and parent_thread_id is not None
        entry = await append_entry(
            conn,
            NewEntry(
                workspace_id=parent.workspace_id,
                thread_id=parent_thread_id,
                kind="child_result",
                delivery="steer",
                payload=payload,
                principal_id=None,
                authority=None,
                child_run_id=child_run_id,
            ),
            entropy=entropy,
        )
        await touch_thread(conn, thread_id=parent_thread_id, inbox_changed=True)  # S-75
        started = await advance_thread(
            conn, thread_id=parent_thread_id, settings=settings, agent_names=agent_names, entropy=entropy
        )
    return ChildResultOutcome(plan=plan, entry_id=entry.id, started_run_id=started)
