"""Response views of the run inspector's reads (`GET /v1/threads`, `GET /v1/runs/{id}/answers`,
`GET /v1/runs/{id}/tools`), built from command values; timestamps are RFC 3339 UTC strings."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel

from ..commands.inspection import RunAnswers, RunTools
from .schemas import ThreadView

__all__ = ("ThreadPage", "RunAnswersView", "ToolDeclarationView", "RunToolsView")


class ThreadPage(BaseModel):
    """§8.1 list shape of threads, newest first; `next_cursor` is `null` on the last page (S-98)."""

    items: list[ThreadView]
    next_cursor: str | None


class RunAnswersView(BaseModel):
    """The answers of the resume that started this run (§8.6), who sent them and when."""

    run_id: str
    """The successor run the answers started."""
    answered_run_id: str
    """The waiting run they answered (the successor's `parent_run_id`)."""
    answered_by: str
    """The id of the API key that sent the resume (`key_…`)."""
    answered_at: AwareDatetime
    approvals: dict[str, Any]
    """Call id → the approval's answer (`{"action": "approve" | "deny", ...}`), as sent."""
    calls: dict[str, Any]
    """Call id → the external call's or question's answer (`{"status": "returned" | "failed", ...}`), as sent."""
    input: dict[str, Any] | None
    """The message sent with the answers, if any."""

    @classmethod
    def of(cls, value: RunAnswers) -> RunAnswersView:
        answers = value.answers
        return cls(
            run_id=value.run_id,
            answered_run_id=value.answered_run_id,
            answered_by=value.answered_by,
            answered_at=datetime.fromtimestamp(value.answered_at, UTC),
            approvals=dict(answers.get("approvals") or {}),
            calls=dict(answers.get("calls") or {}),
            input=answers.get("input"),
        )


class ToolDeclarationView(BaseModel):
    name: str
    kind: Literal["function", "approval", "external"]
    retry_safe: bool
    """Declared safe to run again after a crash (`recovery_retryable`): under `tool_recovery = "declared"` an
    unanswered call of it is replayed, any other gets the unknown-outcome result (or its reconciler's verdict)."""
    reconciler: bool
    description: str | None


class RunToolsView(BaseModel):
    items: list[ToolDeclarationView]
    complete: bool
    """`false` when the agent's factory cannot run in this process: only the run's client tools are listed."""

    @classmethod
    def of(cls, value: RunTools) -> RunToolsView:
        return cls(
            items=[
                ToolDeclarationView(
                    name=t.name,
                    kind=t.kind,
                    retry_safe=t.retry_safe,
                    reconciler=t.reconciler,
                    description=t.description,
                )
                for t in value.tools
            ],
            complete=value.complete,
        )
