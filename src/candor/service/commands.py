"""User actions (spec §8): one async function per action, each in one write transaction, failing with §12 errors.

Order of checks everywhere (§8.2): permission of the authenticated key → request shape → replay lookup by
idempotency key → the object in the caller's workspace (404, S-126) → archived workspace (422 `disabled`, S-128)
→ state (409) → inbox limits (429). A replay therefore succeeds after the state has moved on (S-94). When a unique
index rejects a racing write (`RaceLost`), the transaction is rolled back and the request is answered again, which
finds the winner's objects as a replay or the state it left (S-1, S-83, §8.2). Workers are woken after commit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import ValidationError
from pydantic_ai import ModelMessagesTypeAdapter

from .core import Service
from .errors import Conflict, Disabled, Forbidden, InvalidArgument, NotFound, PreconditionFailed, RaceLost
from .errors import RateLimited
from .protocol.authority import Permission, Principal
from .protocol.client_tools import CLIENT_TOOLS_FIELD, ClientToolsProblem, colliding_names, validate_client_tools
from .protocol.idempotency import (
    KeyProblem,
    canonical_json,
    replay_or_conflict,
    request_digest,
    resume_digest,
    validate_idempotency_key,
)
from .protocol.inbox import is_steer_compatible
from .protocol.pending import Pending, coverage_mismatch, resume_body_to_results, resume_shape_problem
from .store import auth, interrupts, threads, views
from .store.auth import AuthorityFacts
from .store.checkpoints import import_history
from .store.engine import read_transaction, write_transaction
from .store.resume import find_resume_by_key, successor_of
from .store.threads import NewEntry, NewRun
from .store.views import AttemptRow, EntryRow, RunRow, ThreadRow

__all__ = (
    "Accepted",
    "create_thread",
    "post_input",
    "resume_run",
    "interrupt_run",
    "fork_run",
    "archive_thread",
    "get_thread",
    "get_run",
    "list_runs",
    "list_attempts",
    "authenticate",
    "list_runs_page",
    "OPTIONS_LIMIT",
    "RESUME_BODY_LIMIT",
)

OPTIONS_LIMIT = 64 * 1024
"""§5.1: `options` is a JSON object of at most 64 KiB."""
RESUME_BODY_LIMIT = 256 * 1024
"""§8.6 step 1, S-79."""
_RACE_ANSWERS = 3
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, slots=True)
class Accepted:
    """What a message, thread or fork request created (or a replay found, as it is now: S-90)."""

    thread: ThreadRow
    entry: EntryRow
    run: RunRow | None
    """The run the entry started, if it started one (S-65); `None` while it is queued (S-66, S-69)."""
    created: bool
    """201 when true, 200 for a replay."""


# --- request checks (no I/O) -------------------------------------------------------------------------------------


def _require(principal: Principal, permission: Permission) -> None:
    if not principal.can(permission):
        raise Forbidden(permission)


def _checked_key(key: str | None) -> str:
    checked = validate_idempotency_key(key)
    if isinstance(checked, KeyProblem):
        raise InvalidArgument(fields=[("Idempotency-Key", checked.reason)])
    return checked


def _checked_input(value: Any, field: str = "input") -> dict[str, Any]:
    """§8.1: `{"content": [{"type": "text", "text": str}, ...]}` with at least one item."""
    content = value.get("content") if isinstance(value, Mapping) and set(value) == {"content"} else None
    if not isinstance(content, list) or not content:
        raise InvalidArgument(fields=[(field, "invalid_content")])
    for item in content:
        if not (isinstance(item, Mapping) and set(item) == {"type", "text"} and item["type"] == "text"
                and isinstance(item["text"], str)):  # fmt: skip
            raise InvalidArgument(fields=[(field, "invalid_content")])
    return {"content": [{"type": "text", "text": item["text"]} for item in content]}


def _json_size(value: Any, field: str) -> int:
    try:
        return len(canonical_json(value).encode("utf-8"))
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(fields=[(field, "not_json")]) from exc


def _checked_options(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidArgument(fields=[("options", "not_an_object")])
    if _json_size(value, "options") > OPTIONS_LIMIT:
        raise InvalidArgument(fields=[("options", "too_large")])
    tools = validate_client_tools(value.get("client_tools"))  # §8.8, S-133
    if isinstance(tools, ClientToolsProblem):
        raise InvalidArgument(fields=[(tools.field, tools.reason)])
    return dict(value)


def _checked_client_tool_names(service: Service, agent: str, options: Mapping[str, Any] | None) -> None:
    """§8.8, S-133: a client tool named like one of the agent's own tools → 400 `options.client_tools`.

    Best effort: the agent's tools are known only by building its harness, which needs its factory importable
    here; when it is not (a control-only process), the worker seals the run `failed` / `client_tool_conflict`.
    """
    tools = validate_client_tools((options or {}).get("client_tools"))
    if isinstance(tools, ClientToolsProblem) or not tools:
        return
    from .worker.client_tools import agent_tool_names  # pydantic-ai toolsets; only needed when tools are given

    try:
        harness = service.agents.build(agent, options or {})
    except Exception:  # noqa: BLE001 - the factory cannot run here; the worker checks again
        return
    if colliding_names(tools, agent_tool_names(harness)):
        raise InvalidArgument(fields=[(CLIENT_TOOLS_FIELD, "name_collision")])


def _checked_agent(service: Service, agent: str) -> str:
    if agent not in service.agents.names():
        raise InvalidArgument(fields=[("agent", "not_configured")])
    return agent


def _checked_history(value: Any) -> tuple[list[Any], list[Any]] | None:
    """`message_history` as messages plus their JSON form (for the digest); `None` when absent or empty."""
    if value is None:
        return None
    try:
        messages = ModelMessagesTypeAdapter.validate_python(value)
    except ValidationError as exc:
        raise InvalidArgument(fields=[("message_history", "invalid")]) from exc
    if not messages:
        return None
    return messages, ModelMessagesTypeAdapter.dump_python(messages, mode="json")


def _checked_resume_body(body: Any) -> dict[str, Any]:
    """§8.6 step 1, S-79: both maps, no id in both, at most 128 results, at most 256 KiB, answers well formed."""
    if not isinstance(body, Mapping) or not set(body) <= {"approvals", "calls", "input"}:
        raise InvalidArgument(fields=[("body", "invalid")])
    missing = [(name, "required") for name in ("approvals", "calls") if not isinstance(body.get(name), Mapping)]
    if missing:
        raise InvalidArgument(fields=missing)
    if _json_size(body, "body") > RESUME_BODY_LIMIT:
        raise InvalidArgument(fields=[("body", "too_large")])
    match resume_shape_problem(body["approvals"].keys(), body["calls"].keys()):
        case "overlap":
            raise InvalidArgument(fields=[("calls", "id_also_in_approvals")])
        case "too_many":
            raise InvalidArgument(fields=[("body", "too_many_results")])
    for name in ("approvals", "calls"):
        try:
            resume_body_to_results({"approvals": {}, "calls": {}, name: body[name]})
        except ValueError as exc:
            raise InvalidArgument(fields=[(name, "invalid_answer")]) from exc
    if "input" in body:
        _checked_input(body["input"])
    return dict(body)


# --- transaction helpers -----------------------------------------------------------------------------------------


async def _answer(attempt: Callable[[], Awaitable[T]]) -> T:
    """Run one transaction; when it loses a race to a unique index, answer again from the winner's state."""
    for _ in range(_RACE_ANSWERS - 1):
        try:
            return await attempt()
        except RaceLost:
            continue
    return await attempt()


