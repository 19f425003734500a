"""The `start_child_run` tool (§7.13): a toolset the worker adds to runs of agents that may start child runs.

An agent opts in with `[agents.<name>] children = ["agent_a", ...]` (docs/child-runs.md); without that list its
runs get no tool at all. The tool's one effect is `store.children.spawn_child()`, a fenced transaction of this
attempt that is idempotent per (parent run, tool call id), so the tool is declared retry-safe at its source
(`recovery_retryable`): after a crash the recovering attempt replays the call (`tool_recovery="declared"`) and gets
the child the first execution created, never a second one.

A refusal (agent not allowed, limits `worker.child_count` / `worker.child_depth`, empty or oversized input) is a
`ModelRetry`: the model sees `<code>: <message>` as the tool's error and nothing was created. A lost lease
propagates (`LeaseLost`): the attempt cannot seal any more and ends as it would at a commit.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic_ai import ModelRetry, RunContext, Tool
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset

from candor.tools import recovery_retryable

from ..core import Service
from ..errors import StoreUnavailable
from ..protocol.children import CHILD_TOOL_NAME, SpawnRefusal
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


async def _spawn_with_retries(service: Service, lease: Any, spawn: ChildSpawn) -> SpawnedChild | SpawnRefusal:
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


def child_toolsets(service: Service, claimed: ClaimedRun) -> list[AbstractToolset[Any]]:
    """The spawn toolset for this attempt's run, or nothing when its agent may start no child (§7.13)."""
    allowed = allowed_child_agents(service, claimed.agent)
    if not allowed:
        return []
    lease = claimed.lease

    async def start_child_run(ctx: RunContext[Any], agent: str, input: str) -> dict[str, str]:  # noqa: A002
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
