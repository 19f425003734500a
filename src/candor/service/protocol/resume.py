"""(pure) Resuming a waiting run (§8.6): the one typed value of the answers, and the decisions around it.

`ResumeAnswers` is built once from the request (the HTTP body is one, `from_request` builds one from a plain mapping),
stored as its own JSON on the successor (`runs.resume`, `stored_json()`), read back with `from_stored()` and
converted once to the pydantic-ai `DeferredToolResults` the successor's attempts pass on (`to_results()`).

The decisions: `resume_refusal` (the checks on the locked thread, first failure wins), `split_resume_lookup` (which
of the rows read before locking is the replay and which the run to resume) and `successor_of` (the run a resume
creates). They read rows through the small protocols below, so this module needs no store import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError
from pydantic_ai import DeferredToolResults, ToolApproved, ToolDenied
from pydantic_ai.exceptions import ToolFailed

from ..errors import Conflict, Disabled, Forbidden, InvalidArgument, ServiceError
from .json_types import JsonObject
from .new_run import NewRun
from .pending import Pending, coverage_mismatch
from .tool_recovery import ToolRecovery

__all__ = (
    "Approve",
    "Deny",
    "Returned",
    "Failed",
    "ApprovalAnswer",
    "CallAnswer",
    "ResumeAnswers",
    "StoredResume",
    "parse_stored_resume",
    "ResumeLookup",
    "split_resume_lookup",
    "resume_refusal",
    "successor_of",
)


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Approve(_Answer):
    action: Literal["approve"]
    arguments: dict[str, JsonValue] | None = None
    """Run the tool with these arguments instead of the model's (checked against the tool's schema at resume when
    the agent can be built there, by the worker otherwise: `deferred_override_invalid`); absent or null: the model's
    arguments."""


class Deny(_Answer):
    action: Literal["deny"]
    reason: str | None = None
    """Shown to the model; a default message when absent."""


class Returned(_Answer):
    status: Literal["returned"]
    value: JsonValue
    """The call's return value, any JSON."""


class Failed(_Answer):
    status: Literal["failed"]
    message: str


ApprovalAnswer = Annotated[Approve | Deny, Field(discriminator="action")]
CallAnswer = Annotated[Returned | Failed, Field(discriminator="status")]


class ResumeAnswers(BaseModel):
    """§8.6: the answers to a waiting run's pending items (S-78), and an optional input that follows them (S-88).

    `input` is §8.1 input content as JSON (`{"content": [{"type": "text", "text": …}, …]}`); the request check
    (`protocol.requests.checked_resume_body`) validates it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    approvals: dict[str, ApprovalAnswer]
    calls: dict[str, CallAnswer]
    input: dict[str, JsonValue] | None = None

    @classmethod
    def from_stored(cls, stored: Mapping[str, object]) -> ResumeAnswers:
        """The value of a successor's `runs.resume` (written by `stored_json()`); raises `ValueError` when the stored
        JSON is not one (corrupt data: every stored value was built from a checked request)."""
        return cls.model_validate(stored)

    def stored_json(self) -> JsonObject:
        """The JSON form stored on the successor and digested for idempotency (§8.2): the answers as the client
        wrote them (fields it left out stay out; an absent or null `input` is left out)."""
        body: JsonObject = self.model_dump(mode="json", exclude_unset=True)
        if body.get("input", ...) is None:
            del body["input"]
        return body

    def to_results(self) -> DeferredToolResults:
        """S-132, §8.6: `approve` → `ToolApproved()` (`override_args` with edited arguments), `deny` →
        `ToolDenied(reason or the default)`, `returned` → the plain value, `failed` → `ToolFailed(message)`."""
        results = DeferredToolResults()
        for call_id, approval in self.approvals.items():
            match approval:
                case Approve(arguments=None):
                    results.approvals[call_id] = ToolApproved()
                case Approve(arguments=arguments):
                    # Edited arguments (an addition to §8.6 for the approvals console) become `override_args`.
                    results.approvals[call_id] = ToolApproved(override_args=dict(arguments or {}))
                case Deny(reason=reason):
                    # An absent, null or empty reason gets pydantic-ai's default denial message.
                    results.approvals[call_id] = ToolDenied(reason) if reason else ToolDenied()
        for call_id, call in self.calls.items():
            match call:
                case Returned(value=value):
                    results.calls[call_id] = value
                case Failed(message=message):
                    results.calls[call_id] = ToolFailed(message)
        return results


@dataclass(frozen=True, slots=True)
class StoredResume:
    """A successor's stored answers as its claim reads them: parsed once, or why they could not be."""

    answers: ResumeAnswers | None
    """The answers of a resume successor; None for every other run, and when `problem` is set."""
    problem: str | None = None
    """Why the stored JSON is not a `ResumeAnswers` (corrupt data); the attempt fails `deferred_results_invalid`."""