def _may_write(facts: AuthorityFacts, principal: Principal) -> None:
    """S-128: an archived workspace answers `disabled`; a key that lost `run` (or was disabled) `forbidden`."""
    if facts.workspace_archived:
        raise Disabled(principal.workspace_id)
    if facts.verdict() != "allowed":
        raise Forbidden("run")


async def _accepted(conn: Any, principal: Principal, entry: EntryRow, *, created: bool) -> Accepted:
    thread = await views.get_thread(conn, workspace_id=principal.workspace_id, thread_id=entry.thread_id)
    current = await views.get_entry(conn, workspace_id=principal.workspace_id, entry_id=entry.id)
    assert thread is not None and current is not None
    run = await threads.find_run_by_source_entry(conn, current)
    return Accepted(thread=thread, entry=current, run=run, created=created)


async def _replay(conn: Any, principal: Principal, key: str, digest: str) -> Accepted | None:
    """S-90, S-92, S-94: the objects a keyed request created, as they are now; another body → 409."""
    entry = await threads.find_entry_by_key(conn, principal_id=principal.id, key=key)
    if entry is None:
        return None
    if replay_or_conflict(entry.request_digest or "", digest) == "conflict":
        raise Conflict("idempotency_key_reused", kind="entry", id=entry.id)
    return await _accepted(conn, principal, entry, created=False)


