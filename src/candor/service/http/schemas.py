"""HTTP request bodies and response views (§8.3, §8.4, §8.6): the wire shapes, built from command rows.

Request bodies forbid unknown fields (S-96) and only check shapes; the commands own every rule that needs state
or settings (agent names, option sizes, resume coverage and limits). Bodies are handed to commands as the JSON
the client sent (`exclude_unset`), so idempotency digests see the request as written. Timestamps are rendered
as RFC 3339 UTC strings.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue, WithJsonSchema

from ..commands.rows import AttemptRow, EntryRow, RunRow, ThreadRow
from ..protocol.resume import ApprovalAnswer, CallAnswer, ResumeAnswers
from ..protocol.tool_recovery import TOOL_RECOVERY_MODES

__all__ = (
    "TextItem",
    "InputContent",
    "ClientTool",
    "RunOptions",
    "CreateThreadBody",
    "PostInputBody",
    "ForkBody",
    "ResumeBody",
    "EditEntryBody",
    "EntryOrderBody",
    "ThreadView",
    "EntryView",
    "PendingCallView",
    "PendingView",
    "FailureView",
    "RunView",
    "RunDetailView",
    "RecoveredCallView",
    "AttemptView",
    "AcceptedView",
    "RunPage",
    "EntryPage",
    "MessagePage",
    "AttemptList",
    "ErrorBody",
    "etag",
)


def etag(id: str, version: int) -> str:  # noqa: A002 - the spec's word
    """§8.1: `"{id}:{version}"` (quotes included)."""
    return f'"{id}:{version}"'


def _at(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


# --- request bodies ----------------------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextItem(_Body):
    type: Literal["text"]
    text: str


class InputContent(_Body):
    """§8.1: input content, wherever accepted; at least one item."""

    content: list[TextItem] = Field(min_length=1)


class ClientTool(_Body):
    """§8.8: a tool the client runs itself; the run waits on each call to it (`pending.calls`)."""

    name: str = Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_-]{0,63}$")
    description: str | None = None
    parameters: dict[str, JsonValue]
    """A JSON Schema object for the tool's arguments (at most 16 KiB)."""


class RunOptions(BaseModel):
    """`options`: a JSON object of at most 64 KiB handed to the agent's factory; frozen on the run.

    `client_tools` (§8.8) and `tool_recovery` are the keys the service itself reads; every other key belongs to the
    agent.
    """

    model_config = ConfigDict(extra="allow")

    client_tools: list[ClientTool] | None = Field(None, max_length=64)
    tool_recovery: Annotated[JsonValue, WithJsonSchema({"type": "string", "enum": sorted(TOOL_RECOVERY_MODES)})] = None
    """What a recovering attempt does with unanswered tool calls; wins over `[agents.<name>].tool_recovery`. Any JSON
    value passes the schema and is checked by the command (400 `invalid_argument`, reason `not_a_tool_recovery_mode`,
    a message naming the three modes), so every route and every wrong type answer alike."""


def _options(options: RunOptions | None) -> dict[str, Any] | None:
    return None if options is None else options.model_dump(mode="json", exclude_unset=True)


class CreateThreadBody(_Body):
    """`POST /v1/threads`."""

    agent: str = Field(min_length=1)
    input: InputContent
    options: RunOptions | None = None
    message_history: list[dict[str, JsonValue]] | None = None
    """pydantic-ai message JSON; stored once as the thread's imported base checkpoint (S-45)."""

    def arguments(self) -> dict[str, Any]:
        """Keyword arguments of `commands.create_thread`."""
        return {
            "agent": self.agent,
            "input": self.input.model_dump(mode="json"),
            "options": _options(self.options),
            "message_history": self.message_history,
        }


class PostInputBody(_Body):
    """`POST /v1/threads/{thread_id}/inbox`."""

    input: InputContent
    delivery: Literal["steer", "next_run"] = "next_run"
    agent: str | None = Field(None, min_length=1)
    options: RunOptions | None = None

    def arguments(self) -> dict[str, Any]:
        """Keyword arguments of `commands.post_input`."""
        return {
            "input": self.input.model_dump(mode="json"),
            "delivery": self.delivery,
            "agent": self.agent,
            "options": _options(self.options),
        }


class ForkBody(_Body):
    """`POST /v1/runs/{run_id}/fork`."""

    input: InputContent
    options: RunOptions | None = None

    def arguments(self) -> dict[str, Any]:
        """Keyword arguments of `commands.fork_run`."""
        return {"input": self.input.model_dump(mode="json"), "options": _options(self.options)}


class ResumeBody(_Body):
    """§8.6: both maps are required and must answer exactly the waiting run's pending groups (S-78)."""

    approvals: dict[str, ApprovalAnswer]
    calls: dict[str, CallAnswer]
    input: InputContent | None = None

    def answers(self) -> ResumeAnswers:
        """The one typed value of the answers (`protocol.resume`), built from this validated body without validating
        again; the fields the client left out stay unset, so its stored JSON is the body as the client wrote it."""
        fields: dict[str, Any] = {"approvals": self.approvals, "calls": self.calls}
        if self.input is not None:
            fields["input"] = self.input.model_dump(mode="json")
        return ResumeAnswers.model_construct(_fields_set=set(fields), **fields)


