"""docs/http-api.md runs as written: every `bash` block is interpreted, every `curl` goes to the app in process.

A small interpreter understands the shell the page uses: `NAME=$(COMMAND | jq -r .path)`, `curl` with `-X`, `-H`,
`-d`, `-i`, `-s`, and `candor bootstrap` (run through the real CLI). `$NAME` expands outside single quotes. An
```http block after a command is the response the page promises: its status line, the headers it shows (present
in the real response; an `ETag` must also look like one) and the shape of its JSON body (the same keys, recursively)
must match. A command without such a block must answer 2xx. `<!-- doc-test: the worker suspends $RUN_ID … -->`
stands in for a worker: it seals the run `waiting` on the approval the page then answers, with the two messages
(the prompt and the model's tool call) that got it there.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from http_support import client_for
from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, UserPromptPart
from typer.testing import CliRunner

from candor import cli
from candor.service.core import Service, agent_registry
from candor.service.http import create_app
from candor.service.settings import ServiceSettings

from commands.helpers import seal_run

DOC = Path(__file__).resolve().parents[3] / "docs" / "http-api.md"
EVENT = re.compile(r"^```(?P<lang>bash|http)[ \t]*\n(?P<body>.*?)^```[ \t]*$|<!-- doc-test: (?P<hook>.*?) -->",
                   re.MULTILINE | re.DOTALL)  # fmt: skip
CAPTURE = re.compile(r"\A(?P<name>[A-Z_][A-Z0-9_]*)=\$\((?P<command>.*)\|\s*jq -r (?P<path>\.[\w.]+)\)\Z", re.DOTALL)
VARIABLE = re.compile(r"\$(?:\{(?P<braced>[A-Z_][A-Z0-9_]*)\}|(?P<bare>[A-Z_][A-Z0-9_]*))")
DOC_PENDING = {
    "approvals": [{"tool_call_id": "call_refund_a1", "tool_name": "refund_order",
                   "arguments": {"order_id": "A1", "amount": 50}, "kind": "approval", "metadata": {}}],
    "calls": [],
}  # fmt: skip
DOC_HISTORY = (
    ModelRequest(parts=[UserPromptPart(content="Please refund order A1.")]),
    ModelResponse(parts=[ToolCallPart(tool_name="refund_order", args={"order_id": "A1", "amount": 50},
                                      tool_call_id="call_refund_a1")]),  # fmt: skip
)


def commands_of(block: str) -> list[str]:
    """Shell commands of a block: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def expand(command: str, variables: dict[str, str]) -> str:
    """`$NAME` and `${NAME}` replaced outside single quotes, as a POSIX shell does."""
    parts = re.split(r"('[^']*')", command)
    return "".join(
        part if part.startswith("'") else VARIABLE.sub(lambda m: variables[m["braced"] or m["bare"]], part)
        for part in parts
    )


def curl_request(argv: list[str]) -> tuple[str, str, dict[str, str], bytes | None]:
    """(method, URL, headers, body) of a curl command line."""
    method, url, headers, body = None, None, {}, None
    args = iter(argv[1:])
    for arg in args:
        if arg in ("-X", "--request"):
            method = next(args)
        elif arg in ("-H", "--header"):
            name, _, value = next(args).partition(":")
            headers[name.strip()] = value.strip()
        elif arg in ("-d", "--data", "--data-raw"):
            body = next(args).encode()
        elif arg in ("-i", "--include", "-s", "--silent", "-S", "--show-error"):
            pass
        elif arg.startswith("-"):
            raise AssertionError(f"curl option {arg} is not understood by the doc test")
        else:
            url = arg
    assert url is not None, argv
    return method or ("POST" if body is not None else "GET"), url, headers, body


def same_shape(shown: Any, actual: Any, where: str = "body") -> None:
    """The documented JSON has exactly the keys of the real one, recursively (values may differ)."""
    if isinstance(shown, dict):
        assert isinstance(actual, dict), where
        assert set(shown) == set(actual), f"{where}: documented {sorted(shown)} vs actual {sorted(actual)}"
        for name in shown:
            if shown[name] is not None and actual[name] is not None:
                same_shape(shown[name], actual[name], f"{where}.{name}")
    elif isinstance(shown, list) and shown and actual:
        same_shape(shown[0], actual[0], f"{where}[0]")


