"""Every ```python block of the user docs runs as written.

Blocks come from docs/state-and-resume.md, docs/human-in-the-loop.md and README.md. Each block is self-contained and
runs in a fresh namespace; top-level `await` (and `async with` / `async for`) is allowed, as in `python -m asyncio`.
Tracebacks point at the block's line in the Markdown file.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCS = {
    "docs/state-and-resume.md": 5,  # minimum number of runnable blocks expected in each file
    "docs/human-in-the-loop.md": 4,
    "README.md": 1,
}
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def python_blocks(relative: str) -> list[tuple[int, str]]:
    """(first line number, source) of every ```python block in the file."""
    path = ROOT / relative
    if not path.exists():
        return []  # reported by test_docs_have_runnable_examples, without breaking collection
    text = path.read_text(encoding="utf-8")
    return [(text.count("\n", 0, match.start(1)) + 1, match.group(1)) for match in FENCE.finditer(text)]


def run_block(relative: str, line: int, source: str) -> None:
    # Pad so that line numbers in tracebacks are the Markdown file's own.
    code = compile("\n" * (line - 1) + source, str(ROOT / relative), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    namespace: dict[str, object] = {"__name__": "__doc_example__"}
    outcome = eval(code, namespace)  # executing our own documentation
    if inspect.iscoroutine(outcome):
        asyncio.run(outcome)


CASES = [(doc, line, source) for doc in DOCS for line, source in python_blocks(doc)]


@pytest.mark.parametrize("doc", list(DOCS))
def test_docs_have_runnable_examples(doc: str) -> None:
    """Guard against a silently empty parametrization (a renamed fence, a moved file)."""
    assert (ROOT / doc).exists(), doc
    assert len(python_blocks(doc)) >= DOCS[doc]


@pytest.mark.parametrize(("doc", "line", "source"), CASES, ids=[f"{doc}:{line}" for doc, line, _ in CASES])
def test_doc_example_runs(doc: str, line: int, source: str) -> None:
    run_block(doc, line, source)
