"""Property-based API conformance (issue 6): schemathesis generates requests from `/v1/openapi.json` and sends them
to the ASGI app (SQLite, authenticated with a bootstrapped admin key). Every answer must be non-5xx, carry a
documented content type, and match the documented response schema (S-96: errors are the §8.1 envelope).

Bounded: at most `MAX_EXAMPLES` generated cases per operation, derandomized, no deadline, so the whole module stays
well under a minute. For a deeper hunt, `CANDOR_SCHEMATHESIS_EXAMPLES=500` raises the bound and draws new random
cases on every run (a failure prints the case to reproduce). The thread stream is shortened (`StreamTiming.max_seconds`) so a generated stream request ends.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.errors import InvalidSchema
from schemathesis.core.result import Err, Ok
from schemathesis.schemas import APIOperation
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance
from sqlalchemy.pool import NullPool

from candor.service.agents import AgentRegistry
from candor.service.core import Service
from candor.service.http import Readiness, create_app
from candor.service.http.stream import StreamTiming
from candor.service.runtime import SystemEntropy
from candor.service.settings import ServiceSettings
from candor.service.store.db.engine import create_engine, write_transaction
from candor.service.store.schema.migration import migrate
from candor.service.store.workspaces import auth as auth

_DEEP_EXAMPLES = os.environ.get("CANDOR_SCHEMATHESIS_EXAMPLES")
MAX_EXAMPLES = int(_DEEP_EXAMPLES) if _DEEP_EXAMPLES else 25
_KEYS = itertools.count()
CHECKS = [not_a_server_error, content_type_conformance, response_schema_conformance]


def _run(coroutine: Any) -> Any:
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


async def _bootstrap(url: str) -> str:
    await migrate(url, lock_timeout=30)
    engine = create_engine(url, timeout=5)
    try:
        async with write_transaction(engine) as conn:
            workspace = await auth.create_workspace(conn, name="schemathesis", entropy=SystemEntropy())
            created = await auth.create_principal(
                conn, workspace_id=workspace.id, permissions=("read", "run", "admin"), entropy=SystemEntropy()
            )
        return created.secret
    finally:
        await engine.dispose()


# The app is built at import (schemathesis reads its OpenAPI document then); the engine connects only when used,
# and `bootstrapped` migrates the database and creates the key before the first generated case.
_DIRECTORY = Path(tempfile.mkdtemp(prefix="candor-schemathesis-"))
URL = f"sqlite:///{_DIRECTORY / 'candor.db'}"
_SETTINGS = ServiceSettings(database={"url": URL}, agents={"demo": {"factory": "worker.support:factory"}})
# Each generated case runs the app on a fresh event loop (starlette's TestClient): no pooled connections.
_ENGINE = create_engine(URL, timeout=5, poolclass=NullPool)
_SERVICE = Service(
    settings=_SETTINGS,
    engine=_ENGINE,
    agents=AgentRegistry({"demo": "worker.support:factory"}),
    entropy=SystemEntropy(),
)
APP = create_app(_SERVICE, role="all", readiness=Readiness(started=True))
APP.state.stream_timing = StreamTiming(poll_seconds=0.02, max_seconds=0.1)
schema = schemathesis.openapi.from_asgi("/v1/openapi.json", APP)


@pytest.fixture(scope="module")
def secret() -> Iterator[str]:
    yield _run(_bootstrap(URL))
    _run(_ENGINE.dispose())
    shutil.rmtree(_DIRECTORY, ignore_errors=True)


def _check(case: Any, secret: str) -> None:
    """Issue 6: zero 5xx responses and no response-schema violations for generated requests."""
    headers = {"Authorization": f"Bearer {secret}"}
    if case.method == "POST" and isinstance(case.body, dict):
        # Let most generated writes reach the commands: a configured agent and a well-formed key (its shape rules
        # are exercised by the other cases and by test_http_app); keys are unique so every write is new.
        if isinstance(case.body.get("agent"), str):
            case.body["agent"] = "demo"
        headers["Idempotency-Key"] = f"schemathesis-{next(_KEYS)}"
    case.call_and_validate(headers=headers, checks=CHECKS)


def _conformance_test(operation_id: str) -> Any:
    """One test function per operation: `schema.parametrize()` over the whole schema gives every operation the same
    test id, which pytest-xdist (`make test`) collapses into one item, silently running a single operation."""

    @schema.include(operation_id=operation_id).parametrize()
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=not _DEEP_EXAMPLES,
    )
    def test(case: Any, secret: str) -> None:
        _check(case, secret)

    test.__name__ = f"test_api_conforms_to_its_openapi_document__{operation_id}"
    return test


def _id_of(result: Ok[APIOperation[Any, Any, Any, Any]] | Err[InvalidSchema]) -> str:
    assert isinstance(result, Ok), result  # the document parses: every operation is usable
    operation_id: str = result.ok().definition.raw["operationId"]
    return operation_id


OPERATION_IDS = sorted(_id_of(result) for result in schema.get_all_operations())
for _operation_id in OPERATION_IDS:
    globals()[f"test_api_conforms_to_its_openapi_document__{_operation_id}"] = _conformance_test(_operation_id)


def test_every_operation_has_its_own_conformance_test() -> None:
    """Every operation of the app's OpenAPI document (read from the app, not through schemathesis) has its own
    uniquely named conformance test (31 operations when this was written)."""
    document = APP.openapi()["paths"]
    documented = sorted(op["operationId"] for item in document.values() for op in item.values() if "operationId" in op)
    assert documented == OPERATION_IDS and len(set(documented)) == len(documented) >= 30
