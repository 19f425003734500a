"""The run's usage as it is kept in a state: the "candor.usage" capability namespace (H-33)."""

from __future__ import annotations

from pydantic import TypeAdapter, ValidationError
from pydantic_ai.usage import RunUsage

from .capability_store import CapabilityStore
from .errors import StateError
from .state import HarnessState

__all__ = ("USAGE_CAPABILITY_ID", "record_usage", "stored_usage")

USAGE_CAPABILITY_ID = "candor.usage"
_usage_adapter: TypeAdapter[RunUsage] = TypeAdapter(RunUsage)


def record_usage(store: CapabilityStore, usage: RunUsage) -> None:
    """Write `usage` into the store's "candor.usage" namespace (version "1")."""
    store._put(USAGE_CAPABILITY_ID, "1", _usage_adapter.dump_python(usage, mode="json"))


def stored_usage(state: HarnessState) -> RunUsage:
    """H-33: the usage a state recorded, to resume counting from; `usage_state_missing` if it holds none."""
    stored = state._capabilities_ref().get(USAGE_CAPABILITY_ID)
    if stored is None:
        raise StateError("the state holds no usage to resume from", code="usage_state_missing")
    try:
        return _usage_adapter.validate_python(stored.data)
    except ValidationError as exc:
        raise StateError("the stored usage is unreadable", code="usage_state_missing") from exc