def _message(
    principal: Principal, facts: AuthorityFacts, thread_id: str, payload: dict[str, Any], *, key: str, digest: str,
    kind: Literal["thread", "message", "fork"], delivery: Literal["steer", "next_run"] = "next_run",
    agent: str | None = None, options: dict[str, Any] | None = None,
) -> NewEntry:  # fmt: skip
    """The entry of a keyed message, thread or fork request; `agent`/`options` only when given explicitly."""
    return NewEntry(
        workspace_id=principal.workspace_id, thread_id=thread_id, delivery=delivery, payload=payload,
        principal_id=principal.id, authority=threads.frozen_authority(principal.id, facts.permissions), agent=agent,
        options=options, request_key=key, request_digest=digest, request_kind=kind,
    )  # fmt: skip


def _input_run(
    service: Service, principal: Principal, facts: AuthorityFacts, entry: EntryRow, *, agent: str,
    options: dict[str, Any], lineage: Literal["root", "continue", "fork"], parent_run_id: str | None,
    start_checkpoint_id: str | None,
) -> NewRun:  # fmt: skip
    """S-65, S-10: the run a posted message starts at once (trigger `input`), authority frozen at acceptance."""
    return NewRun(
        workspace_id=principal.workspace_id, thread_id=entry.thread_id, agent=agent, principal_id=principal.id,
        authority=threads.frozen_authority(principal.id, facts.permissions), options=options, trigger="input",
        lineage=lineage, parent_run_id=parent_run_id, start_checkpoint_id=start_checkpoint_id,
        max_attempts=service.settings.worker.max_attempts, source_entry_id=entry.id,
    )  # fmt: skip


def _woken(service: Service, accepted: Accepted) -> Accepted:
    if accepted.created and accepted.run is not None:
        service.wake_workers()
    return accepted


def _with(body: dict[str, Any], **optional: Any) -> dict[str, Any]:
    return body | {name: value for name, value in optional.items() if value is not None}


# --- threads and messages ----------------------------------------------------------------------------------------


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
    _require(principal, "run")
    key = _checked_key(key)
    payload, agent, checked_options = _checked_input(input), _checked_agent(service, agent), _checked_options(options)
    _checked_client_tool_names(service, agent, checked_options)
    history = _checked_history(message_history)
    body = _with({"agent": agent, "input": payload}, options=checked_options,
                 message_history=None if history is None else history[1])  # fmt: skip
    digest = request_digest("thread", "", body)

    async def attempt() -> Accepted:
        async with write_transaction(service.engine) as conn:
            if (replay := await _replay(conn, principal, key, digest)) is not None:
                return replay
            facts = await auth.read_authority(conn, principal.id)
            _may_write(facts, principal)
            thread_id = threads.new_id("thr", service.entropy)
            base_id = None if history is None else threads.new_id("ckp", service.entropy)
            await threads.insert_thread(
                conn, thread_id=thread_id, workspace_id=principal.workspace_id, agent=agent, base_checkpoint_id=base_id
            )
            if history is not None:  # S-45: stored once, as the thread's seq-0 checkpoint
                await import_history(conn, thread_id, history[0], checkpoint_id=base_id)
            message = _message(principal, facts, thread_id, payload, key=key, digest=digest, kind="thread",
                               agent=agent, options=checked_options)  # fmt: skip
            entry = await threads.append_entry(conn, message, entropy=service.entropy)
            run = _input_run(service, principal, facts, entry, agent=agent, options=checked_options or {},
                             lineage="root", parent_run_id=None, start_checkpoint_id=base_id)  # fmt: skip
            await threads.start_run(conn, run, entropy=service.entropy)
            return await _accepted(conn, principal, entry, created=True)

    return _woken(service, await _answer(attempt))


