"""How a run starts (H-58, H-59, H-80, H-91): decided from the restored history and the batch before `agent.iter`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic_ai.messages import ModelMessage

from ._steering import InputValue
from .deferred import DeferredToolResume
from .history import last_response, unanswered_calls

__all__ = ("StartPlan", "plan_start")


@dataclass(frozen=True, slots=True, kw_only=True)
class StartPlan:
    """What is prompted, what waits, and whether open calls come first."""

    batch: DeferredToolResume | None
    """The batch the run applies: a recovery batch is reduced to what history has not incorporated (H-91)."""
    provider_suspended: bool
    """H-59: the history ends with a response the provider suspended; pydantic-ai continues it natively."""
    queued_input: InputValue
    """H-59: the input, queued to follow the continued response (None if nothing waits)."""
    user_input: InputValue
    """The input still to deliver once open calls are closed (None once it was queued, H-59)."""
    iter_prompt: InputValue
    """The prompt `agent.iter` gets: the input, unless open calls or a fresh batch must be answered first."""
    has_open_start: bool
    """Unanswered calls of the last response, or a fresh deferred batch, are handled before the first request."""


def plan_start(
    history: Sequence[ModelMessage], *, batch: DeferredToolResume | None, user_input: InputValue
) -> StartPlan:
    """Decide how the run starts from the restored history, the batch and the resolved input."""
    if batch is not None and batch.recovery:
        batch = batch.remaining(history)  # H-91: incorporated → no batch
    last = last_response(history)
    provider_suspended = bool(history) and last is not None and last.state == "suspended" and history[-1] is last
    open_calls = [] if provider_suspended else unanswered_calls(history)
    has_open_start = bool(open_calls) or (batch is not None and not batch.recovery)
    queued_input: InputValue = None
    if provider_suspended and user_input is not None:
        queued_input, user_input = user_input, None  # H-59: pydantic-ai continues the response first
    return StartPlan(
        batch=batch,
        provider_suspended=provider_suspended,
        queued_input=queued_input,
        user_input=user_input,
        iter_prompt=None if has_open_start else user_input,
        has_open_start=has_open_start,
    )
