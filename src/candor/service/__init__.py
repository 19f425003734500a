"""candor.service: the host that runs candor agents durably behind an HTTP API (spec service.md).

The public face of the service for embedding it (the CLI, the HTTP layer, tests and the demo use the same names):

* `Service` – the process-wide resources (settings, engine, agents, clock, entropy, key ring); open with
  `await Service.open(settings)`, drive it with `candor.service.commands`, close with `await service.close()`;
* `ServiceSettings` and its sections – configuration, validated on construction (§3);
* the `ServiceError` family – every error the service raises on purpose, each with a stable `code` (§12);
* `Clock`/`Entropy` and their real implementations – the injected sources of time and randomness;
* `AgentRegistry` – the agent name → factory table;
* `lease_held()` – asked from inside a tool: whether its attempt still holds the run's lease.

Names load on first use (PEP 562), so `import candor.service` stays cheap and free of import cycles; everything
not listed here is internal and may change.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .agents import AgentRegistry
    from .core import Service
    from .errors import (
        AlreadyBootstrapped,
        AlreadyExists,
        CheckpointCorrupt,
        Conflict,
        Disabled,
        FieldProblem,
        Forbidden,
        InvalidArgument,
        NotFound,
        NotSubmitter,
        PreconditionFailed,
        RateLimited,
        SchemaMismatch,
        ServiceError,
        SettingsError,
        StoreUnavailable,
    )
    from .runtime import Clock, Entropy, SystemClock, SystemEntropy
    from .settings import (
        AgentSettings,
        ControlSettings,
        DatabaseSettings,
        OutboxKindPolicy,
        OutboxSettings,
        SecuritySettings,
        ServerSettings,
        ServiceSettings,
        WorkerSettings,
    )
    from .worker.lease_check import lease_held

_HOMES: dict[str, str] = {
    # the service
    "Service": "core",
    "AgentRegistry": "agents",
    "lease_held": "worker.lease_check",
    # settings (§3)
    "ServiceSettings": "settings",
    "ServerSettings": "settings",
    "DatabaseSettings": "settings",
    "WorkerSettings": "settings",
    "ControlSettings": "settings",
    "OutboxSettings": "settings",
    "OutboxKindPolicy": "settings",
    "SecuritySettings": "settings",
    "AgentSettings": "settings",
    # errors (§12)
    "ServiceError": "errors",
    "SettingsError": "errors",
    "StoreUnavailable": "errors",
    "CheckpointCorrupt": "errors",
    "SchemaMismatch": "errors",
    "FieldProblem": "errors",
    "InvalidArgument": "errors",
    "Forbidden": "errors",
    "NotSubmitter": "errors",
    "NotFound": "errors",
    "AlreadyExists": "errors",
    "Conflict": "errors",
    "PreconditionFailed": "errors",
    "Disabled": "errors",
    "RateLimited": "errors",
    "AlreadyBootstrapped": "errors",
    # injected time and randomness
    "Clock": "runtime",
    "SystemClock": "runtime",
    "Entropy": "runtime",
    "SystemEntropy": "runtime",
}

__all__ = (
    "Service",
    "AgentRegistry",
    "lease_held",
    "ServiceSettings",
    "ServerSettings",
    "DatabaseSettings",
    "WorkerSettings",
    "ControlSettings",
    "OutboxSettings",
    "OutboxKindPolicy",
    "SecuritySettings",
    "AgentSettings",
    "ServiceError",
    "SettingsError",
    "StoreUnavailable",
    "CheckpointCorrupt",
    "SchemaMismatch",
    "FieldProblem",
    "InvalidArgument",
    "Forbidden",
    "NotSubmitter",
    "NotFound",
    "AlreadyExists",
    "Conflict",
    "PreconditionFailed",
    "Disabled",
    "RateLimited",
    "AlreadyBootstrapped",
    "Clock",
    "SystemClock",
    "Entropy",
    "SystemEntropy",
)
assert set(__all__) == set(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
