"""Steering input of a run (H-104): queued by `steer()`, recorded in "candor.steering" until a request takes it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai import ModelRequestNode
from pydantic_ai.messages import UserContent, UserPromptPart

from . import _agent_glue as glue
from .capability_store import CapabilityStore

__all__ = ("STEERING_CAPABILITY_ID", "InputValue", "SteeringQueue")

STEERING_CAPABILITY_ID = "candor.steering"
InputValue = str | Sequence[UserContent] | None


class SteeringQueue:
    """The input waiting for the next model request, and the keys of what the last requests took."""

    def __init__(self, store: CapabilityStore) -> None:
        self._store = store
        """The run's capability store; the queue is mirrored into its "candor.steering" namespace."""
        self._queue: list[tuple[str | None, InputValue]] = []
        self._touched = False
        """Whether this run queued input; until then a restored namespace is left exactly as it was (H-85)."""
        self._restored = _restored_steering(store)
        """H-85: pending input restored from the state stays recorded until a host delivers it again."""
        self._incorporated: list[str] = []
        """Keys of input taken into a request since the last boundary."""

    def push(self, key: str | None, content: InputValue) -> None:
        """H-104: queue input from `steer()` and record it, so a state exported before it is taken carries it."""
        self._queue.append((key, content))
        self._record()

    def push_run_input(self, content: InputValue) -> None:
        """H-59: the run's own input waits behind a provider-suspended response; it is not recorded as steering."""
        self._queue.append((None, content))

    def recorded(self) -> tuple[str, Any] | None:
        """The "candor.steering" namespace as it stands (version, data), or None."""
        return self._store._raw(STEERING_CAPABILITY_ID)

    def incorporate(self, node: ModelRequestNode[Any, Any]) -> ModelRequestNode[Any, Any]:
        """Append the queued input to the node's request as user prompts (H-104); the node itself if none."""
        if not self._queue:
            return node
        parts = list(node.request.parts)
        for key, content in self._queue:
            parts.append(UserPromptPart(content))  # type: ignore[arg-type]
            if key is not None:
                self._incorporated.append(key)
        self._queue = []
        self._record()
        request = dataclasses.replace(node.request, parts=parts)
        replaced: ModelRequestNode[Any, Any] = glue.replace_request(node, request)
        return replaced

    def take_incorporated(self) -> tuple[str, ...]:
        """The keys incorporated since the last call, for the next boundary event."""
        keys, self._incorporated = tuple(self._incorporated), []
        return keys

    def _record(self) -> None:
        """H-104: queued input lives in "candor.steering" until it is incorporated."""
        entries = self._restored + [{"key": key, "content": _jsonable_input(content)} for key, content in self._queue]
        if self._queue:
            self._touched = True
        if entries and self._touched:
            self._store._put(STEERING_CAPABILITY_ID, "1", {"pending": entries})
        elif self._touched:
            # H-85: a namespace restored from the state is kept exactly unless this run steered.
            self._store._remove(STEERING_CAPABILITY_ID)


def _jsonable_input(content: InputValue) -> Any:
    if content is None or isinstance(content, str):
        return content
    try:
        return TypeAdapter(list[UserContent]).dump_python(list(content), mode="json")
    except Exception:  # noqa: BLE001
        return str(content)


def _restored_steering(store: CapabilityStore) -> list[Any]:
    stored = store._raw(STEERING_CAPABILITY_ID)
    if stored is None or not isinstance(stored[1], dict):
        return []
    pending = stored[1].get("pending")
    return list(pending) if isinstance(pending, list) else []
