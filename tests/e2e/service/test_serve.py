"""`candor serve` as a real process on the embedded SQLite default (spec §2.1, §3.3, §10.1, §10.3)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.crash

CANDOR = [sys.executable, "-m", "candor.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(base: str, process: subprocess.Popen[Any], timeout: float = 60.0) -> None:  # generous: busy machine
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "candor serve exited during startup"
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("candor serve did not become ready")


def test_serve_all_runs_a_thread_end_to_end_and_stops_on_sigterm(tmp_path: Path) -> None:
    """S-120, S-121, S-52, §2.1: `candor serve` (role all) migrates the SQLite default, runs the default
    scripted agent, and drains on SIGTERM with exit code 0."""
    port = free_port()
    env = {
        **os.environ,
        "CANDOR_DATABASE__URL": f"sqlite:///{tmp_path / 'candor.db'}",
        "CANDOR_SERVER__LISTEN": f"127.0.0.1:{port}",
    }
    base = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [*CANDOR, "serve"], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        wait_ready(base, process)
        assert httpx.get(f"{base}/healthz").json() == {"status": "ok", "role": "all"}
        booted = subprocess.run([*CANDOR, "bootstrap"], env=env, capture_output=True, check=True, text=True)
        secret = json.loads(booted.stdout.strip().splitlines()[-1])["secret"]
        headers = {"Authorization": f"Bearer {secret}", "Idempotency-Key": "first"}
        body = {"agent": "support", "input": {"content": [{"type": "text", "text": "Hi, my name is Ada"}]}}
        created = httpx.post(f"{base}/v1/threads", json=body, headers=headers)
        assert created.status_code == 201, created.text
        run_id = created.json()["run"]["id"]
        deadline = time.monotonic() + 20
        run = {}
        while time.monotonic() < deadline:
            run = httpx.get(f"{base}/v1/runs/{run_id}", headers={"Authorization": f"Bearer {secret}"}).json()
            if run["status"] not in ("accepted", "running"):
                break
            time.sleep(0.1)
        assert run["status"] == "completed", run
        assert "Ada" in json.dumps(run["output"])
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_worker_refuses_a_database_that_is_not_migrated(tmp_path: Path) -> None:
    """S-122: workers never migrate, and no process starts on a schema that is not the build's."""
    env = {
        **os.environ,
        "CANDOR_DATABASE__URL": f"sqlite:///{tmp_path / 'candor.db'}",
        "CANDOR_SERVER__LISTEN": f"127.0.0.1:{free_port()}",
    }
    result = subprocess.run([*CANDOR, "serve", "--role", "worker"], env=env, capture_output=True, timeout=30)
    assert result.returncode != 0


def test_serve_prints_its_summary_and_logs_requests_admin_writes_and_attempts(tmp_path: Path) -> None:
    """§10.1 (issue 14): `candor serve` prints role, database without password, listen address, agents and the
    bootstrap hint; with `CANDOR_LOG__FORMAT=json` it logs one line per HTTP request (with the response's request
    id), per admin write (`candor.admin`) and per attempt claimed/ended; never the message text or a secret."""
    port = free_port()
    env = {
        **os.environ,
        "CANDOR_DATABASE__URL": f"sqlite:///{tmp_path / 'candor.db'}",
        "CANDOR_SERVER__LISTEN": f"127.0.0.1:{port}",
        "CANDOR_LOG__FORMAT": "json",
        "CANDOR_KEY": "a client variable, not a setting",
    }
    base = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [*CANDOR, "serve"], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_ready(base, process)
        booted = subprocess.run([*CANDOR, "bootstrap"], env=env, capture_output=True, check=True, text=True)
        secret = json.loads(booted.stdout)["secret"]
        auth = {"Authorization": f"Bearer {secret}"}
        created = httpx.post(
            f"{base}/v1/threads",
            headers=auth | {"Idempotency-Key": "t"},
            json={"agent": "support", "input": {"content": [{"type": "text", "text": "Hi Ada"}]}},
        )
        assert created.status_code == 201, created.text
        key = httpx.post(f"{base}/v1/keys", headers=auth, json={"name": "ci", "permissions": ["read"]})
        assert key.status_code == 201
        run_id = created.json()["run"]["id"]
        deadline = time.monotonic() + 20
        while httpx.get(f"{base}/v1/runs/{run_id}", headers=auth).json()["status"] in ("accepted", "running"):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        output = process.stderr.read() if process.stderr else ""
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    plain = [line for line in output.splitlines() if not line.startswith("{")]
    assert plain[0] == f"candor serve: role all, database sqlite:///{tmp_path / 'candor.db'}"
    assert f"listening on http://127.0.0.1:{port}" in plain[1]
    assert plain[2].startswith("agents: ") and "support" in plain[2]
    assert "candor bootstrap" in plain[3]
    entries = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    requests = [e for e in entries if e["message"] == "HTTP request"]
    posted = next(e for e in requests if e["method"] == "POST" and e["route"] == "/v1/threads")
    assert posted["status"] == 201 and posted["request_id"] == created.headers["x-request-id"]
    assert posted["duration_ms"] >= 0
    assert any(e["logger"] == "candor.admin" and e["message"] == "Key created" for e in entries)
    assert {"Attempt claimed", "Attempt ended"} <= {e["message"] for e in entries}
    assert "Hi Ada" not in output and secret not in output and key.json()["secret"] not in output
