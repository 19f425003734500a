"""The derived state of a thread (§5.6): the first matching row of the table wins."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from .transitions import SealedRunStatus

__all__ = ("ThreadState", "thread_state")

ThreadState = Literal["archived", "active", "waiting", "paused", "idle"]


def thread_state(
    *,
    archived_at: datetime | None,
    current_run_id: str | None,
    last_run_status: SealedRunStatus | None,
    last_run_has_successor: bool,
) -> ThreadState:
    """S-64, S-69, S-70, S-86: §5.6, first match wins.

    ``last_run_status`` is the status of ``threads.last_run_id`` (the most recently sealed run), ``None`` if the
    thread has no sealed run; ``last_run_has_successor`` says whether a resume successor of that run exists.
    """
    if archived_at is not None:
        return "archived"
    if current_run_id is not None:
        return "active"
    if last_run_status == "waiting" and not last_run_has_successor:
        return "waiting"
    if last_run_status in ("failed", "cancelled"):
        return "paused"
    return "idle"
