"""`candor.service`, the public face of the service (STYLE habit 8, issue 16): `Service`, settings and errors.

Like httpx's exported-members test: the list is fixed here, so adding or dropping a public name is a deliberate
change of this file.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import candor.service

EXPECTED = {
    "Service": "candor.service.core",
    "AgentRegistry": "candor.service.agents",
    "lease_held": "candor.service.worker.lease_check",  # issue 34 item 3: asked from inside a tool
    "ServiceSettings": "candor.service.settings",
    "ServerSettings": "candor.service.settings",
    "DatabaseSettings": "candor.service.settings",
    "WorkerSettings": "candor.service.settings",
    "ControlSettings": "candor.service.settings",
    "OutboxSettings": "candor.service.settings",
    "OutboxKindPolicy": "candor.service.settings",
    "SecuritySettings": "candor.service.settings",
    "AgentSettings": "candor.service.settings",
    "ServiceError": "candor.service.errors",
    "SettingsError": "candor.service.errors",
    "StoreUnavailable": "candor.service.errors",
    "CheckpointCorrupt": "candor.service.errors",
    "SchemaMismatch": "candor.service.errors",
    "FieldProblem": "candor.service.errors",
    "InvalidArgument": "candor.service.errors",
    "Forbidden": "candor.service.errors",
    "NotSubmitter": "candor.service.errors",
    "NotFound": "candor.service.errors",
    "AlreadyExists": "candor.service.errors",
    "Conflict": "candor.service.errors",
    "PreconditionFailed": "candor.service.errors",
    "Disabled": "candor.service.errors",
    "RateLimited": "candor.service.errors",
    "AlreadyBootstrapped": "candor.service.errors",
    "Clock": "candor.service.runtime",
    "SystemClock": "candor.service.runtime",
    "Entropy": "candor.service.runtime",
    "SystemEntropy": "candor.service.runtime",
}


def test_exported_members() -> None:
    """`__all__` is exactly the agreed list, without duplicates, and each name is the object of its home module."""
    assert len(candor.service.__all__) == len(set(candor.service.__all__))
    assert set(candor.service.__all__) == set(EXPECTED)
    for name, home in EXPECTED.items():
        assert getattr(candor.service, name) is getattr(importlib.import_module(home), name), name


def test_internal_names_stay_out() -> None:
    """Internal errors (`LeaseLost`, `RaceLost`) are not part of the face; unknown names raise AttributeError."""
    for name in ("LeaseLost", "RaceLost", "KeyRing"):
        assert name not in candor.service.__all__
        try:
            getattr(candor.service, name)
        except AttributeError:
            continue
        raise AssertionError(f"candor.service.{name} should not resolve")


def test_star_import_and_errors_are_service_errors() -> None:
    """`from candor.service import *` gives every listed name; every listed error is a `ServiceError`."""
    namespace: dict[str, object] = {}
    exec("from candor.service import *", namespace)
    assert set(EXPECTED) <= set(namespace)
    for name, home in EXPECTED.items():
        value = namespace[name]
        if home.endswith(".errors") and isinstance(value, type) and name != "FieldProblem":
            assert issubclass(value, candor.service.ServiceError), name


def test_importing_the_face_is_lazy() -> None:
    """`import candor.service` loads no engine, HTTP or harness code until a name is used."""
    code = "import json, sys, candor.service; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    assert not [m for m in loaded if m.startswith(("sqlalchemy", "fastapi", "candor.service."))]
