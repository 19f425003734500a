"""(pure) `NewRun`: the value of a run about to be accepted, as the commands decide it and the store inserts it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .json_types import JsonObject
from .tool_recovery import ToolRecovery

__all__ = ("NewRun", "RunTrigger", "RunLineage")

RunTrigger = Literal["input", "queued", "resume", "child_result", "spawned"]
"""What started a run (§5.1 `runs.trigger`; the schema's CHECK constraint holds the same five)."""
RunLineage = Literal["root", "continue", "fork"]
"""How a run's thread relates to its origin (§5.1 `runs.lineage`; the schema's CHECK constraint holds the same)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NewRun:
    """An `accepted` run to insert (§5.2 "(none) → accepted")."""

    workspace_id: str
    thread_id: str
    agent: str
    principal_id: str
    authority: JsonObject
    options: JsonObject
    trigger: RunTrigger
    lineage: RunLineage
    max_attempts: int
    """S-10: `worker.max_attempts` at acceptance."""
    tool_recovery: ToolRecovery
    """`ServiceSettings.tool_recovery_for(agent, options)` at acceptance (a resume successor keeps its run's)."""
    start_checkpoint_id: str | None
    parent_run_id: str | None = None
    source_entry_id: str | None = None
    """The entry that starts the run; it becomes `assigned` to it."""
    resume: JsonObject | None = None
    resumed_by_id: str | None = None
    request_key: str | None = None
    request_digest: str | None = None