async def post_input(
    service: Service,
    principal: Principal,
    thread_id: str,
    *,
    input: Any,  # noqa: A002 - the spec's field name
    delivery: Literal["steer", "next_run"] = "next_run",
    agent: str | None = None,
    options: Mapping[str, Any] | None = None,
    key: str,
) -> Accepted:
    """`POST /v1/threads/{id}/inbox`, §8.5: idle or paused → a run starts (S-65, S-70); active → the entry waits
    (S-66, S-68); waiting → it queues (S-69); archived → 409 (S-64); inbox full → 429 (S-73)."""
    _require(principal, "run")
    key = _checked_key(key)
    payload, checked_options = _checked_input(input), _checked_options(options)
    if delivery not in ("steer", "next_run"):
        raise InvalidArgument(fields=[("delivery", "invalid")])
    if agent is not None:
        _checked_agent(service, agent)
        _checked_client_tool_names(service, agent, checked_options)
    digest = request_digest(
        "message", thread_id, _with({"input": payload, "delivery": delivery}, agent=agent, options=checked_options)
    )

    async def attempt() -> Accepted:
        async with write_transaction(service.engine) as conn:
            if (replay := await _replay(conn, principal, key, digest)) is not None:
                return replay
            thread = await threads.lock_thread(conn, thread_id=thread_id, workspace_id=principal.workspace_id)
            if thread is None:
                raise NotFound("thread", thread_id)
            facts = await auth.read_authority(conn, principal.id)
            _may_write(facts, principal)
            if thread.state == "archived":
                raise Conflict("archived", kind="thread", id=thread_id)
            if agent is None:
                _checked_client_tool_names(service, thread.agent, checked_options)
            if thread.state == "active" and delivery == "steer":
                await _check_steer(conn, thread, agent, checked_options)
            usage = await threads.inbox_usage(conn, thread_id=thread_id)
            limits = service.settings.control
            if usage.count + 1 > limits.inbox_count or usage.bytes + threads.payload_size(payload) > limits.inbox_bytes:
                raise RateLimited(count=usage.count, bytes=usage.bytes, count_limit=limits.inbox_count,
                                  bytes_limit=limits.inbox_bytes)  # fmt: skip
            message = _message(principal, facts, thread_id, payload, key=key, digest=digest, kind="message",
                               delivery=delivery, agent=agent, options=checked_options)  # fmt: skip
            entry = await threads.append_entry(conn, message, entropy=service.entropy)
            if thread.state in ("idle", "paused"):  # S-65, S-70
                point = await threads.start_point(conn, thread)
                run = _input_run(
                    service, principal, facts, entry, agent=agent or point.agent,
                    options=point.options if checked_options is None else checked_options, lineage=point.lineage,
                    parent_run_id=point.parent_run_id, start_checkpoint_id=point.start_checkpoint_id,
                )  # fmt: skip
                await threads.start_run(conn, run, entropy=service.entropy)
            await threads.touch_thread(conn, thread_id=thread_id, inbox_changed=True)  # S-75
            return await _accepted(conn, principal, entry, created=True)

    return _woken(service, await _answer(attempt))


async def _check_steer(conn: Any, thread: ThreadRow, agent: str | None, options: Mapping[str, Any] | None) -> None:
    """S-68: a steer naming another agent or other options than the active run → 409."""
    assert thread.current_run_id is not None
    run = await views.load_run(conn, run_id=thread.current_run_id)
    assert run is not None
    if not is_steer_compatible(
        entry_agent=agent,
        entry_options_digest=None if options is None else threads.options_digest(options),
        run_agent=run.agent,
        run_options_digest=run.options_digest,
    ):
        raise Conflict("run_configuration_immutable", kind="run", id=run.id)


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
    sealed origin run's checkpoint (§6); an unsealed origin → 409 `run_accepted`/`run_running`."""
    _require(principal, "run")
    key = _checked_key(key)
    payload, checked_options = _checked_input(input), _checked_options(options)
    digest = request_digest("fork", run_id, _with({"input": payload}, options=checked_options))

    async def attempt() -> Accepted:
        async with write_transaction(service.engine) as conn:
            if (replay := await _replay(conn, principal, key, digest)) is not None:
                return replay
            origin = await views.get_run(conn, workspace_id=principal.workspace_id, run_id=run_id)
            if origin is None:
                raise NotFound("run", run_id)
            facts = await auth.read_authority(conn, principal.id)
            _may_write(facts, principal)
            origin_thread = await threads.lock_thread(conn, thread_id=origin.thread_id, workspace_id=None)
            origin = await interrupts.lock_run(conn, run_id=run_id)
            assert origin_thread is not None and origin is not None
            if origin_thread.state == "archived":
                raise Conflict("archived", kind="thread", id=origin_thread.id)
            if origin.status in ("accepted", "running"):
                raise Conflict(f"run_{origin.status}", kind="run", id=run_id)
            if origin.agent not in service.agents.names():
                raise InvalidArgument(fields=[("agent", "not_configured")])
            _checked_client_tool_names(service, origin.agent, checked_options)
            thread_id = threads.new_id("thr", service.entropy)
            await threads.insert_thread(
                conn, thread_id=thread_id, workspace_id=principal.workspace_id, agent=origin.agent, origin="fork",
                origin_thread_id=origin.thread_id, origin_run_id=origin.id,
            )  # fmt: skip
            message = _message(principal, facts, thread_id, payload, key=key, digest=digest, kind="fork",
                               options=checked_options)  # fmt: skip
            entry = await threads.append_entry(conn, message, entropy=service.entropy)
            run = _input_run(
                service, principal, facts, entry, agent=origin.agent,
                options=dict(origin.options) if checked_options is None else checked_options, lineage="fork",
                parent_run_id=origin.id, start_checkpoint_id=origin.checkpoint_id or origin.start_checkpoint_id,
            )  # fmt: skip
            await threads.start_run(conn, run, entropy=service.entropy)
            return await _accepted(conn, principal, entry, created=True)

    return _woken(service, await _answer(attempt))


