"""`/console` (issue 13 item 3): the static assets ship in the package and are served with a strict
Content-Security-Policy, by API roles only; `approve` may carry edited arguments (an issue-13 addition to §8.6,
which the spec leaves out: the issue wins), mapped to pydantic-ai's `ToolApproved(override_args=...)`."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from pydantic_ai import ToolApproved

from candor.service.protocol.resume import ResumeAnswers

from http_support import app_for, client_for, error_of


async def test_console_page_and_assets(api: Any) -> None:
    page = await api.client.get("/console")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert '<script src="/console/console.js"' in page.text
    script = await api.client.get("/console/console.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert "Idempotency-Key" in script.text and "innerHTML" not in script.text
    style = await api.client.get("/console/console.css")
    assert style.headers["content-type"].startswith("text/css")
    for asset in (page.text, script.text, style.text):  # nothing is loaded from another origin (no CDN)
        assert "http://" not in asset and "https://" not in asset and "//cdn" not in asset
    unknown = await api.client.get("/console/secrets.txt")
    assert unknown.status_code == 404 and error_of(unknown)["details"] == {
        "kind": "route",
        "id": "GET /console/secrets.txt",
    }


async def test_inspector_deep_links_serve_the_console_page(api: Any) -> None:
    """Issue 35 item 1: `/console/threads`, `/console/threads/{id}` and `/console/runs/{id}` answer the console page
    itself (no key: it holds no data), so a deep link survives a reload; the inspector's scripts ship like the
    others and insert no markup from data."""
    page = (await api.client.get("/console")).text
    assert '<script src="/console/inspector.js"' in page
    for path in ("/console/threads", "/console/threads/thr_x", "/console/runs/run_x", "/console/runs/run_%3Cb%3E"):
        deep = await api.client.get(path)
        assert deep.status_code == 200 and deep.text == page, path
        assert "default-src 'self'" in deep.headers["content-security-policy"]
    assert '<script src="/console/run_page.js"' in page
    for name in ("inspector.js", "run_page.js"):
        script = await api.client.get(f"/console/{name}")
        assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
        assert "innerHTML" not in script.text and "insertAdjacentHTML" not in script.text
        assert "http://" not in script.text and "https://" not in script.text
    for missing in ("/console/runs", "/console/runs/a/b", "/console/threads/a/b"):
        assert (await api.client.get(missing)).status_code == 404, missing


async def test_a_worker_process_serves_no_console(db: Any) -> None:
    async with client_for(app_for(db, role="worker")) as client:
        assert (await client.get("/console")).status_code == 404


def test_approve_with_edited_arguments_maps_to_override_args() -> None:
    answers = ResumeAnswers.model_validate(
        {
            "approvals": {
                "a": {"action": "approve", "arguments": {"amount": 40}},
                "b": {"action": "approve", "arguments": None},
                "c": {"action": "approve"},
            },
            "calls": {},
        }
    )
    results = answers.to_results()
    assert results.approvals["a"] == ToolApproved(override_args={"amount": 40})
    assert results.approvals["b"] == ToolApproved() and results.approvals["c"] == ToolApproved()
    with pytest.raises(ValidationError, match="arguments"):
        ResumeAnswers.model_validate({"approvals": {"a": {"action": "approve", "arguments": [1]}}, "calls": {}})


async def test_resume_refuses_arguments_that_are_not_an_object(api: Any) -> None:
    key = await api.key()
    body = {"agent": "demo", "input": {"content": [{"type": "text", "text": "x"}]}}
    created = (await api.client.post("/v1/threads", json=body, headers=key.headers("k"))).json()
    answer = {"approvals": {"a1": {"action": "approve", "arguments": "rm -rf"}}, "calls": {}}
    refused = await api.client.post(f"/v1/runs/{created['run']['id']}/resume", json=answer, headers=key.headers("r"))
    assert refused.status_code == 400
    assert error_of(refused)["details"]["fields"][0]["field"].startswith("approvals.a1")


async def test_head_console_and_favicon(api: Any) -> None:
    """Issue 35 item 3: `HEAD /console` answers like GET without a body; `/favicon.ico` is 204, not a 404."""
    get = await api.client.get("/console")
    head = await api.client.head("/console")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    assert head.headers["content-security-policy"] == get.headers["content-security-policy"]
    assert (await api.client.head("/console/console.js")).status_code == 200
    for method in ("GET", "HEAD"):
        icon = await api.client.request(method, "/favicon.ico")
        assert icon.status_code == 204 and icon.content == b""


async def test_sign_in_form_says_how_to_get_a_key(api: Any) -> None:
    """Issue 35 item 3: a new user reading the sign-in form learns where a key comes from."""
    page = (await api.client.get("/console")).text
    assert "candor bootstrap" in page and "candor key create" in page
