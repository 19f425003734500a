"""RunResult and SafeFailure: what a finished run hands back (spec §3.8, rules H-24 to H-29, H-34).

A result is immutable and every accessor returns a deep copy, so nothing a caller does to a value it read
changes what later reads return (H-27).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue
from pydantic_ai import DeferredToolRequests
from pydantic_ai.messages import ModelMessage
from pydantic_ai.usage import RunUsage

from .errors import RetryHint, RunError
from .ids import RUN_ID_PATTERN
from .state import HarnessState

OutputT = TypeVar("OutputT")
RunStatus = Literal["completed", "suspended", "failed", "cancelled"]

__all__ = ("RunResult", "SafeFailure", "RunStatus")


class SafeFailure(BaseModel):
    """Why a run failed, in a form that is safe to show and store: a stable code, never a raw exception."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: str = Field(min_length=1)
    message: str
    details: dict[str, JsonValue] = Field(default_factory=dict)
    retry_hint: Literal["none", "new_run", "dependency_change"] = "none"


# §3.8: status → (required fields, forbidden fields)
_FIELD_RULES: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "completed": (frozenset({"state"}), frozenset({"failure", "suspend_reason", "deferred"})),
    "suspended": (frozenset({"state", "deferred", "suspend_reason"}), frozenset({"failure", "output"})),
    "failed": (frozenset({"failure"}), frozenset({"output", "suspend_reason", "deferred"})),
    "cancelled": (frozenset(), frozenset({"output", "failure", "suspend_reason", "deferred"})),
}


