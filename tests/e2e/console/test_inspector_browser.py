"""The run inspector (issue 35 item 1) in a real headless Chromium driven by Playwright, against a real
`candor serve` (role `all`) on SQLite and PostgreSQL, with a run that crashed mid-tool.

The scripted `inspector_agent` asks for an approval; a second key (read, run) approves it; the successor calls
`charge_card` (not declared retry-safe) and `lookup_order` (declared retry-safe), which both block on their first
execution. The whole `candor serve` process is SIGKILLed while they run, then started again on the same database
and port: once the lease has expired, the recovering attempt gives `charge_card` the unknown-outcome result
(policy `declared`, H-46) and replays `lookup_order` (H-47 via H-52), and the run completes.

The page, opened at the successor's deep link before the crash, follows the run live (the thread stream) through
the crash and the restart; it then shows the failed attempt (`lease_expired`) and the recovery attempt, the unknown
outcome marked, the replayed call, the policy and retry-safety, the approval with the approving key's id, usage per
step and in total. A reload of the deep link shows the same; the thread page shows both runs on its timeline and
the threads list finds the thread by id prefix and agent. Text from the data (a tool argument holding markup) is
shown as text. Screenshots are saved to the test's tmp dir and must not be blank (S-27, S-28, S-80, §8.7).

Chromium is Debian's (`/usr/bin/chromium`); `playwright install` is never used. Without it the test is skipped,
naming what failed (see test_console_browser.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from chromium_support import CHROMIUM_FLAGS, find_chromium
from e2e.service.test_serve import CANDOR, free_port, wait_ready
from inspector_agent import FACTORY, MARKUP, started
from png_pixels import colour_spread

pytestmark = [pytest.mark.crash, pytest.mark.slow]  # real processes: a server (killed, restarted) and a browser

SUPPORT = Path(__file__).resolve().parents[2] / "support"  # the agents `candor serve` loads
T = TypeVar("T")


def _settings(database_url: str, port: int) -> str:
    """Short leases so that recovery follows the crash within seconds; §3.3's startup checks hold."""
    return f"""
[database]
url = {json.dumps(database_url)}
timeout = 1.5

[server]
listen = "127.0.0.1:{port}"

[worker]
lease_seconds = 6
authority_seconds = 1
scan_seconds = 0.1
drain_seconds = 1

[control]
scan_seconds = 0.2

[agents.inspected]
factory = "{FACTORY}"
"""


