"""End to end on PostgreSQL: real `candor serve` processes (one `control`, two `worker`s), driven through HTTP only.

A client creates a thread declaring a client tool (§8.8); the scripted agent (`e2e/agents.py`) calls it together with
a tool that needs approval, so the run ends `waiting` with both pending. The client resumes twice with the same
Idempotency-Key and body. The successor's worker is SIGKILLed while a retry-safe tool runs; once the lease has
expired the other worker continues the run from its last checkpoint. The client's SSE stream shows the first
attempt's entries, `reset`, the second attempt's entries and the final boundary; the run completes.

The processes get a fresh `public` schema of the session's PostgreSQL database (`empty_db`), `candor migrate` and
`candor bootstrap` prepare it, and short leases keep the whole test within seconds. Every wait is bounded and the
processes are killed in a `finally`. Without a reachable PostgreSQL the test is skipped, unless
`CANDOR_REQUIRE_POSTGRES=1` (CI) makes it fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.service.test_serve import CANDOR, free_port, wait_ready
from serve_agents import FACTORY, WORKER_ENV, tool_lines

pytestmark = [pytest.mark.crash, pytest.mark.postgres]

SUPPORT = Path(__file__).resolve().parents[2] / "support"
"""tests/support: on the processes' PYTHONPATH, so that `serve_agents` imports there."""

