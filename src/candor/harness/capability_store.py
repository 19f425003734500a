"""The run-local capability store behind `candor.capability_state()` (spec §3.4, rules H-14 to H-21)."""

from __future__ import annotations

import copy
from contextvars import ContextVar, Token
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .errors import StateError
from .state import CapabilityState, ensure_finite_json

ModelT = TypeVar("ModelT", bound=BaseModel)

__all__ = ("CapabilityStore", "capability_state")

_current_store: ContextVar[CapabilityStore | None] = ContextVar("candor_capability_store", default=None)


def capability_state() -> CapabilityStore:
    """The store of the active run; outside a run raises `StateError(code="run_not_active")` (H-21)."""
    store = _current_store.get()
    if store is None:
        raise StateError("capability_state() is only available inside an active run", code="run_not_active")
    return store


def _check_id_and_version(capability_id: str, version: str) -> None:
    if not isinstance(capability_id, str) or not capability_id.strip():
        raise StateError("capability id must be a non-blank string", code="capability_state_id_invalid")
    if not isinstance(version, str) or not version.strip():
        raise StateError(
            "capability version must be a non-blank string",
            code="capability_state_version_invalid",
            details={"capability_id": capability_id},
        )


class CapabilityStore:
    """Namespaced JSON data owned by capabilities; every write swaps a whole namespace atomically (H-18)."""

    def __init__(self, initial: dict[str, CapabilityState]) -> None:
        # Namespaces are kept as (version, data) with data owned by the store; CapabilityState reads are copies.
        self._namespaces: dict[str, tuple[str, Any]] = {cid: (cs.version, cs.data) for cid, cs in initial.items()}
        self._originals = dict(initial)
        self._written: set[str] = set()

    async def read(self, capability_id: str, state_model: type[ModelT], *, version: str) -> ModelT | None:
        _check_id_and_version(capability_id, version)
        entry = self._namespaces.get(capability_id)
        if entry is None:
            return None  # H-14
        stored_version, data = entry
        if stored_version != version:
            raise StateError(
                f"capability {capability_id!r} is stored with another version",
                code="capability_state_version_unsupported",
                details={"capability_id": capability_id, "expected_version": version, "actual_version": stored_version},
            )
        try:
            return state_model.model_validate(copy.deepcopy(data))
        except ValidationError as exc:
            raise StateError(
                f"stored data of capability {capability_id!r} does not fit {state_model.__name__}",
                code="capability_state_invalid",
                details={"capability_id": capability_id},
            ) from exc

    async def write(self, capability_id: str, instance: BaseModel, *, version: str) -> None:
        _check_id_and_version(capability_id, version)
        try:
            data = ensure_finite_json(instance.model_dump(mode="json"), where="capability data")
        except (ValueError, TypeError) as exc:
            raise StateError(
                f"data of capability {capability_id!r} is not finite JSON",
                code="capability_state_invalid",
                details={"capability_id": capability_id},
            ) from exc
        self._namespaces[capability_id] = (version, data)
        self._written.add(capability_id)

    async def snapshot(self) -> dict[str, CapabilityState]:
        """A detached copy of every namespace (H-19)."""
        return self.snapshot_now()

    def snapshot_now(self) -> dict[str, CapabilityState]:
        result: dict[str, CapabilityState] = {}
        for cid, (version, data) in self._namespaces.items():
            original = self._originals.get(cid)
            if cid not in self._written and original is not None:
                result[cid] = original  # H-20: untouched namespaces are carried as they were
            else:
                result[cid] = CapabilityState(version=version, data=copy.deepcopy(data))
        return result

    # Internal: candor's own namespaces ("candor.usage", "candor.steering") are written synchronously.
    def _put(self, capability_id: str, version: str, data: Any) -> None:
        self._namespaces[capability_id] = (version, data)
        self._written.add(capability_id)

    def _remove(self, capability_id: str) -> None:
        if self._namespaces.pop(capability_id, None) is not None:
            self._written.add(capability_id)

    def _raw(self, capability_id: str) -> tuple[str, Any] | None:
        return self._namespaces.get(capability_id)

    def _freeze(self) -> CapabilityStore:
        """A cheap point-in-time copy: namespaces are replaced on write, never changed in place."""
        frozen = CapabilityStore.__new__(CapabilityStore)
        frozen._namespaces = dict(self._namespaces)
        frozen._originals = self._originals
        frozen._written = set(self._written)
        return frozen

    def _activate(self) -> Token[CapabilityStore | None]:
        return _current_store.set(self)
