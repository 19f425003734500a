"""Thread commands (§8.3, §8.5): create a thread, post a message to its inbox, archive it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core import Service
from ..errors import Conflict, EntryTooLarge, NotFound, PreconditionFailed, RateLimited
from ..protocol.authority import Principal
from ..protocol.idempotency import request_digest
from ..protocol.inbox import inbox_would_overflow
from ..protocol.requests import (
    Delivery,
    checked_delivery,
    checked_history,
    checked_input,
    checked_key,
    checked_options,
    require,
    still_there,
)
from ..store import reads as views
from ..store import threads
from ..store import threads as interrupts
from ..store import workspaces as auth
from ..store.checkpoints import import_history
from ..store.db import write_transaction
from ..store.reads import ThreadRow
from .acceptance import (
    Accepted,
    accepted,
    answer,
    check_steer,
    checked_agent,
    checked_client_tool_names,
    input_run,
    may_write,
    new_message,
    replay,
    with_optional,
    woken,
)

__all__ = ("create_thread", "post_input", "archive_thread", "thread_etag", "check_entry_fits")


def thread_etag(thread: ThreadRow) -> str:
    """§8.1: the thread's ETag, as a stale `If-Match` is answered with it (412 `details.current_etag`)."""
    return f'"{thread.id}:{thread.version}"'


async def create_thread(
    service: Service,
    principal: Principal,
    *,
    agent: str,
    input: Any,  # noqa: A002 - the spec's field name
    options: Mapping[str, Any] | None = None,
    message_history: Any = None,
    key: str,
) -> Accepted:
    """`POST /v1/threads`: a thread, its first entry and (the thread being idle) its first run (S-45, S-65)."""
    require(principal, "run")
    key = checked_key(key)
    payload, agent, checked = checked_input(input), checked_agent(service, agent), checked_options(options)
    check_entry_fits(service, threads.payload_size(payload))
    checked_client_tool_names(service, agent, checked)
    history = checked_history(message_history)
    body = with_optional(
        {"agent": agent, "input": payload}, options=checked, message_history=None if history is None else history[1]
    )
    digest = request_digest("thread", "", body)

    async def attempt() -> Accepted:
        async with write_transaction(service.engine) as conn:
            if (found := await replay(conn, principal, key, digest)) is not None:
                return found
            facts = await auth.read_authority(conn, principal.id)
            may_write(facts, principal)
            thread_id = threads.new_id("thr", service.entropy)
            base_id = None if history is None else threads.new_id("ckp", service.entropy)
            await threads.insert_thread(
                conn, thread_id=thread_id, workspace_id=principal.workspace_id, agent=agent, base_checkpoint_id=base_id
            )
            if history is not None:  # S-45: stored once, as the thread's seq-0 checkpoint
                await import_history(conn, thread_id, history[0], checkpoint_id=base_id)
            message = new_message(
                principal,
                facts,
                thread_id,
                payload,
                key=key,
                digest=digest,
                kind="thread",
                agent=agent,
                options=checked,
            )
            entry = await threads.append_entry(conn, message, entropy=service.entropy)
            run = input_run(
                service,
                principal,
                facts,
                entry,
                agent=agent,
                options=checked or {},
                lineage="root",
                parent_run_id=None,
                start_checkpoint_id=base_id,
            )
            await threads.start_run(conn, run, entropy=service.entropy)
            return await accepted(conn, principal, entry, created=True)

    return woken(service, await answer(attempt))


