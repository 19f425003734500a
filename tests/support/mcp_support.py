"""Shared pieces of the MCP tests: the real tool server (`tool_server.py`) over stdio or streamable HTTP, and an agent
whose scripted model calls one of its tools once, then answers "done".

The HTTP server is a separate process on a free port (`http_server()`); a stdio server is started by the toolset
itself, as a child of the process that runs the agent.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from candor.mcp import RecoverableMCP, mcp_http, mcp_stdio

SERVER = Path(__file__).with_name("tool_server.py")
SERVER_NAME = "bank"
CALL_ID = "call_1"


def ledger(workdir: Path) -> list[str]:
    path = workdir / "ledger.txt"
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def server_env(workdir: Path, **extra: str) -> dict[str, str]:
    return {"CANDOR_MCP_LEDGER": str(workdir / "ledger.txt"), "CANDOR_MCP_BLOCK_DIR": str(workdir), **extra}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def http_server(workdir: Path, **extra_env: str) -> Iterator[str]:
    """A streamable-HTTP tool server for the duration of the block; yields its URL."""
    port = _free_port()
    env = dict(os.environ, **server_env(workdir, **extra_env))
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "http", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                assert process.stderr is not None
                raise RuntimeError(f"tool server did not start: {process.stderr.read().decode()[-2000:]}")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait()


def toolset(
    workdir: Path,
    *,
    url: str | None = None,
    retry_safe: Iterable[str] = (),
    never_retry: Iterable[str] = (),
    headers: dict[str, str] | None = None,
    **extra_env: str,
) -> RecoverableMCP:
    """The tool server's toolset: over HTTP at `url` (with `headers`), else a stdio server started by the toolset."""
    if url is not None:
        return mcp_http(
            url, server=SERVER_NAME, headers=headers, retry_safe=retry_safe, never_retry=never_retry, timeout=20
        )
    return mcp_stdio(
        sys.executable,
        [str(SERVER), "stdio"],
        server=SERVER_NAME,
        env=server_env(workdir, **extra_env),
        retry_safe=retry_safe,
        never_retry=never_retry,
        timeout=20,
    )


def calling_agent(tool: str, toolsets: list[Any]) -> tuple[Agent[Any, Any], list[list[ModelMessage]]]:
    """An agent whose model calls `tool(account="acme")` once, then answers "done"; returns it with what it was sent."""
    seen: list[list[ModelMessage]] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart(tool, {"account": "acme"}, tool_call_id=CALL_ID)])
        return ModelResponse(parts=[TextPart("done")])

    return Agent(FunctionModel(respond), toolsets=toolsets), seen
