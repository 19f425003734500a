"""Checks at the edge, before any route sees a request: one place for the whole `/v1` API (S-96).

Every `/v1` request passes `EdgeCheckMiddleware`, which refuses what no route could store or answer sensibly: a
non-JSON body, characters PostgreSQL or UTF-8 cannot hold, JSON too deep or not finite, duplicated headers. The
decisions are pure functions (`body_problems`, `target_problems`, `header_problems`, `media_type_ok`); the middleware
only applies them. It runs inside the body limit, so the body it parses is bounded.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import BAD_CHARACTER as _BAD_CHARACTER
from .errors import MAX_ECHO, bounded, error_response, request_id_of

__all__ = (
    "MAX_JSON_DEPTH",
    "Problem",
    "body_problems",
    "target_problems",
    "header_problems",
    "media_type_ok",
    "EdgeCheckMiddleware",
)

MAX_JSON_DEPTH: Final = 64
"""Deepest nesting of arrays and objects a request body may have (a top-level object is depth 1)."""
_MAX_PROBLEMS: Final = 20
_WRITE_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_SINGLE_HEADERS: Final = ("idempotency-key", "if-match", "authorization", "content-type")


@dataclass(frozen=True, slots=True)
class Problem:
    """One `{"field", "reason"}` of a refused request."""

    field: str
    reason: str


def _field(path: Iterable[str | int]) -> str:
    dotted = ".".join(bounded(str(part)) for part in path)
    return bounded(dotted or "body", 4 * MAX_ECHO)


def body_problems(raw: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> list[Problem]:
    """Why a JSON request body cannot be accepted (empty when it can); at most 20 problems."""
    try:
        value = json.loads(raw.decode("utf-8"))
    except RecursionError:
        return [Problem("body", "too_deep")]
    except ValueError:  # invalid UTF-8, invalid JSON, or an integer beyond Python's digit limit
        return [Problem("body", "unparsable")]
    problems: list[Problem] = []
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack and len(problems) < _MAX_PROBLEMS:
        item, path = stack.pop()
        if isinstance(item, str):
            if _BAD_CHARACTER.search(item):
                problems.append(Problem(_field(path), "invalid_character"))
        elif isinstance(item, float):
            if not math.isfinite(item):
                problems.append(Problem(_field(path), "not_finite"))
        elif isinstance(item, dict | list):
            if len(path) >= max_depth:
                problems.append(Problem(_field(path), "too_deep"))
                continue
            if isinstance(item, dict):
                children: list[tuple[Any, tuple[str | int, ...]]] = []
                for key, child in item.items():
                    if _BAD_CHARACTER.search(key):
                        problems.append(Problem(_field((*path, key)), "invalid_character"))
                    children.append((child, (*path, key)))
            else:
                children = [(child, (*path, index)) for index, child in enumerate(item)]
            stack.extend(reversed(children))
    return problems[:_MAX_PROBLEMS]


def target_problems(path: str, query_string: bytes) -> list[Problem]:
    """A NUL or lone surrogate in the (decoded) path or a query value: no id or parameter can hold one."""
    problems = [Problem("path", "invalid_character")] if _BAD_CHARACTER.search(path) else []
    query = query_string.decode("latin-1")
    for name, value in parse_qsl(query, keep_blank_values=True, errors="surrogateescape"):
        if _BAD_CHARACTER.search(name) or _BAD_CHARACTER.search(value):
            problems.append(Problem(_field((name,)), "invalid_character"))
    return problems[:_MAX_PROBLEMS]


def header_problems(headers: Iterable[tuple[bytes, bytes]]) -> list[Problem]:
    """Headers that must appear at most once but came more than once (an ambiguous key or precondition)."""
    seen: dict[str, int] = {}
    for name, _ in headers:
        lowered = name.decode("latin-1").lower()
        seen[lowered] = seen.get(lowered, 0) + 1
    return [
        Problem("-".join(word.capitalize() for word in name.split("-")), "duplicated")
        for name in _SINGLE_HEADERS
        if seen.get(name, 0) > 1
    ]


def media_type_ok(content_type: str | None) -> bool:
    """`application/json` or `application/…+json` (charset, if given, UTF-8); an absent type is read as JSON."""
    if content_type is None:
        return True
    media, _, parameters = content_type.partition(";")
    media = media.strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        return False
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return False
    return True


class EdgeCheckMiddleware:
    """Applies the checks to every `/v1` request; expects the body already buffered (`BodyLimitMiddleware` sits
    outside it). It refuses:

    * a body that is not JSON by its `Content-Type` → 415 `unsupported_media_type` (a missing type is read as JSON);
    * a JSON body with a NUL character or a lone surrogate in any string or object key (PostgreSQL cannot store NUL,
      and UTF-8 cannot encode a lone surrogate) → 400 `invalid_argument`, reason `invalid_character`;
    * nesting deeper than `MAX_JSON_DEPTH` arrays/objects → reason `too_deep`; `NaN`, `Infinity` or a number too
      large for a double (`1e400`) → reason `not_finite`; anything else that is not JSON → reason `unparsable`;
    * a NUL character or lone surrogate in the path or query string → field `path` or the query parameter's name;
    * `Idempotency-Key`, `If-Match`, `Authorization` or `Content-Type` given twice → reason `duplicated`.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", [])
        problems = header_problems(headers) or target_problems(scope["path"], scope.get("query_string", b""))
        if problems:
            await self._invalid(problems, scope, receive, send)
            return
        if scope["method"] not in _WRITE_METHODS:
            await self.app(scope, receive, send)
            return
        message = await receive()
        body = message.get("body", b"") if message["type"] == "http.request" else b""
        if body:
            content_type = next((v.decode("latin-1") for k, v in headers if k.lower() == b"content-type"), None)
            if not media_type_ok(content_type):
                response = error_response(
                    request_id_of(scope),
                    "unsupported_media_type",
                    "the request body must be JSON",
                    {"header": "Content-Type", "expected": "application/json"},
                )
                await response(scope, receive, send)
                return
            if problems := body_problems(body):
                await self._invalid(problems, scope, receive, send)
                return
        replayed: list[Message] = [message]

        async def replay() -> Message:
            return replayed.pop() if replayed else await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _invalid(problems: list[Problem], scope: Scope, receive: Receive, send: Send) -> None:
        fields = [{"field": problem.field, "reason": problem.reason} for problem in problems]
        details = {"fields": fields}
        response = error_response(request_id_of(scope), "invalid_argument", "the request is invalid", details)
        await response(scope, receive, send)