# --- runs --------------------------------------------------------------------------------------------------------


async def resume_run(
    service: Service, principal: Principal, run_id: str, body: Mapping[str, Any], *, key: str
) -> tuple[RunRow, bool]:
    """`POST /v1/runs/{id}/resume`, §8.6 in order: shape → replay → lock → archived → last waiting run →
    coverage → `run` held → successor. Any rejection changes nothing (S-85); the waiting run stays `waiting` (S-86).
    Returns the successor and whether this request created it (201) or replayed it (200)."""
    _require(principal, "run")
    key = _checked_key(key)
    checked = _checked_resume_body(body)
    digest = resume_digest(run_id, checked)

    async def replay(conn: Any) -> RunRow | None:
        found = await find_resume_by_key(conn, principal_id=principal.id, key=key)
        if found is not None and replay_or_conflict(found.request_digest or "", digest) == "conflict":
            raise Conflict("idempotency_key_reused", kind="run", id=found.id)  # S-82
        return found

    async def attempt() -> tuple[RunRow, bool]:
        async with write_transaction(service.engine) as conn:
            if (found := await replay(conn)) is not None:
                return found, False  # S-81
            waiting = await views.get_run(conn, workspace_id=principal.workspace_id, run_id=run_id)
            if waiting is None:
                raise NotFound("run", run_id)
            thread = await threads.lock_thread(conn, thread_id=waiting.thread_id, workspace_id=None)
            assert thread is not None
            if (found := await replay(conn)) is not None:  # a racing twin committed while we waited for the lock
                return found, False
            facts = await auth.read_authority(conn, principal.id)
            if facts.workspace_archived:
                raise Disabled(principal.workspace_id)
            if thread.state == "archived":
                raise Conflict("archived", kind="thread", id=thread.id)  # S-84
            if thread.state != "waiting" or thread.last_run_id != run_id:
                raise Conflict("not_idle_waiting_run", kind="run", id=run_id)  # S-77
            pending = Pending.model_validate(waiting.pending)
            mismatch = coverage_mismatch(pending, checked["approvals"].keys(), checked["calls"].keys())
            if mismatch is not None:  # S-78
                raise InvalidArgument(reason="pending_coverage_mismatch", details=mismatch.details())
            if facts.verdict() != "allowed":
                raise Forbidden("run")
            successor = successor_of(
                waiting, body=checked, resumed_by_id=principal.id, key=key, digest=digest,
                max_attempts=service.settings.worker.max_attempts,
            )  # fmt: skip
            return await threads.start_run(conn, successor, entropy=service.entropy), True

    run, created = await _answer(attempt)
    if created:
        service.wake_workers()
    return run, created


async def interrupt_run(service: Service, principal: Principal, run_id: str) -> RunRow:
    """`POST /v1/runs/{id}/interrupt`, §7.12: accepted → `cancelled` at once (S-58); running → cancellation
    requested once (S-60); cancelled → unchanged; completed/waiting/failed → 409 `run_<status>` (S-59)."""
    _require(principal, "run")
    async with write_transaction(service.engine) as conn:
        run = await views.get_run(conn, workspace_id=principal.workspace_id, run_id=run_id)
        if run is None:
            raise NotFound("run", run_id)
        facts = await auth.read_authority(conn, principal.id)
        if not facts.principal_exists or facts.principal_disabled or "run" not in facts.permissions:
            raise Forbidden("run")
        await threads.lock_thread(conn, thread_id=run.thread_id, workspace_id=None)
        run = await interrupts.lock_run(conn, run_id=run_id)
        assert run is not None
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
        current = await views.load_run(conn, run_id=run_id)
        assert current is not None
        return current


