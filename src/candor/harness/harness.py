"""Harness: a pydantic-ai Agent made resumable. State + bindings + policy in, one run, RunResult out (spec §3.5)."""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

from pydantic_ai.agent import AbstractAgent
from pydantic_ai.messages import UserContent
from pydantic_ai.usage import RunUsage, UsageLimits

from ._usage_state import stored_usage
from .bindings import RunBindings, validate_bindings
from .deferred import DeferredToolResume
from .errors import RunError
from .recovery import validate_tool_recovery
from .results import RunResult
from .resume_check import check_resume
from .state import HarnessState
from .stream import RunStream

OutputT = TypeVar("OutputT")
InputValue = str | Sequence[UserContent] | None

__all__ = ("Harness",)


class Harness(Generic[OutputT]):
    """Wraps an agent so a conversation can stop in one process and continue in another.

    The harness holds no credentials and persists nothing: every run gets fresh bindings, deps, capability
    objects and usage accumulator; saving states and keeping accepted answers is the host's job.
    """

    def __init__(self, agent: AbstractAgent[Any, OutputT], *, usage_limits: UsageLimits | None = None) -> None:
        self.agent = agent
        self.usage_limits = usage_limits

    async def run(self, input: InputValue = None, **options: Any) -> RunResult[OutputT]:  # noqa: A002 - spec name
        """Exactly like entering `stream(...)`, consuming every event and returning `stream.outcome` (H-106)."""
        stream = self.stream(input, **options)
        async with stream:
            async for _ in stream:
                pass
        outcome = stream.outcome
        if outcome is None:
            raise RunError("the run ended without any result candidate", code="run_result_missing")
        return outcome

    def stream(
        self,
        input: InputValue = None,  # noqa: A002 - the spec's parameter name (§3.5)
        *,
        input_factory: Callable[[], Awaitable[InputValue]] | None = None,
        previous_state: HarnessState | None = None,
        bindings: RunBindings | None = None,
        tool_recovery: str = "declared",
        deferred_resume: DeferredToolResume | None = None,
        usage: RunUsage | None = None,
        resume_usage: bool = False,
        usage_limits: UsageLimits | None = None,
    ) -> RunStream[OutputT]:
        """A lazy stream of this run's events. Argument problems raise here, before any model work (H-64)."""
        mode = validate_tool_recovery(tool_recovery)  # H-61: ValueError at call time
        if input is not None and input_factory is not None:
            raise RunError("give either input or input_factory, not both", code="input_source_conflict")
        run_bindings = validate_bindings(bindings)
        if previous_state is not None and not isinstance(previous_state, HarnessState):
            raise RunError("previous_state must be a candor.HarnessState", code="run_bindings_invalid")
        state = previous_state if previous_state is not None else HarnessState.new()
        if isinstance(deferred_resume, DeferredToolResume) and deferred_resume.recovery and previous_state is not None:
            # H-89, H-91: a re-offered batch is first reduced to what history has not incorporated.
            deferred_resume = deferred_resume.remaining(state._history_ref())
        if deferred_resume is not None:
            check_resume(deferred_resume, state._history_ref(), has_previous_state=previous_state is not None)
        start_usage = copy.deepcopy(usage) if usage is not None else RunUsage()
        if resume_usage:
            start_usage = stored_usage(state)  # H-33
        return RunStream(
            self,
            input=input,
            input_factory=input_factory,
            previous_state=state,
            bindings=run_bindings,
            tool_recovery=mode,
            deferred_resume=deferred_resume,
            usage=start_usage,
            # H-32: a run-level limit replaces the harness default entirely
            usage_limits=usage_limits if usage_limits is not None else self.usage_limits,
        )
