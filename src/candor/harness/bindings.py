"""RunBindings: what the caller supplies fresh for every run (spec §3.6); never part of a state."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pydantic import JsonValue
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.models import Model
from pydantic_ai.toolsets import AbstractToolset

from .errors import RunError

__all__ = ("RunBindings", "EnvironmentProvider", "validate_bindings")


@runtime_checkable
class EnvironmentProvider(Protocol):
    """A run-local provider of portable environment data, bound by mount name (H-22, H-23)."""

    async def restore(self, data: JsonValue | None) -> None: ...

    async def export(self) -> JsonValue: ...


@dataclass(frozen=True, kw_only=True)
class RunBindings:
    """Run-local, non-portable objects: authority is rebuilt for every run, never restored from a state."""

    deferred_tools_supported: bool = True
    """When False the run can never suspend (H-84)."""
    toolsets: Sequence[AbstractToolset[Any]] = ()
    """Extra toolsets for this run, e.g. an `ExternalToolset` of client-side tools."""
    capabilities: Sequence[AbstractCapability[Any]] = ()
    """Extra pydantic-ai capabilities for this run; their hooks act as the run's current policy."""
    environments: Mapping[str, EnvironmentProvider] = field(default_factory=dict)
    """Providers bound by mount name."""
    deps: Any = None
    """Passed to the agent as `deps`."""
    model: Model | None = None
    """The model this run uses instead of the agent's own (`agent.iter(model=...)`); a provider client holding
    an API key is authority too, so it is bound per run and never part of a state."""


def validate_bindings(bindings: object) -> RunBindings:
    """H-97: anything but a well-formed RunBindings is `run_bindings_invalid`."""
    if bindings is None:
        return RunBindings()
    if not isinstance(bindings, RunBindings):
        raise RunError("bindings must be a candor.RunBindings", code="run_bindings_invalid")
    problems: list[str] = []
    if not isinstance(bindings.deferred_tools_supported, bool):
        problems.append("deferred_tools_supported")
    if not all(isinstance(t, AbstractToolset) for t in bindings.toolsets):
        problems.append("toolsets")
    if not all(isinstance(c, AbstractCapability) for c in bindings.capabilities):
        problems.append("capabilities")
    if not isinstance(bindings.environments, Mapping) or not all(
        isinstance(name, str) and name and isinstance(p, EnvironmentProvider)
        for name, p in bindings.environments.items()
    ):
        problems.append("environments")
    if bindings.model is not None and not isinstance(bindings.model, Model):
        problems.append("model")
    if problems:
        raise RunError(
            "invalid run bindings: " + ", ".join(problems), code="run_bindings_invalid", details={"fields": problems}
        )
    return bindings