async def archive_thread(
    service: Service, principal: Principal, thread_id: str, *, expected_version: int | None = None
) -> ThreadRow:
    """`POST /v1/threads/{id}/archive`, S-64: withdraw pending entries, interrupt the active run; idempotent.

    `expected_version` is the `If-Match` version; a stale one → 412 (an archived thread answers 200 regardless).
    """
    _require(principal, "run")
    async with write_transaction(service.engine) as conn:
        thread = await threads.lock_thread(conn, thread_id=thread_id, workspace_id=principal.workspace_id)
        if thread is None:
            raise NotFound("thread", thread_id)
        if thread.archived_at is not None:
            return thread
        if expected_version is not None and expected_version != thread.version:
            raise PreconditionFailed(f'"{thread.id}:{thread.version}"')
        await interrupts.archive_thread(conn, thread_id=thread_id)
        if thread.current_run_id is not None:
            run = await interrupts.lock_run(conn, run_id=thread.current_run_id)
            if run is not None and run.status == "accepted":
                await interrupts.cancel_accepted_run(conn, run_id=run.id, thread_id=thread_id)
            elif run is not None and run.status == "running":
                await interrupts.request_cancel(conn, run_id=run.id)
        archived = await views.get_thread(conn, workspace_id=principal.workspace_id, thread_id=thread_id)
        assert archived is not None
        return archived


# --- reads -------------------------------------------------------------------------------------------------------


async def get_thread(service: Service, principal: Principal, thread_id: str) -> ThreadRow:
    _require(principal, "read")
    async with read_transaction(service.engine) as conn:
        thread = await views.get_thread(conn, workspace_id=principal.workspace_id, thread_id=thread_id)
    if thread is None:
        raise NotFound("thread", thread_id)
    return thread


async def get_run(service: Service, principal: Principal, run_id: str) -> RunRow:
    _require(principal, "read")
    async with read_transaction(service.engine) as conn:
        run = await views.get_run(conn, workspace_id=principal.workspace_id, run_id=run_id)
    if run is None:
        raise NotFound("run", run_id)
    return run


async def list_runs(
    service: Service, principal: Principal, thread_id: str, *, limit: int = 50, before: tuple[float, str] | None = None
) -> list[RunRow]:
    """A thread's runs, newest first; `before` is the `(created_at, id)` of the last run of the previous page."""
    _require(principal, "read")
    if not 1 <= limit <= 100:
        raise InvalidArgument(fields=[("limit", "out_of_range")])
    async with read_transaction(service.engine) as conn:
        if await views.get_thread(conn, workspace_id=principal.workspace_id, thread_id=thread_id) is None:
            raise NotFound("thread", thread_id)
        return await views.list_runs(
            conn, workspace_id=principal.workspace_id, thread_id=thread_id, limit=limit, before=before
        )


async def list_attempts(service: Service, principal: Principal, run_id: str) -> list[AttemptRow]:
    _require(principal, "read")
    async with read_transaction(service.engine) as conn:
        if await views.get_run(conn, workspace_id=principal.workspace_id, run_id=run_id) is None:
            raise NotFound("run", run_id)
        return await views.list_attempts(conn, workspace_id=principal.workspace_id, run_id=run_id)


# --- reads for the HTTP layer ------------------------------------------------------------------------------------


async def authenticate(service: Service, secret: str) -> auth.Authenticated | None:
    """The principal holding a bearer `secret`, or `None` for a missing, unknown or disabled key (S-101)."""
    if not secret:
        return None
    async with read_transaction(service.engine) as conn:
        return await auth.authenticate(conn, secret)


async def list_runs_page(
    service: Service, principal: Principal, thread_id: str, *, limit: int = 50, before: tuple[float, str] | None = None
) -> tuple[list[RunRow], bool]:
    """`list_runs` plus whether more runs follow the page (so the last page carries no cursor, S-98)."""
    _require(principal, "read")
    if not 1 <= limit <= 100:
        raise InvalidArgument(fields=[("limit", "out_of_range")])
    async with read_transaction(service.engine) as conn:
        if await views.get_thread(conn, workspace_id=principal.workspace_id, thread_id=thread_id) is None:
            raise NotFound("thread", thread_id)
        rows = await views.list_runs(
            conn, workspace_id=principal.workspace_id, thread_id=thread_id, limit=limit + 1, before=before
        )
    return rows[:limit], len(rows) > limit
