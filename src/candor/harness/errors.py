"""The HarnessError family: every error the harness raises on purpose, each with a stable code.

    HarnessError                 base; .code, .details, .retry_hint
    ├── RunError                 misuse of a run, a resume batch that does not fit, a failed result re-raised
    ├── StateError               capability store, export_state(), usage state
    ├── DefinitionError          the current tool surface no longer fits a pending item
    └── RunCleanupError          teardown failed; .outcome is the closest validated candidate

Codes never change; messages may be improved. Details never echo secrets or submitted values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .results import RunResult

RetryHint = Literal["none", "new_run", "dependency_change"]

__all__ = ("HarnessError", "RunError", "StateError", "DefinitionError", "RunCleanupError", "RetryHint")


class HarnessError(Exception):
    """Base class of every deliberate harness error."""

    code: str
    details: dict[str, Any]
    retry_hint: RetryHint

    def __init__(
        self,
        message: str,
        *,
        code: str,
        details: dict[str, Any] | None = None,
        retry_hint: RetryHint = "none",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = dict(details or {})
        self.retry_hint = retry_hint

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class RunError(HarnessError):
    """A run cannot start or continue as asked."""


class StateError(HarnessError):
    """State is unavailable or does not fit what was asked of it."""


class DefinitionError(HarnessError):
    """The current tool surface does not fit the pending items."""


class RunCleanupError(HarnessError):
    """Teardown of a run failed; `outcome` is a candidate, not a decision (H-101, H-102)."""

    outcome: RunResult[Any] | None
    causes: tuple[BaseException, ...]

    def __init__(self, message: str, *, outcome: RunResult[Any] | None, causes: tuple[BaseException, ...]) -> None:
        super().__init__(message, code="run_cleanup_failed", details={"cause_count": len(causes)}, retry_hint="new_run")
        self.outcome = outcome
        self.causes = tuple(causes)
