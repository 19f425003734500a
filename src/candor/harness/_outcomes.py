"""How a run's end becomes its result candidate: completed, suspended, or failed/cancelled with a safe state (H-103)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, Literal, TypeVar

from pydantic_ai import DeferredToolRequests
from pydantic_ai.messages import ModelMessage
from pydantic_ai.usage import RunUsage

from ._canonical import CanonicalHistory
from ._detach import detached
from ._usage_state import record_usage
from .candidates import normalize_candidate, pending_answer_ids
from .capability_store import CapabilityStore
from .deferred import DeferredToolResume
from .results import RunResult, SafeFailure
from .state import HarnessState, _trusted_state

OutputT = TypeVar("OutputT")

__all__ = ("RunOutcomes", "deferred_unsupported_failure", "usage_limit_failure")


def deferred_unsupported_failure() -> SafeFailure:
    """The run suspended for an approval or an outside answer on a host that cannot give one."""
    return SafeFailure(
        code="deferred_tools_unsupported",
        message="The run needed an approval or an outside answer, which this host cannot give.",
    )


def usage_limit_failure(exc: BaseException) -> SafeFailure:
    """pydantic-ai's usage-limit error, as a safe failure (STYLE habit 3)."""
    return SafeFailure(
        code="usage_limit_exceeded",
        message="A usage limit of the run was exceeded.",
        details={"error_type": type(exc).__name__},
    )


class RunOutcomes(Generic[OutputT]):
    """Builds the final states and result candidates of one run from its canonical history, store and environment."""

    def __init__(
        self,
        *,
        thread_id: str,
        run_id: str,
        history: CanonicalHistory,
        store: CapabilityStore,
        environment: dict[str, Any],
    ) -> None:
        self._thread_id = thread_id
        self._run_id = run_id
        self._history = history
        self._store = store
        self._environment = environment
        """The run's environment entries (the stream updates them in place at every boundary)."""

    def completed(self, output: Any, *, usage: RunUsage) -> RunResult[OutputT]:
        state = self._final_state(self._history.messages, usage)
        return RunResult(
            thread_id=self._thread_id,
            run_id=self._run_id,
            status="completed",
            output=output,
            state=state,
            usage=usage,
            messages=state._history_ref(),
            new_message_index=self._history.base_len,
        )

    def suspended(self, deferred: DeferredToolRequests, *, usage: RunUsage) -> RunResult[OutputT]:
        state = self._final_state(self._history.messages, usage)
        return RunResult(
            thread_id=self._thread_id,
            run_id=self._run_id,
            status="suspended",
            state=state,
            usage=usage,
            suspend_reason="deferred",
            deferred=deferred,
            messages=state._history_ref(),
            new_message_index=self._history.base_len,
        )

    def terminal(
        self,
        status: Literal["failed", "cancelled"],
        *,
        usage: RunUsage,
        run: Any,
        batch: DeferredToolResume | None,
        failure: SafeFailure | None = None,
    ) -> RunResult[OutputT]:
        """A failed/cancelled result with the safe candidate state of H-103, or without state if none can be built.

        `run` is pydantic-ai's `AgentRun` (None before `agent.iter` started): what it produced after the last
        boundary is cleaned and kept; calls `batch` still holds answers for stay open for the host to re-offer."""
        stable = self._history.messages
        try:
            messages = self._history.with_run_tail(run)
            pending = pending_answer_ids(batch, messages)
            normalized = normalize_candidate(messages, stable_prefix=len(stable), pending_answer_ids=pending)
            state: HarnessState | None = self._final_state(normalized, usage)
        except Exception:  # noqa: BLE001 - a candidate is best effort (H-98: run_state_unavailable)
            state = None
            normalized = list(stable)
        return RunResult(
            thread_id=self._thread_id,
            run_id=self._run_id,
            status=status,
            state=state,
            usage=usage,
            failure=failure,
            messages=normalized,
            new_message_index=self._history.base_len,
        )

    def _final_state(self, history: Sequence[ModelMessage], usage: RunUsage) -> HarnessState:
        record_usage(self._store, usage)
        return _trusted_state(
            thread_id=self._thread_id,
            message_history=tuple(history),
            capabilities=self._store.snapshot_now(),
            environment=detached(self._environment),
        )
