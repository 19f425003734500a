"""A real `candor serve` (role `all`) on the test database (SQLite and PostgreSQL) with the scripted
`console_agent`, and its bootstrap key: what the client and console tests drive over real HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from e2e.service.test_serve import CANDOR, free_port, wait_ready

SUPPORT = Path(__file__).resolve().parents[2] / "support"  # the agents `candor serve` loads


@dataclass(frozen=True)
class Server:
    base_url: str
    secret: str
    log: Path


def _settings(database_url: str, port: int) -> str:
    return f"""
[database]
url = {json.dumps(database_url)}

[server]
listen = "127.0.0.1:{port}"

[worker]
scan_seconds = 0.1

[control]
scan_seconds = 0.2

[agents.approvals]
factory = "console_agent:factory"
"""


@pytest.fixture
def server(db: Any, tmp_path: Path) -> Iterator[Server]:
    port = free_port()
    config = tmp_path / "candor.toml"
    config.write_text(_settings(db.url, port), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), *sys.path])}
    log = tmp_path / "serve.log"
    base = f"http://127.0.0.1:{port}"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [*CANDOR, "serve", "--config", str(config)], env=env, cwd=tmp_path, stdout=output, stderr=subprocess.STDOUT
        )
    try:
        try:
            wait_ready(base, process, timeout=60)  # generous: the test machine may be busy
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its log: {log.read_text(errors='replace')[-4000:]}") from None
        bootstrap = [*CANDOR, "bootstrap", "--config", str(config)]
        booted = subprocess.run(bootstrap, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert booted.returncode == 0, booted.stderr
        secret = json.loads(booted.stdout.strip().splitlines()[-1])["secret"]
        yield Server(base_url=base, secret=secret, log=log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