def parse_stored_resume(stored: object) -> StoredResume:
    """S-87: `runs.resume` as the claim hands it to the attempt. Never raises: one corrupt row must not fail the
    claim of the others, so a value that does not parse is returned as a `problem` for its own attempt to report."""
    if stored is None:
        return StoredResume(answers=None)
    if not isinstance(stored, Mapping):
        return StoredResume(answers=None, problem=f"the stored answers are not a JSON object ({type(stored).__name__})")
    try:
        return StoredResume(answers=ResumeAnswers.from_stored(stored))
    except ValidationError as exc:
        where = ".".join(str(part) for part in exc.errors()[0]["loc"]) or "the top level"
        return StoredResume(answers=None, problem=f"the stored answers do not validate (first error at {where})")


# --- the rows the decisions read (structural, so the protocol does not import the store) -------------------------


class ResumeRow(Protocol):
    """A run row as the resume lookup and the successor read it."""

    @property
    def id(self) -> str: ...
    @property
    def workspace_id(self) -> str: ...
    @property
    def resumed_by_id(self) -> str | None: ...
    @property
    def request_key(self) -> str | None: ...


class WaitingRun(ResumeRow, Protocol):
    """The run a resume targets."""

    @property
    def thread_id(self) -> str: ...
    @property
    def agent(self) -> str: ...
    @property
    def principal_id(self) -> str: ...
    @property
    def authority(self) -> Mapping[str, JsonValue]: ...
    @property
    def options(self) -> Mapping[str, JsonValue]: ...
    @property
    def checkpoint_id(self) -> str | None: ...
    @property
    def tool_recovery(self) -> ToolRecovery: ...
    @property
    def pending(self) -> object: ...


class ThreadFacts(Protocol):
    """The locked thread as `resume_refusal` reads it."""

    @property
    def id(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def last_run_id(self) -> str | None: ...


class AuthorityView(Protocol):
    """The caller's authority as `resume_refusal` reads it (§4.3)."""

    @property
    def workspace_archived(self) -> bool: ...
    def verdict(self) -> str: ...


RowT = TypeVar("RowT", bound=ResumeRow)


@dataclass(frozen=True, kw_only=True, slots=True)
class ResumeLookup(Generic[RowT]):
    """What one resume request reads before it locks anything."""

    replay: RowT | None
    """The successor this principal already created with this key (§8.2), whatever has happened to it since."""
    target: RowT | None
    """The run to resume, when it exists in the principal's workspace (S-126: otherwise it reads as unknown)."""


def split_resume_lookup(
    found: Iterable[RowT], *, principal_id: str, key: str, workspace_id: str, run_id: str
) -> ResumeLookup[RowT]:
    """Which of the rows is the replay and which the run to resume; one row may be both (a successor resumed
    again with the key that created it), and a row matching neither is ignored."""
    replay = target = None
    for run in found:
        if run.resumed_by_id == principal_id and run.request_key == key:
            replay = run
        if run.id == run_id and run.workspace_id == workspace_id:
            target = run
    return ResumeLookup(replay=replay, target=target)


def resume_refusal(
    thread: ThreadFacts, waiting: WaitingRun, facts: AuthorityView, answers: ResumeAnswers
) -> ServiceError | None:
    """§8.6 steps 3–6 on the locked thread, the first that fails: archived workspace (S-128) → archived thread
    (S-84) → not the thread's last, waiting run (S-77) → pending coverage (S-78) → `run` no longer held (§4.3)."""
    if facts.workspace_archived:
        return Disabled(waiting.workspace_id)
    if thread.state == "archived":
        return Conflict("archived", kind="thread", id=thread.id)
    if thread.state != "waiting" or thread.last_run_id != waiting.id:
        return Conflict("not_idle_waiting_run", kind="run", id=waiting.id)
    pending = Pending.model_validate(waiting.pending)
    mismatch = coverage_mismatch(pending, answers.approvals.keys(), answers.calls.keys())
    if mismatch is not None:
        return InvalidArgument(reason="pending_coverage_mismatch", details=mismatch.details())
    if facts.verdict() != "allowed":
        return Forbidden("run")
    return None


def successor_of(
    waiting: WaitingRun, *, answers: ResumeAnswers, resumed_by_id: str, key: str, digest: str, max_attempts: int
) -> NewRun:
    """S-80, §8.6 step 7: trigger `resume`, lineage `continue`, the waiting run's agent, options, principal and
    authority, starting from its final checkpoint; `max_attempts` is the setting at acceptance (S-10). The answers
    are stored as their JSON (`ResumeAnswers.stored_json()`)."""
    return NewRun(
        workspace_id=waiting.workspace_id,
        thread_id=waiting.thread_id,
        agent=waiting.agent,
        principal_id=waiting.principal_id,
        authority=dict(waiting.authority),
        options=dict(waiting.options),
        trigger="resume",
        lineage="continue",
        parent_run_id=waiting.id,
        start_checkpoint_id=waiting.checkpoint_id,
        max_attempts=max_attempts,
        tool_recovery=waiting.tool_recovery,  # the same logical run continues: its recovery mode stays
        resume=answers.stored_json(),
        resumed_by_id=resumed_by_id,
        request_key=key,
        request_digest=digest,
    )