async def post_input(
    service: Service,
    principal: Principal,
    thread_id: str,
    *,
    input: Any,  # noqa: A002 - the spec's field name
    delivery: Delivery = "next_run",
    agent: str | None = None,
    options: Mapping[str, Any] | None = None,
    key: str,
) -> Accepted:
    """`POST /v1/threads/{id}/inbox`, §8.5: idle or paused → a run starts (S-65, S-70); active → the entry waits
    (S-66, S-68); waiting → it queues (S-69); archived → 409 (S-64); inbox full → 429 (S-73)."""
    require(principal, "run")
    key = checked_key(key)
    payload, checked = checked_input(input), checked_options(options)
    check_entry_fits(service, threads.payload_size(payload))
    delivery = checked_delivery(delivery)
    if agent is not None:
        checked_agent(service, agent)
        checked_client_tool_names(service, agent, checked)
    digest = request_digest(
        "message", thread_id, with_optional({"input": payload, "delivery": delivery}, agent=agent, options=checked)
    )

    async def attempt() -> Accepted:
        async with write_transaction(service.engine) as conn:
            if (found := await replay(conn, principal, key, digest)) is not None:
                return found
            thread = await threads.lock_thread(conn, thread_id=thread_id, workspace_id=principal.workspace_id)
            if thread is None:
                raise NotFound("thread", thread_id)
            facts = await auth.read_authority(conn, principal.id)
            may_write(facts, principal)
            if thread.state == "archived":
                raise Conflict("archived", kind="thread", id=thread_id)
            if agent is None:
                checked_client_tool_names(service, thread.agent, checked)
            if thread.state == "active" and delivery == "steer":
                await check_steer(conn, thread, agent, checked)
            await check_inbox_room(service, conn, thread_id, added_count=1, added_bytes=threads.payload_size(payload))
            message = new_message(
                principal,
                facts,
                thread_id,
                payload,
                key=key,
                digest=digest,
                kind="message",
                delivery=delivery,
                agent=agent,
                options=checked,
            )
            entry = await threads.append_entry(conn, message, entropy=service.entropy)
            if thread.state in ("idle", "paused"):  # S-65, S-70
                point = await threads.start_point(conn, thread)
                run = input_run(
                    service,
                    principal,
                    facts,
                    entry,
                    agent=agent or point.agent,
                    options=point.options if checked is None else checked,
                    lineage=point.lineage,
                    parent_run_id=point.parent_run_id,
                    start_checkpoint_id=point.start_checkpoint_id,
                )
                await threads.start_run(conn, run, entropy=service.entropy)
            await threads.touch_thread(conn, thread_id=thread_id, inbox_changed=True)  # S-75
            return await accepted(conn, principal, entry, created=True)

    return woken(service, await answer(attempt))


def check_entry_fits(service: Service, size: int) -> None:
    """413 when one message alone is larger than `control.inbox_bytes`: it could never fit, so no retry helps."""
    limit = service.settings.control.inbox_bytes
    if size > limit:
        raise EntryTooLarge(bytes=size, bytes_limit=limit)


async def check_inbox_room(service: Service, conn: Any, thread_id: str, *, added_count: int, added_bytes: int) -> None:
    """S-73: 429 when the change would take the thread's pending plus assigned entries over the inbox limits."""
    usage = await threads.inbox_usage(conn, thread_id=thread_id)
    limits = service.settings.control
    if inbox_would_overflow(
        count=usage.count,
        size=usage.bytes,
        added_count=added_count,
        added_bytes=added_bytes,
        count_limit=limits.inbox_count,
        bytes_limit=limits.inbox_bytes,
    ):
        raise RateLimited(
            count=usage.count, bytes=usage.bytes, count_limit=limits.inbox_count, bytes_limit=limits.inbox_bytes
        )


async def archive_thread(
    service: Service, principal: Principal, thread_id: str, *, expected_version: int | None = None
) -> ThreadRow:
    """`POST /v1/threads/{id}/archive`, S-64: withdraw pending entries, interrupt the active run; idempotent.

    `expected_version` is the `If-Match` version; a stale one → 412 (an archived thread answers 200 regardless).
    """
    require(principal, "run")
    async with write_transaction(service.engine) as conn:
        thread = await threads.lock_thread(conn, thread_id=thread_id, workspace_id=principal.workspace_id)
        if thread is None:
            raise NotFound("thread", thread_id)
        if thread.archived_at is not None:
            return thread
        if expected_version is not None and expected_version != thread.version:
            raise PreconditionFailed(thread_etag(thread))
        await interrupts.archive_thread(conn, thread_id=thread_id)
        if thread.current_run_id is not None:
            run = await interrupts.lock_run(conn, run_id=thread.current_run_id)
            if run is not None and run.status == "accepted":
                await interrupts.cancel_accepted_run(conn, run_id=run.id, thread_id=thread_id)
            elif run is not None and run.status == "running":
                await interrupts.request_cancel(conn, run_id=run.id)
        archived = await views.get_thread(conn, workspace_id=principal.workspace_id, thread_id=thread_id)
        return still_there(archived, "thread")