WEATHER = {
    "name": "get_weather",
    "description": "Local weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TEXT = {"content": [{"type": "text", "text": "What is the weather in Paris? Then delete a.txt."}]}
RESUME = {
    "approvals": {"call_delete": {"action": "approve"}},
    "calls": {"call_weather": {"status": "returned", "value": "sunny"}},
}

T = TypeVar("T")


def settings_toml(database_url: str) -> str:
    """Short leases (3 s, the minimum), frequent sweeps and scans; §3.3's startup checks hold."""
    return f"""
[database]
url = {json.dumps(database_url)}
timeout = 0.9

[worker]
slots = 1
lease_seconds = 3
authority_seconds = 0.5
scan_seconds = 0.2
drain_seconds = 1

[control]
scan_seconds = 0.2

[agents.e2e]
factory = "{FACTORY}"
"""


@dataclass
class Cluster:
    """The `candor` processes of one test; output goes to one log file per process."""

    config: Path
    logs: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

    def env(self, name: str = "cli") -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.upper().startswith("CANDOR_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")]))
        env[WORKER_ENV] = name
        if name in self.ports:
            env["CANDOR_SERVER__LISTEN"] = f"127.0.0.1:{self.ports[name]}"
        return env

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [*CANDOR, *args, "--config", str(self.config)],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def start(self, name: str, role: str) -> None:
        self.ports[name] = free_port()
        with open(self.logs / f"{name}.log", "wb") as log:
            self.processes[name] = subprocess.Popen(
                [*CANDOR, "serve", "--role", role, "--config", str(self.config)],
                env=self.env(name),
                cwd=self.logs,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def base(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def wait_ready(self) -> None:
        for name, process in self.processes.items():
            try:
                wait_ready(self.base(name), process, timeout=60)
            except AssertionError as exc:
                raise AssertionError(f"{name}: {exc}\n{self.output()}") from None

    def kill(self, name: str) -> int:
        process = self.processes[name]
        process.send_signal(signal.SIGKILL)
        return process.wait(timeout=10)

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)

    def output(self) -> str:
        """The tail of every process's log, for failure messages."""
        return "\n".join(
            f"--- {name}\n{(self.logs / f'{name}.log').read_text(errors='replace')[-3000:]}" for name in self.processes
        )


@contextlib.contextmanager
def cluster(tmp_path: Path, database_url: str) -> Iterator[Cluster]:
    config = tmp_path / "candor.toml"
    config.write_text(settings_toml(database_url), encoding="utf-8")
    running = Cluster(config=config, logs=tmp_path)
    try:
        yield running
    finally:
        running.stop_all()


async def eventually(check: Callable[[], Awaitable[T | None]], *, timeout: float, what: str, env: Cluster) -> T:
    """Poll `check` until it returns something other than None; fail naming `what` (with the logs) after
    `timeout` seconds."""
    try:
        async with asyncio.timeout(timeout):
            while (value := await check()) is None:
                await asyncio.sleep(0.1)
            return value
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{env.output()}") from None


async def collect_stream(client: httpx.AsyncClient, thread_id: str, headers: dict[str, str], into: list[Any]) -> None:
    """Read the thread's SSE stream (§8.7) until cancelled, appending `{"event", "data", "id"}` per named event."""
    timeout = httpx.Timeout(10.0, read=60.0)  # keep-alive comments come at least every 15 s (S-102)
    async with client.stream("GET", f"/v1/threads/{thread_id}/stream", headers=headers, timeout=timeout) as response:
        assert response.status_code == 200
        fields: dict[str, str] = {}
        async for line in response.aiter_lines():
            if line:
                if not line.startswith(":"):
                    name, _, value = line.partition(":")
                    fields[name] = value.removeprefix(" ")
                continue
            if "event" in fields:
                into.append({"event": fields["event"], "data": json.loads(fields["data"]), "id": fields.get("id")})
            fields = {}


def sample(metrics_text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(metrics_text):
        for found in family.samples:
            if found.name == name and all(found.labels.get(k) == v for k, v in labels.items()):
                return float(found.value)
    return 0.0


def streamed_final_boundary(events: list[Any], run: dict[str, Any]) -> bool:
    """Whether the stream carried the boundary of the run's last checkpoint (the one its seal committed)."""
    return any(
        e["event"] == "boundary"
        and e["data"]["run_id"] == run["id"]
        and e["data"]["checkpoint_seq"] == run["checkpoint_seq"]
        for e in events
    )


@dataclass(frozen=True)
class Api:
    client: httpx.AsyncClient
    auth: dict[str, str]

    async def get(self, path: str) -> Any:
        response = await self.client.get(path, headers=self.auth)
        assert response.status_code == 200, response.text
        return response.json()

    def run_in(self, run_id: str, *statuses: str) -> Callable[[], Awaitable[dict[str, Any] | None]]:
        """A check for `eventually`: the RunView once its status is one of `statuses`."""

        async def check() -> dict[str, Any] | None:
            run: dict[str, Any] = await self.get(f"/v1/runs/{run_id}")
            return run if run["status"] in statuses else None

        return check


@pytest.mark.slow
@pytest.mark.parametrize("db_kind", ["postgresql"], indirect=True)
async def test_client_tool_approval_resume_and_a_killed_worker_end_to_end(empty_db: str, tmp_path: Path) -> None:
    """S-131, S-89 (a client tool call and an approval pending together: `multiple`), S-80, S-81, S-83 (the same
    resume twice: 201 then 200, one successor), S-132 (the client's value reaches the model), S-28, S-27, S-29 (the
    successor's worker is SIGKILLed mid-tool; after lease expiry the other worker continues from the tool-boundary
    checkpoint and replays only the retry-safe tool), S-103 (the stream sends `reset` before the new attempt's
    entries), §7.8 step 7 / S-5 (each run's final, sealing commit streams its boundary), S-100 (workers serve
    `/metrics`, not `/v1`), §10.4 (attempt durations, commit bytes and slots, from the worker that did the work)."""
    with cluster(tmp_path, empty_db) as env:
        env.cli("migrate")
        secret = json.loads(env.cli("bootstrap").strip().splitlines()[-1])["secret"]
        env.start("control", "control")
        env.start("worker-a", "worker")
        env.start("worker-b", "worker")
        env.wait_ready()
        events: list[Any] = []
        async with httpx.AsyncClient(base_url=env.base("control"), timeout=10.0) as client:
            api = Api(client=client, auth={"Authorization": f"Bearer {secret}"})
            options = {"client_tools": [WEATHER], "workdir": str(tmp_path), "block_seconds": 30}
            created = await client.post(
                "/v1/threads",
                json={"agent": "e2e", "input": TEXT, "options": options},
                headers=api.auth | {"Idempotency-Key": "thread-1"},
            )
            assert created.status_code == 201, created.text
            thread_id, first_id = created.json()["thread"]["id"], created.json()["run"]["id"]
            reader = asyncio.create_task(collect_stream(client, thread_id, api.auth, events))
            try:
                sealed = api.run_in(first_id, "waiting", "failed", "completed")
                waiting = await eventually(sealed, timeout=60, what="the first run to be sealed", env=env)
                assert waiting["status"] == "waiting", waiting
                assert waiting["wait_reason"] == "multiple"
                pending = waiting["pending"]
                assert [(c["tool_call_id"], c["tool_name"], c["arguments"], c["kind"]) for c in pending["calls"]] == [
                    ("call_weather", "get_weather", {"city": "Paris"}, "external")
                ]
                assert [(a["tool_call_id"], a["tool_name"]) for a in pending["approvals"]] == [
                    ("call_delete", "delete_file")
                ]
                assert tool_lines(tmp_path, "delete_file") == []  # nothing ran before the approval

                headers = api.auth | {"Idempotency-Key": "resume-1"}
                first = await client.post(f"/v1/runs/{first_id}/resume", json=RESUME, headers=headers)
                again = await client.post(f"/v1/runs/{first_id}/resume", json=RESUME, headers=headers)
                assert (first.status_code, again.status_code) == (201, 200), (first.text, again.text)
                successor_id = first.json()["id"]
                assert again.json()["id"] == successor_id
                assert first.json()["parent_run_id"] == first_id and first.json()["trigger"] == "resume"
                runs = (await api.get(f"/v1/threads/{thread_id}/runs"))["items"]
                assert sorted(run["id"] for run in runs) == sorted([first_id, successor_id])  # one successor

                async def slow_step_started() -> str | None:
                    lines = tool_lines(tmp_path, "slow_step")
                    return lines[0].split()[0] if lines else None

                victim = await eventually(slow_step_started, timeout=60, what="the slow step to start", env=env)
                survivor = {"worker-a": "worker-b", "worker-b": "worker-a"}[victim]
                assert env.kill(victim) == -signal.SIGKILL

                sealed = api.run_in(successor_id, "completed", "failed")
                done = await eventually(sealed, timeout=60, what="the successor to be sealed", env=env)
                assert done["status"] == "completed", done
                assert done["output"] == "weather sunny; deleted a.txt; slow step done"  # S-132
                attempts = (await api.get(f"/v1/runs/{successor_id}/attempts"))["items"]
                assert [(a["number"], a["status"]) for a in attempts] == [(1, "failed"), (2, "succeeded")]
                assert attempts[0]["failure"]["code"] == "lease_expired"
                assert attempts[0]["worker_id"] != attempts[1]["worker_id"]
                # The retry-safe step ran again on the survivor; the approved deletion ran exactly once.
                assert [line.split()[0] for line in tool_lines(tmp_path, "slow_step")] == [victim, survivor]
                assert len(tool_lines(tmp_path, "delete_file")) == 1

                for run in (waiting, done):

                    async def final_boundary_seen(run: dict[str, Any] = run) -> bool | None:
                        return streamed_final_boundary(events, run) or None

                    await eventually(
                        final_boundary_seen, timeout=15, what=f"the final boundary of {run['id']}", env=env
                    )
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader

        successor = [e for e in events if e["data"].get("run_id") == successor_id]
        kinds = [(e["event"], e["data"].get("attempt")) for e in successor]
        assert kinds.count(("reset", None)) == 1, kinds
        cut = kinds.index(("reset", None))
        assert kinds[:cut] and all(attempt == 1 for _, attempt in kinds[:cut]), kinds
        assert kinds[cut + 1 :] and all(attempt == 2 for _, attempt in kinds[cut + 1 :]), kinds
        for run in (waiting, done):  # the last entry of each run is its final boundary
            last = [e for e in events if e["data"].get("run_id") == run["id"]][-1]
            assert (last["event"], last["data"]["checkpoint_seq"]) == ("boundary", run["checkpoint_seq"])

        assert httpx.get(f"{env.base(survivor)}/v1/threads/{thread_id}", timeout=10).status_code == 404  # S-100
        metrics = httpx.get(f"{env.base(survivor)}/metrics", timeout=10).text
        assert sample(metrics, "candor_attempt_duration_seconds_count", status="succeeded") >= 1
        assert sample(metrics, "candor_checkpoint_commit_bytes_count", boundary="model") >= 2
        assert sample(metrics, "candor_worker_slots", state="busy") == 0
        assert sample(metrics, "candor_worker_slots", state="free") == 1
