"""Events the harness adds to pydantic-ai's own stream events (spec §3.7)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .results import RunResult

__all__ = ("BoundaryEvent", "RunResultEvent")


@dataclass(frozen=True, kw_only=True)
class BoundaryEvent:
    """A safe boundary was reached; the run waits for the consumer before going on (H-35, H-36)."""

    kind: Literal["model", "tool"]
    """`tool`: a response with tool calls arrived, no tool started yet. `model`: a request is about to be sent."""
    index: int
    """Boundaries of this run, counted from 1."""
    message_count: int
    """History length at the boundary."""
    incorporated_keys: tuple[str, ...] = ()
    """Keys of steering inputs that entered history since the previous boundary (H-104)."""
    event_kind: Literal["candor_boundary"] = "candor_boundary"


@dataclass(frozen=True)
class RunResultEvent:
    """The last event of a run that shut down cleanly."""

    result: RunResult[Any]
    event_kind: Literal["candor_run_result"] = "candor_run_result"
