"""Every ```python block of docs/client.md runs as written against a real `candor serve` with the scripted
approvals agent (`CANDOR_URL`, `CANDOR_KEY` set), so the client's documentation stays true."""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.crash  # a real server process

DOC = Path(__file__).resolve().parents[3] / "docs" / "client.md"
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def test_client_doc_examples_run(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CANDOR_URL", server.base_url)
    monkeypatch.setenv("CANDOR_KEY", server.secret)
    text = DOC.read_text(encoding="utf-8")
    blocks = [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in FENCE.finditer(text)]
    assert len(blocks) >= 5
    for line, source in blocks:
        code = compile("\n" * (line - 1) + source, str(DOC), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        outcome = eval(code, {"__name__": "__doc_example__"})  # our own documentation
        if inspect.iscoroutine(outcome):
            asyncio.run(outcome)
