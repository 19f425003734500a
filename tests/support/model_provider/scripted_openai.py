"""A scripted local model provider speaking the OpenAI chat-completions wire format (`POST /v1/chat/completions`).

`ScriptedOpenAI(responder)` serves on 127.0.0.1 at a free port, on its own event loop in a daemon thread, so both
in-process workers and worker subprocesses reach it over real TCP. For every request `responder(request)` returns a
`Reply`; the server answers it as the OpenAI API would:

* non-streaming (`"stream": false`): one `chat.completion` JSON body (text and/or `tool_calls`, usage);
* streaming (`"stream": true`): `text/event-stream` with `data: {chat.completion.chunk}` lines (role, text split into
  `chunk_chars` pieces, tool calls as name then argument fragments, the finish reason, a usage chunk when
  `stream_options.include_usage`), then `data: [DONE]`; `chunk_delay` seconds between chunks;
* `status` ≥ 400: an OpenAI error body with that status and the reply's `headers` (e.g. `Retry-After`);
* `hang`: reads the request and never answers (until the server stops);
* `drop_after`: a streamed reply whose connection is cut after that many chunks, without `[DONE]`.

Every request is recorded (`requests`: method, path, headers, JSON body); `chunks_sent` counts streamed chunks and
`streams_finished` streamed replies sent through `[DONE]`, so tests can tell "the provider is mid-stream". Responses
carry `Connection: close`: one request per connection.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ("Reply", "ToolCall", "Request", "ScriptedOpenAI", "in_order", "tool_results")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str


@dataclass(frozen=True)
class Reply:
    """One scripted answer."""

    text: str | None = None
    tool_calls: Sequence[ToolCall] = ()
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    chunk_chars: int = 4
    chunk_delay: float = 0.0
    hang: bool = False
    drop_after: int | None = None
    usage: tuple[int, int] = (11, 7)
    """(prompt_tokens, completion_tokens)."""


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    at: float = 0.0
    """`time.monotonic()` when the request was read."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", [])) if isinstance(self.body, dict) else []


Responder = Callable[[Request], Reply]


def in_order(*replies: Reply) -> Responder:
    """A responder answering the n-th request with the n-th reply (the last one repeats)."""
    count = 0

    def respond(request: Request) -> Reply:
        nonlocal count
        count += 1
        return replies[min(count, len(replies)) - 1]

    return respond


def tool_results(request: Request) -> dict[str, str]:
    """tool_call_id → content of the `tool` messages the model was sent."""
    return {m["tool_call_id"]: m["content"] for m in request.messages if m.get("role") == "tool"}


class ScriptedOpenAI:
    """The scripted server; a context manager (`with ScriptedOpenAI(responder) as server: server.base_url`)."""

    model = "gpt-scripted"

    def __init__(self, responder: Responder) -> None:
        self.responder = responder
        self.requests: list[Request] = []
        self.chunks_sent = 0
        self.streams_finished = 0
        """Streamed replies sent through `[DONE]`."""
        self.port = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="scripted-openai", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> ScriptedOpenAI:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the scripted provider did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(10)

    def recorded(self) -> list[Request]:
        with self._lock:
            return list(self.requests)

    def wait_until(self, predicate: Callable[[ScriptedOpenAI], bool], timeout: float = 30.0) -> None:
        """Block (polling) until `predicate(self)` holds; raises TimeoutError."""
        deadline = time.monotonic() + timeout
        while not predicate(self):
            if time.monotonic() > deadline:
                raise TimeoutError("the scripted provider did not reach the expected state")
            time.sleep(0.01)

    # -- server ------------------------------------------------------------------------------------------------

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stopping.wait()
            server.close()
            for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                task.cancel()  # hanging and slow replies end with the server

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await _read_request(reader)
            if request is None:
                return
            with self._lock:
                self.requests.append(request)
            reply = self.responder(request)
            if reply.hang:
                await asyncio.Event().wait()
            if reply.status >= 400:
                await _send_json(writer, reply.status, _error_body(reply.status), reply.headers)
            elif isinstance(request.body, dict) and request.body.get("stream"):
                await self._stream(writer, reply, request.body)
            else:
                await _send_json(writer, 200, _completion(reply, self.model), reply.headers)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away (a killed worker, a client-side timeout)
        finally:
            writer.close()

    async def _stream(self, writer: asyncio.StreamWriter, reply: Reply, body: dict[str, Any]) -> None:
        head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n"
        head += "Transfer-Encoding: chunked\r\n"  # as OpenAI: a cut connection is a truncated body, not an end
        head += "".join(f"{name}: {value}\r\n" for name, value in reply.headers.items())
        writer.write((head + "\r\n").encode())
        await writer.drain()
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        for number, chunk in enumerate(_chunks(reply, self.model, include_usage=include_usage)):
            if reply.drop_after is not None and number >= reply.drop_after:
                writer.transport.abort()  # cut mid-stream: no [DONE]
                return
            if number and reply.chunk_delay:
                await asyncio.sleep(reply.chunk_delay)
            await _send_chunk(writer, f"data: {json.dumps(chunk)}\n\n".encode())
            with self._lock:
                self.chunks_sent += 1
        await _send_chunk(writer, b"data: [DONE]\n\n")
        await _send_chunk(writer, b"")  # the last chunk of the chunked body
        with self._lock:
            self.streams_finished += 1


async def _read_request(reader: asyncio.StreamReader) -> Request | None:
    line = await reader.readline()
    if not line:
        return None
    method, path, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    raw = await reader.readexactly(int(headers.get("content-length", "0")))
    body = json.loads(raw) if raw else None
    return Request(method=method, path=path, headers=headers, body=body, at=time.monotonic())


async def _send_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()


async def _send_json(writer: asyncio.StreamWriter, status: int, body: Any, headers: dict[str, str]) -> None:
    data = json.dumps(body).encode()
    head = f"HTTP/1.1 {status} Scripted\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    head += "Connection: close\r\n" + "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    writer.write((head + "\r\n").encode() + data)
    await writer.drain()


def _error_body(status: int) -> dict[str, Any]:
    kind = "rate_limit_exceeded" if status == 429 else "server_error"
    return {"error": {"message": f"scripted {status}", "type": kind, "param": None, "code": kind}}


def _usage(reply: Reply) -> dict[str, int]:
    prompt, completion = reply.usage
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _finish_reason(reply: Reply) -> str:
    return "tool_calls" if reply.tool_calls else "stop"


def _completion(reply: Reply, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for c in reply.tool_calls
        ]
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish_reason(reply), "logprobs": None}],
        "usage": _usage(reply),
    }


def _chunks(reply: Reply, model: str, *, include_usage: bool) -> list[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-scripted",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }

    chunks = [chunk({"role": "assistant", "content": ""})]
    text = reply.text or ""
    chunks += [chunk({"content": text[i : i + reply.chunk_chars]}) for i in range(0, len(text), reply.chunk_chars)]
    for index, call in enumerate(reply.tool_calls):
        start = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        chunks.append(chunk({"tool_calls": [start]}))
        arguments = json.dumps(call.arguments)
        for i in range(0, len(arguments), reply.chunk_chars):
            piece = {"index": index, "function": {"arguments": arguments[i : i + reply.chunk_chars]}}
            chunks.append(chunk({"tool_calls": [piece]}))
    chunks.append(chunk({}, _finish_reason(reply)))
    if include_usage:
        chunks.append({**chunk({}), "choices": [], "usage": _usage(reply)})
    return chunks
