"""The canonical history of a run and the recipe of its latest safe boundary's state (H-39, H-98).

Messages enter the canonical history when a boundary exports them and are never changed afterwards, which is
what makes consecutive checkpoints append-only (H-39). A boundary's state is kept as a recipe and built only
when someone asks for it (`RunStream.export_state`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse
from pydantic_ai.usage import RunUsage

from ._detach import detached, detached_all
from ._usage_state import record_usage
from .capability_store import CapabilityStore
from .state import HarnessState, _trusted_state

__all__ = ("CanonicalHistory", "SnapshotRecipe")


class CanonicalHistory:
    """The restored history followed by what this run's boundaries exported (append-only)."""

    def __init__(self, restored: Sequence[ModelMessage]) -> None:
        self.messages: list[ModelMessage] = list(restored)
        """Every message so far; only appended to (H-39)."""
        self.base_len = len(self.messages)
        """How many messages the run started from; the run's new messages begin here."""
        self.provider_suspended_start = False
        """H-59: the run continues a response the provider suspended; pydantic-ai stitches the rest into it."""

    def append_new(self, messages: Sequence[ModelMessage]) -> None:
        """Extend the history with the messages beyond what it already holds of the run's new part."""
        new_len = len(self.messages) - self.base_len
        for message in list(messages)[new_len:]:
            self.messages.append(detached(message))  # pydantic-ai and tools keep the originals (H-6, H-11)

    def sync(self, run: Any, pending_request: ModelRequest | None = None) -> None:
        """Take in what pydantic-ai's run added since the last boundary, and the request about to be sent."""
        # pydantic-ai's new_messages() starts after the history it was given (a re-sent trailing request
        # included), so it lines up with the canonical history's new part.
        target = list(run.new_messages())
        if self.provider_suspended_start:
            self._adopt_continued_response(run, len(target))
        if pending_request is not None:
            target.append(pending_request)
        self.append_new(target)

    def with_run_tail(self, run: Any | None) -> list[ModelMessage]:
        """The history plus (detached) what the run produced after the last boundary: a candidate's raw material."""
        messages = list(self.messages)
        if run is not None:
            produced = list(run.new_messages())
            messages.extend(detached_all(produced[len(self.messages) - self.base_len :]))
        return messages

    def _adopt_continued_response(self, run: Any, new_count: int) -> None:
        """H-59: pydantic-ai stitches a provider-suspended response's continuation into that same response."""
        everything = run.all_messages()
        index = len(everything) - new_count - 1
        if index >= 0 and self.base_len and isinstance(everything[index], ModelResponse):
            continued = everything[index]
            if continued != self.messages[self.base_len - 1]:
                self.messages[self.base_len - 1] = detached(continued)


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotRecipe:
    """What the state of the latest safe boundary is made of; the state is built only when asked (export_state)."""

    history: tuple[ModelMessage, ...]
    """The canonical history at the boundary."""
    namespaces: CapabilityStore
    """A frozen copy of the capability namespaces (steer() still records pending input into it, H-104)."""
    environment: dict[str, Any]
    """A detached copy of the environment entries."""
    usage: RunUsage | None
    """The usage to record in "candor.usage"; None at run start, where the previous state stands as it was (H-98)."""

    def carry(self, capability_id: str, entry: tuple[str, Any] | None) -> None:
        """Put a namespace entry (version, data) into the boundary's namespaces; None leaves them as they are."""
        if entry is not None:
            self.namespaces._put(capability_id, *entry)

    def build(self, thread_id: str) -> HarnessState:
        """The boundary's state."""
        if self.usage is not None:
            record_usage(self.namespaces, self.usage)
        return _trusted_state(
            thread_id=thread_id,
            message_history=self.history,
            capabilities=self.namespaces.snapshot_now(),
            environment=self.environment,
        )