@dataclass
class Serve:
    """One `candor serve` on a fixed config and port, which the test can SIGKILL and start again."""

    config: Path
    base_url: str
    logs: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    killed: list[int] = field(default_factory=list)

    def start(self) -> None:
        self.starts += 1
        log = self.logs / f"serve-{self.starts}.log"
        with open(log, "wb") as output:
            self.process = subprocess.Popen(
                [*CANDOR, "serve", "--config", str(self.config)],
                env=self.env,
                cwd=self.logs,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_ready(self.base_url, self.process, timeout=60)  # generous: the test machine may be busy
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its log: {log.read_text(errors='replace')[-4000:]}") from None

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.killed.append(self.process.wait(timeout=10))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def output(self) -> str:
        return "\n".join(log.read_text(errors="replace")[-3000:] for log in sorted(self.logs.glob("serve-*.log")))


@pytest.fixture
def chromium() -> str:
    return find_chromium()


@pytest.fixture
def serve(chromium: str, db: Any, tmp_path: Path) -> Iterator[Serve]:
    port = free_port()
    config = tmp_path / "candor.toml"
    config.write_text(_settings(db.url, port), encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if not key.upper().startswith("CANDOR_")}
    env["PYTHONPATH"] = os.pathsep.join([str(SUPPORT), *sys.path])
    running = Serve(config=config, base_url=f"http://127.0.0.1:{port}", logs=tmp_path, env=env)
    try:
        running.start()
        yield running
    finally:
        running.stop()


@pytest.fixture
def page(chromium: str, serve: Serve) -> Iterator[Any]:
    """Started after the server: Playwright's sync API runs its own event loop (see test_console_browser.py)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
        try:
            context = browser.new_context(viewport={"width": 1200, "height": 1600})
            page = context.new_page()
            page.set_default_timeout(30_000)
            yield page
        finally:
            browser.close()


def eventually(check: Callable[[], T | None], *, timeout: float, what: str, serve: Serve) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found is not None:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}\n{serve.output()}")


def _bootstrap(serve: Serve) -> str:
    done = subprocess.run(
        [*CANDOR, "bootstrap", "--config", str(serve.config)],
        env=serve.env,
        cwd=serve.logs,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout.strip().splitlines()[-1])["secret"])


def _screenshot(page: Any, path: Path) -> None:
    page.screenshot(path=str(path), full_page=True)
    colours, dominant = colour_spread(path.read_bytes())
    assert colours > 20 and dominant < 0.97, (path.name, colours, dominant)


def test_inspector_shows_a_crashed_run(serve: Serve, page: Any, tmp_path: Path) -> None:
    admin = _bootstrap(serve)
    workdir = tmp_path / "effects"
    workdir.mkdir()
    http = httpx.Client(base_url=serve.base_url, timeout=10.0)

    def call(method: str, path: str, secret: str = admin, **kwargs: Any) -> Any:
        response = http.request(
            method, path, headers={"Authorization": f"Bearer {secret}"} | kwargs.pop("headers", {}), **kwargs
        )
        assert response.is_success, (method, path, response.status_code, response.text)
        return response.json()

    def run(run_id: str) -> Any:
        return call("GET", f"/v1/runs/{run_id}")

    def sealed(run_id: str) -> Callable[[], Any]:
        return lambda: found if (found := run(run_id))["status"] not in ("accepted", "running") else None

    try:
        body = {
            "agent": "inspected",
            "input": {"content": [{"type": "text", "text": "Refund A1, then charge it."}]},
            "options": {"workdir": str(workdir), "block_seconds": 120},
        }
        created = call("POST", "/v1/threads", json=body, headers={"Idempotency-Key": "thread-1"})
        thread_id, first_id = created["thread"]["id"], created["run"]["id"]
        waiting = eventually(sealed(first_id), timeout=60, what="the first run to wait", serve=serve)
        assert waiting["status"] == "waiting", waiting

        approver = call("POST", "/v1/keys", json={"name": "approver", "permissions": ["read", "run"]})
        answer = {"approvals": {"call_refund": {"action": "approve"}}, "calls": {}}
        successor = call(
            "POST",
            f"/v1/runs/{first_id}/resume",
            approver["secret"],
            json=answer,
            headers={"Idempotency-Key": "resume-1"},
        )
        successor_id = successor["id"]

        # The deep link, opened while the run runs; a reader key (read permission only) suffices.
        reader = call("POST", "/v1/keys", json={"name": "reader", "permissions": ["read"]})
        page.goto(f"{serve.base_url}/console/runs/{successor_id}")
        _check_page_decisions(page)
        page.fill("#key", reader["secret"])
        page.click("#key-form button[type=submit]")
        head = page.locator(f'.run-head[data-run-id="{successor_id}"]')
        head.wait_for()

        both_started = lambda: True if started(workdir, "charge_card") and started(workdir, "lookup_order") else None  # noqa: E731
        eventually(both_started, timeout=60, what="both tools to start", serve=serve)
        page.locator('.attempt[data-attempt="1"][data-status="running"]').wait_for()  # shown live
        _screenshot(page, tmp_path / "inspector-running.png")
        serve.kill()
        assert serve.killed == [-signal.SIGKILL]
        serve.start()  # same database, same port: the page's stream reconnects by itself

        done = eventually(sealed(successor_id), timeout=90, what="the successor to be sealed", serve=serve)
        assert done["status"] == "completed", done
        assert started(workdir, "charge_card") == 1 and started(workdir, "lookup_order") == 2  # unknown; replayed
        attempts = call("GET", f"/v1/runs/{successor_id}/attempts")["items"]
        assert [(a["number"], a["status"], a["start_reason"]) for a in attempts] == [
            (1, "failed", "initial"),
            (2, "succeeded", "recovery"),
        ]

        # Followed live through the crash: the page re-reads the run when the recovered attempt commits and seals.
        page.locator('.run-head[data-status="completed"]').wait_for(timeout=60_000)
        for reload in (False, True):
            if reload:
                page.reload()  # the deep link survives a reload (the key stays in the tab's sessionStorage)
                page.locator('.run-head[data-status="completed"]').wait_for()
            _check_run_page(page, done, attempts, approver["id"])
        _screenshot(page, tmp_path / "inspector-run.png")
        assert page.title() != "owned" and page.locator("#inspector img").count() == 0

        # The waiting run names who answered it, and when, and links its successor.
        page.click(".parent-link")
        page.locator(f'.run-head[data-run-id="{first_id}"]').wait_for()
        assert page.url.endswith(f"/console/runs/{first_id}")
        note = page.locator(".successor-note")
        note.wait_for()
        assert approver["id"] in note.text_content() and successor_id in note.text_content()
        refund = page.locator('.call[data-call-id="call_refund"]')
        assert json.loads(refund.locator(".arguments").text_content())["note"] == MARKUP  # markup shown as text
        assert approver["id"] in refund.locator(".answered-by").text_content()

        # The thread page: both runs on the timeline, oldest first, the successor marked as resuming the first.
        page.click(".thread-link")
        timeline = page.locator(".timeline-run")
        timeline.first.wait_for()
        assert [timeline.nth(i).get_attribute("data-run-id") for i in range(timeline.count())] == [
            first_id,
            successor_id,
        ]
        assert "resumes" in timeline.nth(1).locator(".lineage").text_content()
        _screenshot(page, tmp_path / "inspector-thread.png")

        # The threads list: a search by id prefix and agent finds it; a search for another agent does not.
        page.goto(f"{serve.base_url}/console/threads")
        page.fill("#thread-q", thread_id[:12])
        page.fill("#thread-agent", "inspected")
        page.click("#thread-search button[type=submit]")
        page.locator(f'tr[data-thread-id="{thread_id}"]').wait_for()
        assert "agent=inspected" in page.url
        page.fill("#thread-agent", "nobody")
        page.click("#thread-search button[type=submit]")
        page.locator("#threads-summary", has_text="No thread matches.").wait_for()
        page.fill("#thread-agent", "")
        page.fill("#thread-q", successor_id)  # a whole run id opens the run
        page.click("#thread-search button[type=submit]")
        page.locator(f'.run-head[data-run-id="{successor_id}"]').wait_for()

        # Paging, one thread a page: newest first, then back.
        newer = call("POST", "/v1/threads", json=body, headers={"Idempotency-Key": "thread-2"})["thread"]["id"]
        page.goto(f"{serve.base_url}/console/threads?limit=1")
        page.locator(f'tr[data-thread-id="{newer}"]').wait_for()
        assert page.locator("tr[data-thread-id]").count() == 1 and page.locator("#threads-previous").is_disabled()
        page.click("#threads-next")
        page.locator(f'tr[data-thread-id="{thread_id}"]').wait_for()
        assert page.locator("#threads-next").is_disabled()  # the last page
        page.click("#threads-previous")
        page.locator(f'tr[data-thread-id="{newer}"]').wait_for()

        # From the approvals list to the inspector: the waiting run's page shows the call that waits.
        page.click('#nav a[data-view="approvals"]')
        card = page.locator(f'.run[data-thread-id="{newer}"]')
        card.wait_for()
        card.locator("a.inspect").click()
        waiting_call = page.locator('.call[data-call-id="call_refund"]')
        waiting_call.locator(".pending-note").wait_for()
        assert waiting_call.get_attribute("data-outcome") == "no_result"
        assert waiting_call.locator(".pending-note").text_content() == "waiting for approval"
        assert page.locator("#approvals-view").is_hidden()
    finally:
        http.close()


def _check_run_page(page: Any, run: Any, attempts: list[Any], approver_id: str) -> None:
    """The elements that matter on the crashed run's page."""
    rows = page.locator(".attempt")
    assert rows.count() == 2
    failed = page.locator('.attempt[data-attempt="1"]')
    assert failed.get_attribute("data-status") == "failed"
    assert "lease_expired" in failed.locator(".failure-code").text_content()
    assert failed.locator(".worker").text_content() == attempts[0]["worker_id"]
    recovery = page.locator('.attempt[data-attempt="2"]')
    assert recovery.get_attribute("data-status") == "succeeded"
    assert recovery.locator(".start-reason").text_content().startswith("recovery")

    charge = page.locator('.call[data-call-id="call_charge"]')
    assert charge.get_attribute("data-outcome") == "unknown"
    assert charge.locator(".outcome").text_content() == "unknown outcome"
    assert charge.locator(".outcome").evaluate("node => getComputedStyle(node).textTransform") == "uppercase"
    assert charge.locator(".policy-mode").text_content() == "declared"
    assert charge.locator(".retry-safe").text_content().startswith("not declared retry-safe")
    assert json.loads(charge.locator(".arguments").text_content()) == {"order_id": "A1", "amount": 50}
    lookup = page.locator('.call[data-call-id="call_lookup"]')
    assert lookup.get_attribute("data-outcome") == "replayed"
    assert lookup.locator(".retry-safe").text_content().startswith("declared retry-safe")
    assert "order A1 is open" in lookup.locator(".result").text_content()
    assert "unknown outcome" in page.locator(".alarm").text_content()

    # The approval that started the run: by the approver's key, not the key the run acts for (S-80).
    answers = page.locator(".answers")
    assert answers.get_attribute("data-answered-by") == approver_id
    assert run["principal_id"] != approver_id and page.locator(".principal").text_content() == run["principal_id"]
    refund = page.locator('.carried .call[data-call-id="call_refund"]')
    assert refund.get_attribute("data-outcome") == "answered"
    assert approver_id in refund.locator(".answered-by").text_content()

    # Steps: the model's tool calls, then its final text; usage per step and in total.
    steps = page.locator(".step[data-step]")
    assert steps.count() == 2
    assert "done. charge:" in steps.nth(1).locator(".response-text").text_content()
    assert "tokens:" in steps.nth(0).locator(".step-usage").text_content()
    assert page.locator(".usage-total").text_content() != "—"
    assert page.locator(".output").text_content() == run["output"]


OUTCOMES = [  # a return part (or none) -> the outcome the page shows
    (None, "no_result"),
    ({"part_kind": "tool-return", "content": "x", "metadata": {"candor.unknown_outcome": True}}, "unknown"),
    ({"part_kind": "tool-return", "content": "x", "metadata": {"candor.unknown_outcome": "yes"}}, "answered"),
    ({"part_kind": "tool-return", "content": "x", "metadata": {"candor.recovery": "replayed"}}, "replayed"),
    ({"part_kind": "tool-return", "content": "x", "metadata": {"candor.recovery": "reconciled"}}, "reconciled"),
    ({"part_kind": "tool-return", "content": "x", "metadata": {"candor.recovery": "rerun"}}, "rerun"),
    ({"part_kind": "tool-return", "content": "x", "metadata": {"candor.recovery": "other"}}, "answered"),
    ({"part_kind": "tool-return", "content": "x", "outcome": "denied"}, "denied"),
    ({"part_kind": "retry-prompt", "content": "bad"}, "retry"),
    ({"part_kind": "tool-return", "content": "x", "metadata": None}, "answered"),
]
ROUTES = [  # a console path -> the inspector page, or None for the approvals list
    ("/console", "", None),
    ("/console/threads", "?agent=a", {"page": "threads"}),
    ("/console/threads/thr_1", "", {"page": "thread", "id": "thr_1"}),
    ("/console/runs/run_1", "", {"page": "run", "id": "run_1"}),
    ("/console/runs/run_%3Cb%3E/", "", {"page": "run", "id": "run_<b>"}),
    ("/console/runs", "", None),
    ("/console/runs/a/b", "", None),
]


def _check_page_decisions(page: Any) -> None:
    """The page's pure decisions, table-driven in the browser: which recovery outcome a return part shows
    (docs/state-and-resume.md: `candor.unknown_outcome` is only the boolean true), which page a path is, and how
    a run's messages become steps (a resume's answered calls come first, apart)."""
    shown = page.evaluate("(parts) => parts.map((part) => callOutcome(part).outcome)", [p for p, _ in OUTCOMES])
    assert shown == [outcome for _, outcome in OUTCOMES]
    routes = page.evaluate(
        "(paths) => paths.map(([path, search]) => { const r = inspectorRoute(path, search);"
        " return r && (r.page === 'threads' ? {page: r.page} : r); })",
        [[path, search] for path, search, _ in ROUTES],
    )
    assert routes == [expected for _, _, expected in ROUTES]
    messages = [
        {
            "kind": "request",
            "parts": [
                {"part_kind": "tool-return", "tool_call_id": "old", "content": "ok"},
                {"part_kind": "user-prompt", "content": "go on"},
            ],
        },
        {
            "kind": "response",
            "parts": [
                {"part_kind": "text", "content": "calling"},
                {"part_kind": "tool-call", "tool_call_id": "c1", "tool_name": "t", "args": "{}"},
            ],
        },
        {"kind": "request", "parts": [{"part_kind": "tool-return", "tool_call_id": "c1", "content": 1}]},
        {"kind": "response", "parts": [{"part_kind": "text", "content": "done"}]},
    ]
    steps = page.evaluate(
        "(messages) => { const s = stepsOf(messages); return {carried: s.carried.map((p) => p.tool_call_id),"
        " steps: s.steps.map((step) => ({texts: step.texts, inputs: step.inputs,"
        " calls: step.calls.map((c) => [c.part.tool_call_id, c.result && c.result.content])}))}; }",
        messages,
    )
    assert steps == {
        "carried": ["old"],
        "steps": [
            {"texts": ["calling"], "inputs": ["go on"], "calls": [["c1", 1]]},
            {"texts": ["done"], "inputs": [], "calls": []},
        ],
    }
