"""(pure) `NewRun`: the value of a run about to be accepted, as the commands decide it and the store inserts it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ("NewRun",)


@dataclass(frozen=True, kw_only=True, slots=True)
class NewRun:
    """An `accepted` run to insert (§5.2 "(none) → accepted")."""

    workspace_id: str
    thread_id: str
    agent: str
    principal_id: str
    authority: dict[str, Any]
    options: dict[str, Any]
    trigger: Literal["input", "queued", "resume", "child_result", "spawned"]
    lineage: Literal["root", "continue", "fork"]
    max_attempts: int
    """S-10: `worker.max_attempts` at acceptance."""
    tool_recovery: str
    """`ServiceSettings.tool_recovery_for(agent, options)` at acceptance (a resume successor keeps its run's)."""
    start_checkpoint_id: str | None
    parent_run_id: str | None = None
    source_entry_id: str | None = None
    """The entry that starts the run; it becomes `assigned` to it."""
    resume: dict[str, Any] | None = None
    resumed_by_id: str | None = None
    request_key: str | None = None
    request_digest: str | None = None
