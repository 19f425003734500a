"""HTTP conventions of the app factory (§8, §8.1; error codes of §12): S-95, S-96, S-99, S-100, body limit, 503 and 500 envelopes."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from candor.service import commands
from candor.service.agents import AgentRegistry
from candor.service.core import Service
from candor.service.http import create_app
from candor.service.http.readiness import Role
from candor.service.settings import ServiceSettings
from candor.service.store.db.engine import create_engine

from http_support import REQUEST_ID, TEXT, app_for, client_for, create_thread, error_of


async def test_every_response_has_a_server_generated_request_id(api: Any) -> None:
    """S-95, §4.1: success and error responses carry `X-Request-Id: req_<32 hex>`; a caller's value is ignored; error
    bodies repeat it as `request_id`."""
    key = await api.key()
    spoofed = {"X-Request-Id": "req_" + "0" * 32}
    responses = [
        await create_thread(api.client, key),
        await api.client.get("/healthz", headers=spoofed),
        await api.client.get("/v1/threads/thr_" + "1" * 32, headers=key.headers() | spoofed),
        await api.client.get("/v1/threads/x", headers=spoofed),
    ]
    ids = [response.headers["x-request-id"] for response in responses]
    assert all(REQUEST_ID.match(value) for value in ids) and len(set(ids)) == len(ids)
    assert spoofed["X-Request-Id"] not in ids
    assert [len(r.headers.get_list("x-request-id")) for r in responses] == [1, 1, 1, 1]
    assert error_of(responses[2])["code"] == "not_found"
    assert error_of(responses[3])["code"] == "unauthenticated"


async def test_validation_errors_are_400_with_fields_never_422(api: Any) -> None:
    """S-96: the error envelope; validation → 400 `invalid_argument` with `details.fields`, never 422; unknown body
    fields → 400; submitted values are not echoed."""
    key = await api.key()
    secret_value = "s3cr3t-value-never-echoed"
    cases = {
        "unknown_field": ({"agent": "demo", "input": TEXT, "surprise": secret_value}, [("surprise", "unknown_field")]),
        "missing": ({"input": TEXT}, [("agent", "required")]),
        "wrong_type": (
            {"agent": "demo", "input": {"content": [{"type": "image", "text": secret_value}]}},
            [("input.content.0.type", "literal_error")],
        ),
        "empty_content": ({"agent": "demo", "input": {"content": []}}, [("input.content", "too_short")]),
        "not_an_object": ([1, 2], [("body", "unparsable")]),
    }
    for name, (body, fields) in cases.items():
        response = await api.client.post("/v1/threads", json=body, headers=key.headers(name))
        assert response.status_code == 400, name
        error = error_of(response)
        assert error["code"] == "invalid_argument"
        assert [(f["field"], f["reason"]) for f in error["details"]["fields"]] == fields, name
        assert secret_value not in response.text
    # A command-level rule (an agent that is not configured) has the same shape.
    error = error_of(await create_thread(api.client, key, agent="nobody", idempotency_key="nobody"))
    assert error["details"]["fields"] == [{"field": "agent", "reason": "not_configured"}]


async def test_unparsable_body(api: Any) -> None:
    """S-96, §8.1: a JSON body that does not parse → 400 with field `body`, reason `unparsable`; a body of
    another media type → 415 `unsupported_media_type` (issue 14 refines S-96 here)."""
    key = await api.key()
    headers = key.headers("k") | {"Content-Type": "application/json"}
    response = await api.client.post("/v1/threads", content=b'{"agent": ', headers=headers)
    assert response.status_code == 400
    assert error_of(response)["details"] == {"fields": [{"field": "body", "reason": "unparsable"}]}
    for content_type in ("application/x-www-form-urlencoded", "text/plain"):
        headers = key.headers("k") | {"Content-Type": content_type}
        response = await api.client.post("/v1/threads", content=b"agent=demo", headers=headers)
        assert response.status_code == 415
        assert error_of(response)["code"] == "unsupported_media_type"


async def test_validation_lists_at_most_20_fields(api: Any) -> None:
    """§8.1: `details.fields` holds at most 20 problems."""
    key = await api.key()
    body = {"agent": "demo", "input": TEXT} | {f"extra_{i}": i for i in range(30)}
    error = error_of(await api.client.post("/v1/threads", json=body, headers=key.headers("k")))
    assert len(error["details"]["fields"]) == 20


async def test_unknown_routes_and_methods_are_404(api: Any) -> None:
    """S-99: an unknown route or method → 404 `not_found` with `details = {"kind": "route", "id": "<METHOD> <path>"}`;
    no trailing-slash redirects."""
    cases = [("GET", "/v1/nothing"), ("DELETE", "/v1/threads"), ("PUT", "/healthz"), ("GET", "/v1/threads/")]
    for method, path in cases:
        response = await api.client.request(method, path)
        assert response.status_code == 404, (method, path)
        assert error_of(response)["details"] == {"kind": "route", "id": f"{method} {path}"}


@pytest.mark.parametrize("role", ["worker", "control", "all"])
async def test_roles(db: Any, role: Role) -> None:
    """S-100: a worker serves only /healthz, /readyz and /metrics; every /v1 path (the schema included) is 404 there."""
    async with client_for(app_for(db, role=role)) as client:
        assert (await client.get("/healthz")).json() == {"status": "ok", "role": role}
        assert (await client.get("/metrics")).status_code == 200
        for path in ("/v1/threads/thr_" + "0" * 32, "/v1/openapi.json", "/v1/docs"):
            response = await client.get(path)
            if role == "worker":
                assert response.status_code == 404
                assert error_of(response)["details"] == {"kind": "route", "id": f"GET {path}"}
            else:
                assert response.status_code in (200, 401), path
        posted = await client.post("/v1/threads", json={"agent": "demo", "input": TEXT})
        assert posted.status_code == (404 if role == "worker" else 401)


async def test_body_over_the_limit_is_413(db: Any) -> None:
    """§8.1: a body larger than `server.max_request_bytes` → 413 `payload_too_large`, declared or streamed."""
    app = app_for(db, server={"max_request_bytes": 1024})
    async with client_for(app) as client:
        big = {"agent": "demo", "input": {"content": [{"type": "text", "text": "x" * 2000}]}}
        response = await client.post("/v1/threads", json=big)
        assert response.status_code == 413 and error_of(response)["code"] == "payload_too_large"

        async def chunks() -> Any:
            for _ in range(4):
                yield b"x" * 400

        streamed = await client.post("/v1/threads", content=chunks(), headers={"Content-Type": "application/json"})
        assert streamed.status_code == 413 and error_of(streamed)["code"] == "payload_too_large"
        small = await client.post("/v1/threads", json={"agent": "demo", "input": TEXT})
        assert small.status_code == 401  # under the limit the request goes on to authentication


async def test_database_unavailable_is_503() -> None:
    """§8.1: database connectivity errors → 503 `unavailable` with `details.dependency = "database"`."""
    url = "postgresql://postgres@127.0.0.1:1/none"  # nothing listens on port 1: the connection is refused
    settings = ServiceSettings(database={"url": url, "timeout": 1})
    service = Service(settings=settings, engine=create_engine(url, timeout=1), agents=AgentRegistry({}))
    try:
        async with client_for(create_app(service, role="all")) as client:
            response = await client.get("/v1/threads/thr_" + "0" * 32, headers={"Authorization": "Bearer cnd_x"})
    finally:
        await service.close()
    assert response.status_code == 503
    assert error_of(response) | {"request_id": None} == {
        "code": "unavailable",
        "message": "a dependency is unavailable",
        "details": {"dependency": "database"},
        "request_id": None,
    }


async def test_unexpected_errors_are_500_internal(api: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """§12.1: an unexpected exception → 500 `internal`, with the request id and without the exception's text."""
    key = await api.key()

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("database password is hunter2")

    monkeypatch.setattr(commands, "get_thread", broken)
    response = await api.client.get("/v1/threads/thr_" + "0" * 32, headers=key.headers())
    assert response.status_code == 500
    assert error_of(response)["code"] == "internal" and "hunter2" not in response.text


