"""What the accepting commands share (§8.2, §8.5): the `Accepted` answer, replay by idempotency key, the entry and
run a request creates, the checks that need the configured agents, and answering again after a lost race.

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

from ..core import Service
from ..errors import Conflict, Disabled, Forbidden, InvalidArgument, RaceLost
from ..protocol.authority import Principal
from ..protocol.client_tools import CLIENT_TOOLS_FIELD, ClientToolsProblem, colliding_names, validate_client_tools
from ..protocol.idempotency import replay_or_conflict
from ..protocol.inbox import is_steer_compatible
from ..protocol.new_run import NewRun
from ..protocol.requests import Delivery, still_there
from ..store import reads as views
from ..store import threads
from ..store.reads import EntryRow, RunRow, ThreadRow
from ..store.threads import NewEntry
from ..store.workspaces import AuthorityFacts

__all__ = (
    "Accepted",
    "answer",
    "may_write",
    "checked_agent",
    "checked_client_tool_names",
    "check_steer",
    "accepted",
    "replay",
    "new_message",
    "input_run",
    "woken",
    "with_optional",
)

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


async def answer(attempt: Callable[[], Awaitable[T]]) -> T:
    """Run one transaction; when it loses a race to a unique index, answer again from the winner's state."""
    for _ in range(_RACE_ANSWERS - 1):
        try:
            return await attempt()
        except RaceLost:
            continue
    return await attempt()


def may_write(facts: AuthorityFacts, principal: Principal) -> None:
    """S-128: an archived workspace answers `disabled`; a key that lost `run` (or was disabled) `forbidden`."""
    if facts.workspace_archived:
        raise Disabled(principal.workspace_id)
    if facts.verdict() != "allowed":
        raise Forbidden("run")


def checked_agent(service: Service, agent: str) -> str:
    """§8.5: an agent that is not configured under `agents` → 400 field `agent`."""
    if agent not in service.agents.names():
        raise InvalidArgument(fields=[("agent", "not_configured")])
    return agent


def checked_client_tool_names(service: Service, agent: str, options: Mapping[str, Any] | None) -> None:
    """§8.8, S-133: a client tool named like one of the agent's own tools → 400 `options.client_tools`.

    Best effort: the agent's tools are known only by building its harness, which needs its factory importable
    here; when it is not (a control-only process), the worker seals the run `failed` / `client_tool_conflict`.
    """
    tools = validate_client_tools((options or {}).get("client_tools"))
    if isinstance(tools, ClientToolsProblem) or not tools:
        return
    from ..worker.client_tools import agent_tool_names  # pydantic-ai toolsets; only needed when tools are given

    try:
        harness = service.agents.build(agent, options or {})
    except Exception:  # noqa: BLE001 - the factory cannot run here; the worker checks again
        return
    if colliding_names(tools, agent_tool_names(harness)):
        raise InvalidArgument(fields=[(CLIENT_TOOLS_FIELD, "name_collision")])


async def check_steer(conn: Any, thread: ThreadRow, agent: str | None, options: Mapping[str, Any] | None) -> None:
    """S-68: a steer naming another agent or other options than the active run → 409."""
    run_id = still_there(thread.current_run_id, "active thread's run")
    run = still_there(await views.load_run(conn, run_id=run_id), "run")
    if not is_steer_compatible(
        entry_agent=agent,
        entry_options_digest=None if options is None else threads.options_digest(options),
        run_agent=run.agent,
        run_options_digest=run.options_digest,
    ):
        raise Conflict("run_configuration_immutable", kind="run", id=run.id)


async def accepted(conn: Any, principal: Principal, entry: EntryRow, *, created: bool) -> Accepted:
    thread = await views.get_thread(conn, workspace_id=principal.workspace_id, thread_id=entry.thread_id)
    current = await views.get_entry(conn, workspace_id=principal.workspace_id, entry_id=entry.id)
    thread, current = still_there(thread, "thread"), still_there(current, "entry")
    run = await threads.find_run_by_source_entry(conn, current)
    return Accepted(thread=thread, entry=current, run=run, created=created)


async def replay(conn: Any, principal: Principal, key: str, digest: str) -> Accepted | None:
    """S-90, S-92, S-94: the objects a keyed request created, as they are now; another body → 409."""
    entry = await threads.find_entry_by_key(conn, principal_id=principal.id, key=key)
    if entry is None:
        return None
    if replay_or_conflict(entry.request_digest or "", digest) == "conflict":
        raise Conflict("idempotency_key_reused", kind="entry", id=entry.id)
    return await accepted(conn, principal, entry, created=False)


def new_message(
    principal: Principal,
    facts: AuthorityFacts,
    thread_id: str,
    payload: dict[str, Any],
    *,
    key: str,
    digest: str,
    kind: Literal["thread", "message", "fork"],
    delivery: Delivery = "next_run",
    agent: str | None = None,
    options: dict[str, Any] | None = None,
) -> NewEntry:
    """The entry of a keyed message, thread or fork request; `agent`/`options` only when given explicitly."""
    return NewEntry(
        workspace_id=principal.workspace_id,
        thread_id=thread_id,
        delivery=delivery,
        payload=payload,
        principal_id=principal.id,
        authority=threads.frozen_authority(principal.id, facts.permissions),
        agent=agent,
        options=options,
        request_key=key,
        request_digest=digest,
        request_kind=kind,
    )


def input_run(
    service: Service,
    principal: Principal,
    facts: AuthorityFacts,
    entry: EntryRow,
    *,
    agent: str,
    options: dict[str, Any],
    lineage: Literal["root", "continue", "fork"],
    parent_run_id: str | None,
    start_checkpoint_id: str | None,
) -> NewRun:
    """S-65, S-10: the run a posted message starts at once (trigger `input`), authority frozen at acceptance."""
    return NewRun(
        workspace_id=principal.workspace_id,
        thread_id=entry.thread_id,
        agent=agent,
        principal_id=principal.id,
        authority=threads.frozen_authority(principal.id, facts.permissions),
        options=options,
        trigger="input",
        lineage=lineage,
        parent_run_id=parent_run_id,
        start_checkpoint_id=start_checkpoint_id,
        max_attempts=service.settings.worker.max_attempts,
        source_entry_id=entry.id,
        tool_recovery=service.settings.tool_recovery_for(agent, options),
    )


def woken(service: Service, result: Accepted) -> Accepted:
    """Wake the workers after commit when the request started a run."""
    if result.created and result.run is not None:
        service.wake_workers()
    return result


def with_optional(body: dict[str, Any], **optional: Any) -> dict[str, Any]:
    """`body` plus the optional fields that were given (the digest sees the request as written)."""
    return body | {name: value for name, value in optional.items() if value is not None}