class RunResult(Generic[OutputT]):
    """The outcome of one run. Construct it only through the harness, `replace()`, or for tests."""

    __slots__ = (
        "_deferred",
        "_failure",
        "_messages",
        "_new_message_index",
        "_output",
        "_run_id",
        "_state",
        "_status",
        "_suspend_reason",
        "_thread_id",
        "_usage",
    )

    def __init__(
        self,
        *,
        thread_id: str,
        run_id: str,
        status: RunStatus,
        output: OutputT | None = None,
        state: HarnessState | None = None,
        usage: RunUsage | None = None,
        failure: SafeFailure | None = None,
        suspend_reason: Literal["deferred"] | None = None,
        deferred: DeferredToolRequests | None = None,
        messages: Sequence[ModelMessage] | None = None,
        new_message_index: int = 0,
    ) -> None:
        if not isinstance(thread_id, str) or not thread_id.strip() or not isinstance(run_id, str) or not run_id.strip():
            raise ValueError("a RunResult needs a non-blank thread_id and run_id")
        if RUN_ID_PATTERN.fullmatch(run_id) is None:
            raise ValueError("run_id must match ^run_[0-9a-f]{32}$")
        if status not in _FIELD_RULES:
            raise ValueError(f"unknown run status {status!r}")
        present = {
            "state": state is not None,
            "failure": failure is not None,
            "suspend_reason": suspend_reason is not None,
            "deferred": deferred is not None,
            "output": output is not None,
        }
        required, forbidden = _FIELD_RULES[status]
        if missing := sorted(name for name in required if not present[name]):
            raise ValueError(f"a {status} RunResult requires {', '.join(missing)}")
        if extra := sorted(name for name in forbidden if present[name]):
            raise ValueError(f"a {status} RunResult must not have {', '.join(extra)}")
        if suspend_reason is not None and suspend_reason != "deferred":
            raise ValueError("suspend_reason must be 'deferred'")
        if state is not None and state.thread_id != thread_id:
            raise ValueError("the state's thread_id differs from the result's thread_id")
        if status == "completed" and isinstance(output, DeferredToolRequests):
            raise ValueError("a completed run cannot have DeferredToolRequests as its output")
        if failure is not None and not isinstance(failure, SafeFailure):
            raise ValueError("failure must be a SafeFailure")
        owned = messages is None or (state is not None and messages is state._history_ref())
        if messages is None:
            messages = state._history_ref() if state is not None else ()
        self._thread_id = thread_id
        self._run_id = run_id
        self._status: RunStatus = status
        self._output = copy.deepcopy(output)
        self._state = state
        self._usage = copy.deepcopy(usage) if usage is not None else RunUsage()
        self._failure = copy.deepcopy(failure)  # SafeFailure.details is a mutable dict (H-27)
        self._suspend_reason = suspend_reason
        self._deferred = copy.deepcopy(deferred)
        # A state's own history is immutable from the outside (reads are detached): no copy needed.
        self._messages: tuple[ModelMessage, ...] = tuple(messages) if owned else tuple(copy.deepcopy(list(messages)))
        self._new_message_index = max(0, min(new_message_index, len(self._messages)))

    # -- read-only accessors (deep copies, H-27) ---------------------------------------------------------
    @property
    def thread_id(self) -> str:
        return self._thread_id

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def status(self) -> RunStatus:
        return self._status

    @property
    def output(self) -> OutputT | None:
        return copy.deepcopy(self._output)

    @property
    def state(self) -> HarnessState | None:
        # HarnessState is frozen and detaches its own reads; sharing it is safe.
        return self._state

    @property
    def usage(self) -> RunUsage:
        return copy.deepcopy(self._usage)

    @property
    def failure(self) -> SafeFailure | None:
        return copy.deepcopy(self._failure)

    @property
    def suspend_reason(self) -> Literal["deferred"] | None:
        return self._suspend_reason

    @property
    def deferred(self) -> DeferredToolRequests | None:
        return copy.deepcopy(self._deferred)

    def all_messages(self) -> list[ModelMessage]:
        """The whole history as of the end of the run (H-34: equals `state.message_history` when completed or
        suspended)."""
        return copy.deepcopy(list(self._messages))

    def new_messages(self) -> list[ModelMessage]:
        """Exactly the messages this run appended, unknown-outcome requests included (H-34)."""
        return copy.deepcopy(list(self._messages[self._new_message_index :]))

    def replace(self, **changes: Any) -> RunResult[OutputT]:
        """A validated copy with `changes` applied."""
        fields: dict[str, Any] = {
            "thread_id": self._thread_id,
            "run_id": self._run_id,
            "status": self._status,
            "output": self._output,
            "state": self._state,
            "usage": self._usage,
            "failure": self._failure,
            "suspend_reason": self._suspend_reason,
            "deferred": self._deferred,
            "messages": self._messages,
            "new_message_index": self._new_message_index,
        }
        unknown = set(changes) - set(fields)
        if unknown:
            raise ValueError(f"unknown RunResult fields: {', '.join(sorted(unknown))}")
        if "state" in changes and "messages" not in changes:
            new_state = changes["state"]
            fields["messages"] = new_state._history_ref() if new_state is not None else self._messages
        fields.update(changes)
        return RunResult(**fields)

    def raise_for_status(self) -> None:
        """Return for `completed`; raise a `RunError` for every other status (H-28)."""
        if self._status == "completed":
            return
        if self._status == "suspended":
            raise RunError(
                "the run is suspended waiting for deferred answers", code="run_suspended", retry_hint="new_run"
            )
        if self._status == "cancelled":
            raise RunError("the run was cancelled", code="run_cancelled", retry_hint="new_run")
        failure = self._failure
        assert failure is not None
        hint: RetryHint = failure.retry_hint
        raise RunError(failure.message, code=failure.code, details=copy.deepcopy(failure.details), retry_hint=hint)

    def output_or_raise(self) -> OutputT | None:
        """The output of a completed run, even a legitimate `None` (H-29); otherwise raises like H-28."""
        self.raise_for_status()
        return self.output

    def __repr__(self) -> str:
        return f"RunResult(status={self._status!r}, thread_id={self._thread_id!r}, run_id={self._run_id!r})"
