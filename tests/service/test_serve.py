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

import httpx
import pytest

pytestmark = pytest.mark.crash

CANDOR = [sys.executable, "-m", "candor.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(base: str, process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
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
    process = subprocess.Popen([*CANDOR, "serve"], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
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
