"""Run commands (§7.12, §8.3, §8.6): fork a new thread from a sealed run, resume a waiting run, interrupt a run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core import Service
from ..errors import Conflict, Forbidden, InvalidArgument, NotFound
from ..protocol.authority import Principal, key_allows
from ..protocol.idempotency import replay_or_conflict, request_digest, resume_digest
from ..protocol.requests import (
    checked_input,
    checked_key,
    checked_options,
    checked_resume_body,
    require,
    still_there,
)
from ..protocol.resume import ResumeAnswers, resume_refusal, successor_of
from ..store import reads as views
from ..store import threads
from ..store import threads as interrupts
from ..store import workspaces as auth
from ..store.db import guarded_writes, write_transaction
from ..store.reads import RunRow
from ..store.threads import read_resume, start_successor
from .acceptance import (
    Accepted,
    accepted,
    answer,
    checked_client_tool_names,
    input_run,
    may_write,
    new_message,
    replay,
    with_optional,
    woken,
)
from .edited_arguments import edited_argument_problems
from .threads import check_entry_fits

__all__ = ("fork_run", "resume_run", "interrupt_run")


async def fork_run(
    service: Service,
    principal: Principal,
    run_id: str,
    *,
    input: Any,  # noqa: A002 - the spec's field name
    options: Mapping[str, Any] | None = None,
    key: str,
) -> Accepted:
    """`POST /v1/runs/{id}/fork`: a new thread (origin `fork`) whose first run (lineage `fork`) starts from the
    sealed origin run's checkpoint (§6); an unsealed origin → 409 `run_accepted`/`run_running`.

    A `waiting` origin → 409 `run_waiting`, where §6 would let the fork start: its checkpoint ends with calls that were
    never approved or answered, and the fork's first run could only close them by tool recovery, which tells the
    model they "may have partly taken effect" (false: they never ran) or, for retry-safe tools, runs them without
    the approval. Resume the waiting run (deny what should not run), then fork its successor."""
    require(principal, "run")
    key = checked_key(key)
    payload, checked = checked_input(input), checked_options(options)
    check_entry_fits(service, threads.payload_size(payload))  # 413 like creating a thread or posting
    digest = request_digest("fork", run_id, with_optional({"input": payload}, options=checked))

    async def attempt() -> Accepted:
        async with write_transaction(service.engine) as conn:
            if (found := await replay(conn, principal, key, digest)) is not None:
                return found
            origin = await views.get_run(conn, workspace_id=principal.workspace_id, run_id=run_id)
            if origin is None:
                raise NotFound("run", run_id)
            facts = await auth.read_authority(conn, principal.id)
            may_write(facts, principal)
            origin_thread = still_there(
                await threads.lock_thread(conn, thread_id=origin.thread_id, workspace_id=None), "thread"
            )
            origin = still_there(await interrupts.lock_run(conn, run_id=run_id), "run")
            if origin_thread.state == "archived":
                raise Conflict("archived", kind="thread", id=origin_thread.id)
            if origin.status in ("accepted", "running", "waiting"):
                raise Conflict(f"run_{origin.status}", kind="run", id=run_id)
            if origin.agent not in service.agents.names():
                raise InvalidArgument(fields=[("agent", "not_configured")])
            checked_client_tool_names(service, origin.agent, checked)
            thread_id = threads.new_id("thr", service.entropy)
            await threads.insert_thread(
                conn,
                thread_id=thread_id,
                workspace_id=principal.workspace_id,
                agent=origin.agent,
                origin="fork",
                origin_thread_id=origin.thread_id,
                origin_run_id=origin.id,
            )
            message = new_message(
                principal, facts, thread_id, payload, key=key, digest=digest, kind="fork", options=checked
            )
            entry = await threads.append_entry(conn, message, entropy=service.entropy)
            run = input_run(
                service,
                principal,
                facts,
                entry,
                agent=origin.agent,
                options=dict(origin.options) if checked is None else checked,
                lineage="fork",
                parent_run_id=origin.id,
                start_checkpoint_id=origin.checkpoint_id or origin.start_checkpoint_id,
            )
            await threads.start_run(conn, run, entropy=service.entropy)
            return await accepted(conn, principal, entry, created=True)

    return woken(service, await answer(attempt))


async def resume_run(
    service: Service, principal: Principal, run_id: str, body: ResumeAnswers | Mapping[str, Any], *, key: str
) -> tuple[RunRow, bool]:
    """`POST /v1/runs/{id}/resume`, §8.6 in order: shape → replay → archived → last waiting run → coverage → `run`
    held → successor, the checks on one read and the successor's start guarded by it (the read and the guard take
    the place of §8.6's thread lock: store/threads/resume.py). Any rejection changes nothing (S-85); the waiting
    run stays `waiting` (S-86).
    `body` is the typed answers (the HTTP body) or a plain mapping, built into them once. Returns the successor and
    whether this request created it (201) or replayed it (200)."""
    require(principal, "run")
    key = checked_key(key)
    answers = checked_resume_body(body)
    digest = resume_digest(run_id, answers.stored_json())

    def replay_of(found: RunRow | None) -> RunRow | None:
        if found is not None and replay_or_conflict(found.request_digest or "", digest) == "conflict":
            raise Conflict("idempotency_key_reused", kind="run", id=found.id)  # S-82
        return found

    async def attempt() -> tuple[RunRow, bool]:
        # Read, decide, then one guarded write: no transaction spans them on PostgreSQL (store/threads/resume.py says
        # why the guard is enough); a lost guard is `RaceLost`, and `answer` reads again.
        async with guarded_writes(service.engine) as conn:
            read = await read_resume(
                conn, principal_id=principal.id, key=key, workspace_id=principal.workspace_id, run_id=run_id
            )
            if (found := replay_of(read.replay)) is not None:
                return found, False  # S-81
            waiting = read.target
            if waiting is None:
                raise NotFound("run", run_id)
            thread = still_there(read.thread, "thread")  # the read joins a found run to its thread
            authority = still_there(read.authority, "authority")
            refusal = resume_refusal(thread, waiting, authority, answers)
            if refusal is not None:
                raise refusal
            edits_refused = edited_argument_problems(service, waiting, answers)  # before the wait ends
            if edits_refused:
                raise InvalidArgument(fields=edits_refused)
            successor = successor_of(
                waiting,
                answers=answers,
                resumed_by_id=principal.id,
                key=key,
                digest=digest,
                max_attempts=service.settings.worker.max_attempts,
            )
            started = await start_successor(
                conn,
                successor,
                entropy=service.entropy,
                waiting_run_id=waiting.id,
                workspace_has_subscriptions=read.workspace_has_subscriptions,
            )
            return started, True

    run, created = await answer(attempt)
    if created:
        service.wake_workers()
    return run, created


async def interrupt_run(service: Service, principal: Principal, run_id: str) -> RunRow:
    """`POST /v1/runs/{id}/interrupt`, §7.12: accepted → `cancelled` at once (S-58); running → cancellation
    requested once (S-60); cancelled → unchanged; completed/waiting/failed → 409 `run_<status>` (S-59)."""
    require(principal, "run")
    async with write_transaction(service.engine) as conn:
        run = await views.get_run(conn, workspace_id=principal.workspace_id, run_id=run_id)
        if run is None:
            raise NotFound("run", run_id)
        facts = await auth.read_authority(conn, principal.id)
        if not key_allows(facts, "run"):
            raise Forbidden("run")
        await threads.lock_thread(conn, thread_id=run.thread_id, workspace_id=None)
        run = still_there(await interrupts.lock_run(conn, run_id=run_id), "run")
        match run.status:
            case "accepted":
                failed = await interrupts.cancel_accepted_run(conn, run_id=run_id, thread_id=run.thread_id)
                await threads.touch_thread(conn, thread_id=run.thread_id, inbox_changed=failed > 0)
            case "running":
                await interrupts.request_cancel(conn, run_id=run_id)
            case "cancelled":
                pass
            case status:
                raise Conflict(f"run_{status}", kind="run", id=run_id)
        return still_there(await views.load_run(conn, run_id=run_id), "run")