async def test_openapi_and_docs(api: Any) -> None:
    """§8.1: the schema at /v1/openapi.json and docs at /v1/docs; validation is documented as 400, never 422."""
    schema = (await api.client.get("/v1/openapi.json")).json()
    assert {"/v1/threads", "/v1/runs/{run_id}/resume", "/healthz"} <= set(schema["paths"])
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            described = operation["responses"].get("422", {}).get("description", "")
            assert described.startswith("disabled") or "422" not in operation["responses"], (method, path)
    resume = schema["paths"]["/v1/runs/{run_id}/resume"]["post"]
    assert {"200", "201", "400", "409"} <= set(resume["responses"])
    assert any(p["name"] == "Idempotency-Key" and p["required"] for p in resume["parameters"])
    docs = await api.client.get("/v1/docs")
    assert docs.status_code == 200 and "/v1/openapi.json" in docs.text


async def test_openapi_names_operations_and_every_error(api: Any) -> None:
    """§8.1, S-96: clean, stable operation ids (generated clients name methods after them); 413/415 on every
    operation with a body and 500 on every `/v1` operation; no internal spec references in the text."""
    schema = (await api.client.get("/v1/openapi.json")).json()
    ids = {op["operationId"] for item in schema["paths"].values() for op in item.values()}
    assert {"createThread", "postInput", "resumeRun", "forkRun", "createKey", "updateKey", "readyz"} <= ids
    assert all(re.fullmatch(r"[a-z][A-Za-z]*", operation_id) for operation_id in ids), ids
    for path, item in schema["paths"].items():
        for operation in item.values():
            if path.startswith("/v1/"):
                assert "500" in operation["responses"], path
            if "requestBody" in operation:
                assert {"413", "415"} <= set(operation["responses"]), path
    text = json.dumps(schema)
    assert "§" not in text and not re.search(r"\bS-\d+\b", text)


async def test_docs_page_works_offline(api: Any) -> None:
    """The Swagger UI page loads its script and stylesheet from this service, never from a CDN."""
    page = (await api.client.get("/v1/docs")).text
    assets = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert assets and all(url.startswith("/v1/docs/assets/") for url in assets), assets
    for url in assets:
        response = await api.client.get(url)
        assert response.status_code == 200 and len(response.content) > 100, url