def check_response(shown: str, response: httpx.Response) -> None:
    head, _, body = shown.partition("\n\n")
    status_line, *header_lines = head.strip().splitlines()
    assert int(status_line.split()[1]) == response.status_code, (status_line, response.text)
    for line in header_lines:
        name, _, value = line.partition(":")
        assert name.strip() in response.headers, name
        if name.strip().lower() == "etag":
            assert re.fullmatch(r'"[a-z]+_[0-9a-f]{32}:\d+"', response.headers["etag"]), response.headers["etag"]
    if body.strip():
        same_shape(json.loads(body.replace("…", "")), response.json())


class Session:
    """The shell session the page describes, run against one app and one database."""

    def __init__(self, client: httpx.AsyncClient, service: Service, database_url: str) -> None:
        self.client = client
        self.service = service
        self.database_url = database_url
        self.variables: dict[str, str] = {}
        self.last: httpx.Response | None = None
        self.checked = True

    async def run(self, command: str) -> str:
        """Run one command; its output (the JSON body for curl, stdout for candor)."""
        if (capture := CAPTURE.match(command)) is not None:
            output = json.loads(await self.run(capture["command"].strip()))
            for key in capture["path"].strip(".").split("."):
                output = output[key]
            self.variables[capture["name"]] = str(output)
            return ""
        argv = shlex.split(expand(command, self.variables))
        if argv[:2] == ["candor", "bootstrap"]:
            env = {"CANDOR_DATABASE__URL": self.database_url}
            result = await asyncio.to_thread(CliRunner().invoke, cli.app, argv[1:], env=env)
            assert result.exit_code == 0, result.output
            return result.stdout
        assert argv[0] == "curl", f"the doc test cannot run {argv[0]!r}"
        self.require_checked()
        method, url, headers, body = curl_request(argv)
        parts = urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        self.last = await self.client.request(method, target, headers=headers, content=body)
        self.checked = False
        return self.last.text

    def require_checked(self) -> None:
        """A response without a documented block must be a success."""
        if not self.checked and self.last is not None:
            assert self.last.is_success, (self.last.request.url, self.last.status_code, self.last.text)
        self.checked = True

    def check(self, shown: str) -> None:
        assert self.last is not None and not self.checked, "an http block must follow a curl command"
        check_response(shown, self.last)
        self.checked = True

    async def hook(self, text: str) -> None:
        match = re.fullmatch(r"the worker suspends \$(?P<var>[A-Z_]+) on .*", text.strip())
        assert match is not None, f"unknown doc-test directive: {text}"
        await seal_run(self.service, self.variables[match["var"]], "waiting", pending=DOC_PENDING, history=DOC_HISTORY)


def events() -> list[tuple[str, str]]:
    text = DOC.read_text(encoding="utf-8")
    return [(m["lang"] or "hook", m["body"] if m["lang"] else m["hook"]) for m in EVENT.finditer(text)]


def test_the_page_has_examples() -> None:
    """Guard against a silently empty run (a renamed fence, a moved file)."""
    kinds = [kind for kind, _ in events()]
    assert kinds.count("bash") >= 8 and kinds.count("http") >= 7 and "hook" in kinds


async def test_http_api_page_runs_as_written(db: Any) -> None:
    """S-65, S-74, S-75, S-78, S-80, S-90, S-97, S-98, S-101: the page's session — bootstrap a key, create a thread,
    read a run and its messages, resume it, list, post, manage the inbox, archive — runs against the app and answers
    what the page shows."""
    settings = ServiceSettings(database={"url": db.url})
    service = Service(settings=settings, engine=db.engine, agents=agent_registry(settings))
    async with client_for(create_app(service, role="all")) as client:
        session = Session(client, service, db.url)
        curls = 0
        for kind, body in events():
            if kind == "bash":
                for command in commands_of(body):
                    curls += "curl" in command
                    await session.run(command)
            elif kind == "http":
                session.check(body)
            else:
                session.require_checked()
                await session.hook(body)
        session.require_checked()
    assert curls >= 10 and session.variables.keys() >= {"CANDOR_KEY", "RUN_ID", "THREAD_ID", "VERSION"}