class EditEntryBody(_Body):
    """`PATCH /v1/threads/{thread_id}/inbox/{entry_id}`: the fields to change; at least one. `agent` or `options`
    set to `null` make the entry inherit them again when it starts."""

    input: InputContent | None = None
    delivery: Literal["steer", "next_run"] | None = None
    agent: str | None = Field(None, min_length=1)
    options: RunOptions | None = None

    def changes(self) -> dict[str, Any]:
        """The fields as the client sent them (`commands.edit_entry` tells a `null` from an absent field)."""
        return self.model_dump(mode="json", exclude_unset=True)


class EntryOrderBody(_Body):
    """`PUT /v1/threads/{thread_id}/inbox/order`: every pending entry, once, in the new order."""

    entry_ids: list[str]


# --- views -------------------------------------------------------------------------------------------------------


class ThreadView(BaseModel):
    """§8.4 ThreadView; `state` is derived (§5.6)."""

    id: str
    state: Literal["archived", "active", "waiting", "paused", "idle"]
    origin: Literal["new", "fork", "child"]
    origin_thread_id: str | None
    origin_run_id: str | None
    agent: str
    current_run_id: str | None
    last_run_id: str | None
    archived_at: AwareDatetime | None
    version: int
    created_at: AwareDatetime
    updated_at: AwareDatetime

    @classmethod
    def of(cls, row: ThreadRow) -> ThreadView:
        return cls(
            id=row.id,
            state=row.state,
            origin=row.origin,
            origin_thread_id=row.origin_thread_id,
            origin_run_id=row.origin_run_id,
            agent=row.agent,
            current_run_id=row.current_run_id,
            last_run_id=row.last_run_id,
            archived_at=_at(row.archived_at),
            version=row.version,
            created_at=_at(row.created_at),
            updated_at=_at(row.updated_at),
        )


class FailureView(BaseModel):
    """`{"code", "message"}` of a failed or cancelled run, attempt or entry (§12.3)."""

    model_config = ConfigDict(extra="allow")

    code: str
    message: str = ""


def _failure(value: Mapping[str, Any] | None) -> FailureView | None:
    return None if value is None else FailureView.model_validate(value)


class EntryView(BaseModel):
    """§8.4 EntryView."""

    id: str
    thread_id: str
    kind: Literal["message", "child_result"]
    delivery: Literal["steer", "next_run"]
    position: int
    status: str
    agent: str | None
    assigned_run_id: str | None
    failure: FailureView | None
    created_at: AwareDatetime
    finished_at: AwareDatetime | None

    @classmethod
    def of(cls, row: EntryRow) -> EntryView:
        return cls(
            id=row.id,
            thread_id=row.thread_id,
            kind=row.kind,
            delivery=row.delivery,
            position=row.position,
            status=row.status,
            agent=row.agent,
            assigned_run_id=row.assigned_run_id,
            failure=_failure(row.failure),
            created_at=_at(row.created_at),
            finished_at=_at(row.finished_at),
        )


class PendingCallView(BaseModel):
    """§5.7 PendingCall: a call the run waits on."""

    tool_call_id: str
    tool_name: str
    arguments: dict[str, JsonValue]
    kind: Literal["approval", "external", "question"]
    metadata: dict[str, JsonValue]


class PendingView(BaseModel):
    """§5.7: approvals in `approvals`; external calls and questions in `calls`."""

    approvals: list[PendingCallView]
    calls: list[PendingCallView]


class RecoveredCallView(BaseModel):
    """A tool call that recovery closed when an attempt continued from a checkpoint with unanswered calls."""

    tool_call_id: str
    tool_name: str
    outcome: Literal["replayed", "reconciled", "rerun", "unknown"]
    """`replayed`: a retry-safe call ran again; `reconciled`: its reconciler confirmed the effect and gave the result;
    `rerun`: its reconciler said the effect had not happened, so the call ran again; `unknown`: the unknown-outcome
    result (docs/state-and-resume.md)."""
    reason: str | None = None
    """Why: `retry_safe`, `mode_always`, `not_retry_safe`, `tool_missing`, `mode_never`, `reconciled`, … (the
    harness's recovery reasons); null when the checkpoint does not record it (docs/mcp.md)."""
    declared_by: Literal["annotation", "override", "decorator", "none"] | None = None
    """Where the tool's retry-safety came from: its MCP annotations, an operator override (`retry_safe` /
    `never_retry`), the `recovery_retryable` decorator (or equivalent metadata), or nowhere."""
    declaration_changed: bool | None = None
    """True when the MCP server declared the tool differently at recovery than when the call was made; the call
    was judged by the declaration recorded with the call (docs/mcp.md)."""


