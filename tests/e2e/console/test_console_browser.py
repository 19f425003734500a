"""The approvals console (`/console`) in a real headless Chromium driven by Playwright, against a real `candor serve`
with the scripted approvals agent: the page lists the waiting run's pending items (tool, arguments, kind, who
asked), a rejected batch shows the error envelope's details and changes nothing, then one strict batch (edited
arguments, a denial with a reason, an answer to the question) creates the successor, which the page follows live to
its completed output; a run that starts waiting later appears by itself and is approved as is, with the
question declined. A screenshot must be non-blank and the pending items' text must be in the DOM (§8.6, §8.7;
issue 13 item 3).

Chromium is Debian's (`/usr/bin/chromium`, installed by `.ci/run`); `playwright install` is never used. Without
Chromium the test is skipped, naming what failed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from candor.client import CandorClient

from chromium_support import CHROMIUM_FLAGS, find_chromium
from png_pixels import colour_spread

pytestmark = [pytest.mark.crash, pytest.mark.slow]  # real processes: a server and a browser


@pytest.fixture
def chromium() -> str:
    """Checked before the server starts, so a missing Chromium skips at once."""
    return find_chromium()


@pytest.fixture
def page(chromium: str, server: Any) -> Iterator[Any]:
    """Started after the server: Playwright's sync API runs its own event loop, which must not be running while
    the async database fixtures set up or tear down."""
    executable = chromium
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_FLAGS)
        try:
            context = browser.new_context(viewport={"width": 1100, "height": 1400})
            page = context.new_page()
            page.set_default_timeout(30_000)
            yield page
        finally:
            browser.close()


def test_console_lists_answers_and_shows_rejections(chromium: str, server: Any, page: Any, tmp_path: Path) -> None:
    with CandorClient(server.base_url, server.secret) as client:
        accepted = client.create_thread("approvals", "Refund order A1 and clean up.")
        assert accepted.run is not None
        run = client.wait_for_run(accepted.run.id, timeout=30)
        assert run.status == "waiting", run.raw

    page.goto(f"{server.base_url}/console")
    assert "candor bootstrap" in page.locator("#key-form").text_content()  # issue 35: how to get a key
    page.fill("#key", server.secret)
    page.click("#key-form button[type=submit]")
    card = page.locator(f'.run[data-run-id="{run.id}"]')
    card.wait_for()
    assert page.evaluate("sessionStorage.getItem('candor.console.key')") == server.secret

    # The pending items: tool, kind, arguments and who asked (the agent, for the key the run acts for), in the DOM
    # and on a non-blank screenshot.
    assert run.principal_id is not None and card.locator(".principal").text_content() == run.principal_id
    items = card.locator(".item")
    assert items.count() == 3
    refund = card.locator('.item[data-call-id="call_refund_a1"]')
    assert refund.locator(".tool").text_content() == "refund_order"
    assert json.loads(refund.locator(".arguments").text_content()) == {"order_id": "A1", "amount": 50}
    question = card.locator('.item[data-call-id="call_currency"]')
    assert question.get_attribute("data-kind") == "question"
    assert question.text_content().count("Which currency?") == 1  # issue 35: shown once, as the question
    assert question.locator(".question-text").text_content() == "Which currency?"
    assert "approvals" in card.locator(".meta").first.text_content()
    shot = tmp_path / "console.png"
    page.screenshot(path=str(shot), full_page=True)
    colours, dominant = colour_spread(shot.read_bytes())
    assert colours > 20 and dominant < 0.97, (colours, dominant)
    assert "refund_order" in page.content() and "call_currency" in page.content()

    submit = card.locator(".submit")
    assert submit.is_disabled()  # nothing answered yet: the strict batch cannot be sent
    refund.locator("input[value=edit]").check()
    editor = refund.locator(".editor")
    editor.fill('{"order_id": "A1", "amount": ')
    assert "not valid JSON" in refund.locator(".invalid").text_content()
    card.locator('.item[data-call-id="call_delete_log"] input[value=deny]').check()
    card.locator('.item[data-call-id="call_delete_log"] .reason').fill("keep the logs")
    question.locator("input[value=answer]").check()
    question.locator(".answer").fill("EUR")
    assert submit.is_disabled()

    # A batch the service refuses (over the 256 KiB resume limit): shown with the envelope's details, nothing changes.
    editor.fill(json.dumps({"order_id": "A1", "amount": 40, "note": "x" * 300_000}))
    assert submit.is_enabled()
    submit.click()
    rejection = card.locator(".rejection")
    rejection.wait_for()
    assert rejection.locator(".code").text_content() == "invalid_argument"
    details = json.loads(rejection.locator(".details").text_content())
    assert details == {"fields": [{"field": "body", "reason": "too_large"}]}
    assert rejection.locator(".meta").text_content().startswith("request id req_")

    editor.fill('{"order_id": "A1", "amount": 40}')
    submit.click()
    outcome = card.locator(".outcome")
    outcome.wait_for()
    successor_id = outcome.locator(".successor").text_content()
    assert successor_id.startswith("run_") and successor_id != run.id
    assert rejection.is_hidden()
    output = card.locator(".successor-output")
    output.wait_for(timeout=30_000)  # followed live: the thread stream's `changed` re-reads the successor
    text = output.text_content()
    assert "refunded 40 on A1" in text and "keep the logs" in text and "EUR" in text
    assert card.locator(".successor-status").text_content() == "completed"
    assert card.locator("h2").text_content() == "Agent approvals: answered"  # issue 35: no stale "asks for"

    with CandorClient(server.base_url, server.secret) as client:
        successor = client.get_run(successor_id)
        assert successor.parent_run_id == run.id and successor.status == "completed"
        assert list(client.waiting_runs()) == []
        # A run that starts waiting later shows up without a reload (the page polls the list).
        second = client.create_thread("approvals", "Refund order A1 again.")
        assert second.run is not None
        assert client.wait_for_run(second.run.id, timeout=30).status == "waiting"

    card = page.locator(f'.run[data-run-id="{second.run.id}"]')
    card.wait_for(timeout=30_000)
    card.locator('.item[data-call-id="call_refund_a1"] input[value=approve]').check()
    # Same call ids as the first run, whose answered card is still shown: each card keeps its own choices.
    first_choice = page.locator(f'.run[data-run-id="{run.id}"] .item[data-call-id="call_refund_a1"] input[value=edit]')
    assert first_choice.is_checked()
    card.locator('.item[data-call-id="call_delete_log"] input[value=approve]').check()
    question = card.locator('.item[data-call-id="call_currency"]')
    question.locator("input[value=fail]").check()
    assert card.locator(".submit").is_disabled()  # declining needs a reason
    question.locator(".reason").fill("ask finance")
    card.locator(".submit").click()
    output = card.locator(".successor-output")
    output.wait_for(timeout=30_000)
    text = output.text_content()
    assert "refunded 50 on A1" in text and "deleted old.log" in text and "ask finance" in text
