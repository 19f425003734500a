"""HarnessState: the immutable, portable checkpoint of one thread (spec §3.3, rules H-1 to H-13).

A state restores data, not authority: it holds messages, namespaced capability data and portable environment
data, and nothing else (no models, tools, credentials, policies or approvals). Every read of a mutable field
returns a detached copy, so no reference a caller holds can change a state.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator
from pydantic_ai.messages import ModelMessage

from ._detach import detached
from .ids import is_valid_thread_id, new_thread_id

__all__ = ("HarnessState", "CapabilityState", "ensure_finite_json")

# Fields whose reads hand out deep copies (H-6, H-19).
_DETACHED_FIELDS = frozenset({"message_history", "capabilities", "environment", "data"})


_JsonT = TypeVar("_JsonT")


def ensure_finite_json(value: _JsonT, *, where: str = "value") -> _JsonT:
    """Reject NaN and ±Infinity anywhere inside a JSON value (H-12); returns the value unchanged."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{where} must be finite JSON: NaN and Infinity are not allowed")
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return value


class _Detached(BaseModel):
    """Base for frozen models whose container fields are copied on every read."""

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if name in _DETACHED_FIELDS:
            return detached(value)
        return value


class CapabilityState(_Detached):
    """One capability namespace: an opaque version tag and its JSON data."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    version: str = Field(min_length=1)
    """Version of the data's shape, chosen by the capability that owns the namespace."""
    data: JsonValue
    """Finite JSON; detached on read."""

    @field_validator("data", mode="after")
    @classmethod
    def _finite(cls, value: JsonValue) -> JsonValue:
        return ensure_finite_json(value, where="capability data")


class HarnessState(_Detached):
    """The only portable checkpoint value of a thread."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    schema_version: Literal["1"]
    """Format of this value; required when validating, never defaulted on import (H-3)."""
    thread_id: str
    """Identity of the thread; `^[a-z][a-z0-9]*_[a-z0-9]+$`, at most 256 characters (H-2)."""
    message_history: tuple[ModelMessage, ...] = ()
    """pydantic-ai messages; every read returns a fresh, detached tuple (H-6)."""
    capabilities: dict[str, CapabilityState] = Field(default_factory=dict)
    """Capability id → namespace; detached on read (H-19)."""
    environment: dict[str, JsonValue] = Field(default_factory=dict)
    """Mount name → provider-defined portable JSON; detached on read."""

    @field_validator("thread_id", mode="after")
    @classmethod
    def _valid_thread_id(cls, value: str) -> str:
        if not is_valid_thread_id(value):
            raise ValueError("thread_id must match ^[a-z][a-z0-9]*_[a-z0-9]+$ and have at most 256 characters")
        return value

    @field_validator("message_history", mode="after")
    @classmethod
    def _detach_history(cls, value: tuple[ModelMessage, ...]) -> tuple[ModelMessage, ...]:
        # The caller may keep references to the messages it passed in (H-6).
        return detached(value)

    @field_validator("environment", mode="after")
    @classmethod
    def _finite_environment(cls, value: dict[str, JsonValue]) -> dict[str, JsonValue]:
        return ensure_finite_json(copy.deepcopy(value), where="environment data")

    @classmethod
    def new(cls, thread_id: str | None = None) -> HarnessState:
        """An empty state; generates a `thr_` id when none is given (H-1)."""
        return cls(schema_version="1", thread_id=thread_id if thread_id is not None else new_thread_id())

    def fork(self, thread_id: str | None = None) -> HarnessState:
        """Same history and capabilities under another thread id; environment cleared (H-7, H-8)."""
        if thread_id is not None and thread_id == self.thread_id:
            raise ValueError("fork() needs a thread id different from the source state's")
        return HarnessState(
            schema_version="1",
            thread_id=thread_id if thread_id is not None else new_thread_id(),
            message_history=self._history_ref(),
            capabilities=self._capabilities_ref(),
            environment={},
        )

    # Copy-free reads for hosts that only read (the service encodes checkpoints from them). The fields copy on every
    # read (H-6, H-19); these hand out the stored objects themselves, so the caller must not mutate what it gets.
    def history_view(self) -> tuple[ModelMessage, ...]:
        """The stored message history without a copy. Read-only: mutating a message would change this state."""
        return cast("tuple[ModelMessage, ...]", self.__dict__["message_history"])

    def capabilities_view(self) -> Mapping[str, CapabilityState]:
        """The stored capability namespaces without a copy. Read-only: never mutate the mapping or its values."""
        return cast("dict[str, CapabilityState]", self.__dict__["capabilities"])

    def environment_view(self) -> Mapping[str, JsonValue]:
        """The stored environment entries without a copy. Read-only: never mutate the mapping or its values."""
        return cast("dict[str, JsonValue]", self.__dict__["environment"])

    # The same reads for the harness's own hot paths (which also need the mutable types).
    def _history_ref(self) -> tuple[ModelMessage, ...]:
        return cast("tuple[ModelMessage, ...]", self.__dict__["message_history"])

    def _capabilities_ref(self) -> dict[str, CapabilityState]:
        return cast("dict[str, CapabilityState]", self.__dict__["capabilities"])

    def _environment_ref(self) -> dict[str, JsonValue]:
        return cast("dict[str, JsonValue]", self.__dict__["environment"])


def _trusted_state(
    *,
    thread_id: str,
    message_history: tuple[ModelMessage, ...],
    capabilities: dict[str, CapabilityState],
    environment: dict[str, JsonValue],
) -> HarnessState:
    """Build a state from values the harness already owns and validated (no copies on the hot path).

    The messages must be objects no one else holds a reference to: the stream's canonical history.
    """
    ensure_finite_json(environment, where="environment data")
    return HarnessState.model_construct(
        schema_version="1",
        thread_id=thread_id,
        message_history=message_history,
        capabilities=capabilities,
        environment=environment,
    )
