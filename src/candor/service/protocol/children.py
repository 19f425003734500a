"""(pure) Child runs (§7.13, §9.5): may a run start a child, what its result row and entry hold, how it is delivered.

A running agent starts a child through the service's `start_child_run` tool (worker/children.py). The store asks
`spawn_refusal()` under the parent's fenced locks; a refusal is shown to the model and nothing is created. When the
child's run seals with any status but `waiting`, the seal stages one `child_result` outbox row
(`stages_child_result()`), and its handler asks `plan_child_result()` what to do with the parent thread.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from .idempotency import canonical_json
from .inbox import inbox_would_overflow
from .json_types import JsonObject, JsonValue

__all__ = (
    "CHILD_TOOL_NAME",
    "CHILD_RESULT_DEFER_SECONDS",
    "SpawnRefusalCode",
    "SpawnRefusal",
    "spawn_refusal",
    "child_input_payload",
    "stages_child_result",
    "child_result_payload",
    "ChildResultPlan",
    "plan_child_result",
    "unknown_child_agents",
)

CHILD_TOOL_NAME: Final = "start_child_run"
"""The model-facing name of the spawn tool (docs/child-runs.md)."""

CHILD_RESULT_DEFER_SECONDS: Final = 30.0
"""§9.5: a full parent inbox settles the row `deferred` for this long (never dropped, S-118)."""

SpawnRefusalCode = Literal[
    "child_agent_not_allowed",
    "child_input_empty",
    "child_input_too_large",
    "child_count_exceeded",
    "child_depth_exceeded",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class SpawnRefusal:
    """Why a child run was not started; the model sees `code: message` as the tool's error (§7.13)."""

    code: SpawnRefusalCode
    message: str

    def for_model(self) -> str:
        return f"{self.code}: {self.message}"


def spawn_refusal(
    *,
    agent: str,
    allowed_agents: Collection[str],
    input_bytes: int,
    input_limit: int,
    started_children: int,
    parent_depth: int,
    child_count: int,
    child_depth: int,
) -> SpawnRefusal | None:
    """§7.13: None when the run may start this child; otherwise the first rule it breaks.

    `started_children` counts the children the run already started; `parent_depth` is the parent thread's nesting
    depth (0 for a thread that is not a child). The child would sit at `parent_depth + 1`, which may not exceed
    `worker.child_depth`; the run may start at most `worker.child_count` children. `input_bytes` is the size of the
    child's first entry, at most `input_limit` (`control.inbox_bytes`).
    """
    if agent not in allowed_agents:
        names = ", ".join(sorted(allowed_agents)) or "none"
        return SpawnRefusal(
            code="child_agent_not_allowed",
            message=f"agent {agent!r} is not one this agent may start (allowed: {names})",
        )
    if input_bytes <= 0:
        return SpawnRefusal(code="child_input_empty", message="the child's input must not be empty")
    if input_bytes > input_limit:
        return SpawnRefusal(
            code="child_input_too_large", message=f"the child's input is larger than {input_limit} bytes"
        )
    if started_children >= child_count:
        return SpawnRefusal(
            code="child_count_exceeded",
            message=f"this run already started {started_children} child runs, the most allowed (worker.child_count)",
        )
    if parent_depth + 1 > child_depth:
        return SpawnRefusal(
            code="child_depth_exceeded",
            message=f"a child here would be nested {parent_depth + 1} deep, more than allowed (worker.child_depth "
            f"= {child_depth})",
        )
    return None


def child_input_payload(text: str) -> JsonObject:
    """The child thread's first entry: one text item (§8.1 input content)."""
    return {"content": [{"type": "text", "text": text}]}


def stages_child_result(*, thread_origin: str, status: str) -> bool:
    """§7.10, S-118: a seal stages a `child_result` row when the run's thread is a child and it is not `waiting`."""
    return thread_origin == "child" and status != "waiting"


def child_result_payload(
    *, child_run_id: str, status: str, output: JsonValue, failure: Mapping[str, JsonValue] | None
) -> JsonObject:
    """§9.5: the `child_result` entry's content, one text item holding canonical JSON of the child's result."""
    result = {"child_run_id": child_run_id, "status": status, "output": output, "failure": failure}
    return {"content": [{"type": "text", "text": canonical_json(result)}]}


ChildResultPlan = Literal["insert", "duplicate", "ignore_archived", "defer_inbox_full", "invalid_target"]
"""What the `child_result` handler does: insert the entry (settle delivered), nothing more to do because the entry
exists (delivered), ignore an archived parent (delivered), defer 30 s, or settle `dead`."""


def plan_child_result(
    *,
    target_valid: bool,
    parent_archived: bool,
    already_entered: bool,
    inbox_count: int,
    inbox_bytes: int,
    entry_bytes: int,
    count_limit: int,
    bytes_limit: int,
) -> ChildResultPlan:
    """§9.5, S-118: the handler's decision for one row, from facts read under the parent thread's lock.

    `target_valid` says the parent thread exists and the child run is a sealed, non-waiting run of a child thread
    of it. `already_entered` says an entry with this `child_run_id` exists (at-least-once delivery: one entry).
    `inbox_*` are the parent's pending plus assigned entries (§8.5 limits).
    """
    if not target_valid:
        return "invalid_target"
    if parent_archived:
        return "ignore_archived"
    if already_entered:
        return "duplicate"
    if inbox_would_overflow(
        count=inbox_count,
        size=inbox_bytes,
        added_count=1,
        added_bytes=entry_bytes,
        count_limit=count_limit,
        bytes_limit=bytes_limit,
    ):
        return "defer_inbox_full"
    return "insert"


def unknown_child_agents(children: Mapping[str, Iterable[str]], agents: Collection[str]) -> list[tuple[str, str]]:
    """`(agent, child)` pairs of `agents.<agent>.children` that name no configured agent, sorted."""
    return sorted((name, child) for name, names in children.items() for child in names if child not in agents)