class RunView(BaseModel):
    """§8.4 RunView."""

    id: str
    thread_id: str
    agent: str
    principal_id: str
    """The API key the run acts for (§4.3): the key whose input the run was accepted for. A resume successor keeps
    its waiting run's key (S-80)."""
    status: Literal["accepted", "running", "waiting", "completed", "failed", "cancelled"]
    trigger: Literal["input", "queued", "resume", "child_result", "spawned"]
    lineage: Literal["root", "continue", "fork"]
    parent_run_id: str | None
    wait_reason: Literal["approval", "call", "multiple"] | None
    pending: PendingView | None
    output: Any
    failure: FailureView | None
    attempts: int
    max_attempts: int
    tool_recovery: Literal["declared", "never", "always"]
    """The run's recovery mode for unanswered tool calls, fixed at acceptance (options, else the agent's)."""
    cancel_requested_at: AwareDatetime | None
    current_attempt_id: str | None
    checkpoint_seq: int
    usage: dict[str, Any] | None
    created_at: AwareDatetime
    started_at: AwareDatetime | None
    sealed_at: AwareDatetime | None
    version: int

    @classmethod
    def of(cls, row: RunRow) -> RunView:
        pending = None if row.pending is None else PendingView.model_validate(row.pending)
        return cls(
            id=row.id,
            thread_id=row.thread_id,
            agent=row.agent,
            principal_id=row.principal_id,
            status=row.status,
            trigger=row.trigger,
            lineage=row.lineage,
            parent_run_id=row.parent_run_id,
            wait_reason=row.wait_reason,
            pending=pending,
            output=row.output,
            failure=_failure(row.failure),
            attempts=row.attempts,
            max_attempts=row.max_attempts,
            tool_recovery=row.tool_recovery,
            cancel_requested_at=_at(row.cancel_requested_at),
            current_attempt_id=row.current_attempt_id,
            checkpoint_seq=row.checkpoint_seq,
            usage=row.usage,
            created_at=_at(row.created_at),
            started_at=_at(row.started_at),
            sealed_at=_at(row.sealed_at),
            version=row.version,
        )


class RunDetailView(RunView):
    """`GET /v1/runs/{id}`: the RunView plus `recovery`, read from the messages the run added."""

    recovery: list[RecoveredCallView]
    """The tool calls recovery closed when an attempt continued from a checkpoint, in history order."""

    @classmethod
    def detail(cls, row: RunRow, recovery: list[Any]) -> RunDetailView:
        calls = [
            RecoveredCallView(
                tool_call_id=c.tool_call_id,
                tool_name=c.tool_name,
                outcome=c.outcome,
                reason=c.reason,
                declared_by=c.declared_by,
                declaration_changed=c.declaration_changed,
            )
            for c in recovery
        ]
        return cls(**RunView.of(row).model_dump(), recovery=calls)


class AttemptView(BaseModel):
    """§8.4 AttemptView."""

    id: str
    run_id: str
    number: int
    status: Literal["leased", "running", "succeeded", "yielded", "failed", "cancelled"]
    start_reason: Literal["initial", "recovery", "handoff"]
    replaces_attempt_id: str | None
    worker_id: str
    lease_expires_at: AwareDatetime
    yield_reason: str | None
    failure: FailureView | None
    created_at: AwareDatetime
    started_at: AwareDatetime | None
    finished_at: AwareDatetime | None

    @classmethod
    def of(cls, row: AttemptRow) -> AttemptView:
        return cls(
            id=row.id,
            run_id=row.run_id,
            number=row.number,
            status=row.status,
            start_reason=row.start_reason,
            replaces_attempt_id=row.replaces_attempt_id,
            worker_id=row.worker_id,
            lease_expires_at=_at(row.lease_expires_at),
            yield_reason=row.yield_reason,
            failure=_failure(row.failure),
            created_at=_at(row.created_at),
            started_at=_at(row.started_at),
            finished_at=_at(row.finished_at),
        )


class AcceptedView(BaseModel):
    """What a thread, message or fork request created, as it is now (201; 200 for a replay, S-90)."""

    thread: ThreadView
    entry: EntryView
    run: RunView | None
    """The run the entry started; `null` while it is queued (S-66, S-69)."""


class RunPage(BaseModel):
    """§8.1 list shape; `next_cursor` is `null` on the last page (S-98)."""

    items: list[RunView]
    next_cursor: str | None


class EntryPage(BaseModel):
    """§8.1 list shape of inbox entries, in position order; `next_cursor` is `null` on the last page (S-98)."""

    items: list[EntryView]
    next_cursor: str | None


class MessagePage(BaseModel):
    """The messages a run added, as pydantic-ai message JSON (`ModelMessagesTypeAdapter`), in history order."""

    items: list[dict[str, JsonValue]]
    next_cursor: str | None


class AttemptList(BaseModel):
    """A run's attempts in number order; not paged, so `next_cursor` is always `null`."""

    items: list[AttemptView]
    next_cursor: None = None


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: dict[str, Any]
    request_id: str | None


class ErrorBody(BaseModel):
    """§8.1: every error answer."""

    error: ErrorDetail
