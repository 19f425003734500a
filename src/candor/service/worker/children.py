"""The `start_child_run` tool (§7.13): a toolset the worker adds to runs of agents that may start child runs.

Only agents with `[agents.<name>] children = [...]` get it (docs/child-runs.md). Its one effect,
`store.children.spawn_child()`, is fenced and idempotent per (parent run, tool call id), so the tool is retry-safe
(`recovery_retryable`): a recovering attempt replays the call and gets the same child. A refusal (agent not
allowed, `worker.child_count` / `worker.child_depth`, empty or oversized input) is a `ModelRetry` that created
nothing; a lost lease propagates as `LeaseLost`.
"""

from __future__ import annotations

import logging

from pydantic_ai import ModelRetry, RunContext, Tool
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset

from candor.tools import recovery_retryable

from ..core import Service
from ..errors import StoreUnavailable
from ..protocol.children import CHILD_TOOL_NAME, SpawnRefusal
from ..protocol.fencing import Lease
from ..store.runs import ClaimedRun
from ..store.threads import ChildSpawn, SpawnedChild, spawn_child

__all__ = ("CHILD_TOOLSET_ID", "allowed_child_agents", "child_toolsets")

log = logging.getLogger("candor.worker")

CHILD_TOOLSET_ID = "candor_child_runs"


def allowed_child_agents(service: Service, agent: str) -> tuple[str, ...]:
    """The agents `agent` may start: its configured `children` that are configured agents now."""
    configured = set(service.agents.names())
    return tuple(name for name in service.agents.children_of(agent) if name in configured)


def _description(allowed: tuple[str, ...]) -> str:
    return (
        "Start a child run: another agent works on `input` in a new thread of its own, in the background. "
        "Returns {child_thread_id, child_run_id} at once. When the child run ends (completed, failed or "
        "cancelled) its result arrives later as a new user message holding the JSON "
        '{"child_run_id", "status", "output", "failure"}. Agents you may start: ' + ", ".join(allowed) + "."
    )


SPAWN_RETRY_DELAYS: tuple[float, ...] = (0.25, 1.0)
"""Pauses between tries of a spawn the database could not answer. Retrying keeps the same (parent run, tool call
id) identity, so a try whose commit did land is found, never repeated; only after the last try is the model told."""


async def _spawn_with_retries(service: Service, lease: Lease, spawn: ChildSpawn) -> SpawnedChild | SpawnRefusal:
    for delay in (*SPAWN_RETRY_DELAYS, None):
        try:
            return await spawn_child(service.engine, lease, spawn, settings=service.settings, entropy=service.entropy)
        except StoreUnavailable as exc:
            if delay is None:
                # The model may call again: a new call is a new spawn identity, so the outcome of the last try is
                # unknown to it (docs/child-runs.md says so).
                raise ModelRetry("child_start_unavailable: the service could not start the child run now") from exc
            await service.clock.sleep(delay)
    raise AssertionError("unreachable")


def child_toolsets(service: Service, claimed: ClaimedRun) -> list[AbstractToolset[object]]:
    """The spawn toolset for this attempt's run, or nothing when its agent may start no child (§7.13)."""
    allowed = allowed_child_agents(service, claimed.agent)
    if not allowed:
        return []
    lease = claimed.lease

    async def start_child_run(ctx: RunContext[object], agent: str, input: str) -> dict[str, str]:  # noqa: A002
        """Start a child run of `agent` with `input` as its first message."""
        spawn = ChildSpawn(agent=agent, text=input, tool_call_id=ctx.tool_call_id or "", allowed_agents=allowed)
        result = await _spawn_with_retries(service, lease, spawn)
        if isinstance(result, SpawnRefusal):
            raise ModelRetry(result.for_model())
        if result.created:
            service.wake_workers()
            log.info(
                "Run accepted",
                extra={
                    "run_id": result.run_id,
                    "thread_id": result.thread_id,
                    "trigger": "spawned",
                    "parent_run_id": lease.run_id,
                },
            )
        return {"child_thread_id": result.thread_id, "child_run_id": result.run_id}

    tool = Tool(start_child_run, name=CHILD_TOOL_NAME, description=_description(allowed), takes_ctx=True)
    return [FunctionToolset([recovery_retryable(tool)], id=CHILD_TOOLSET_ID)]
