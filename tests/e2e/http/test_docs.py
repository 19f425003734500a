"""docs/http-api.md and README's service snippet run as written: pasted into bash against a real `candor serve`.

The test starts `candor serve` with its defaults in an empty directory (SQLite `candor.db`, the scripted demo agent
`support`; only the port differs, a free one, substituted for `127.0.0.1:8080` in the commands), then runs every
```bash block of the page, in order, as one bash script with `set -euo pipefail`. An ```http block after a command
block is the response the page promises for the last `curl -i` of that block: its status line, the headers it
shows (an `ETag` must also look like one) and the shape of its JSON body (the same keys, recursively; values
may differ) must match the real one. Rules: S-65, S-69, S-74, S-78, S-80, S-90, S-97, S-98, S-101.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.service.test_serve import free_port, wait_ready

pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "http-api.md"
README = ROOT / "README.md"
FENCE = re.compile(r"^```(?P<lang>bash|http|sh)[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
END = "@@block-end@@"


def blocks(path: Path, langs: tuple[str, ...] = ("bash", "http")) -> list[tuple[str, str]]:
    return [(m["lang"], m["body"]) for m in FENCE.finditer(path.read_text(encoding="utf-8")) if m["lang"] in langs]


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


def last_response(output: str) -> tuple[int, dict[str, str], str]:
    """(status, headers, body) of the last `curl -i` answer in a block's output."""
    start = output.rfind("HTTP/1.1 ")
    assert start >= 0, f"the block printed no HTTP response:\n{output}"
    head, _, body = output[start:].replace("\r\n", "\n").partition("\n\n")
    status_line, *header_lines = head.splitlines()
    headers = {name.strip().lower(): value.strip() for name, _, value in (h.partition(":") for h in header_lines)}
    return int(status_line.split()[1]), headers, body.strip()


def check_response(shown: str, output: str) -> None:
    status, headers, body = last_response(output)
    head, _, shown_body = shown.partition("\n\n")
    status_line, *header_lines = head.strip().splitlines()
    assert int(status_line.split()[1]) == status, (status_line, body)
    for line in header_lines:
        name = line.partition(":")[0].strip().lower()
        assert name in headers, (name, headers)
        if name == "etag":
            assert re.fullmatch(r'"[a-z]+_[0-9a-f]{32}:\d+"', headers["etag"]), headers["etag"]
    if shown_body.strip():
        same_shape(json.loads(shown_body.replace("…", "")), json.loads(body))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str], int]]:
    """`candor serve` with defaults in `tmp_path` (only the port is chosen); the env a pasted session runs in."""
    port = free_port()
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
        "CANDOR_SERVER__LISTEN": f"127.0.0.1:{port}",
    }
    env = {name: value for name, value in env.items() if name != "CANDOR_DATABASE__URL"}
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "candor.cli", "serve"], env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}", process)
        yield tmp_path, env, port
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def run_session(commands: list[str], cwd: Path, env: dict[str, str], port: int) -> list[str]:
    """Run the blocks as one bash script; the output of each block."""
    script = "set -euo pipefail\n" + "".join(f"{block}\necho\necho {END}\n" for block in commands)
    script = script.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
    script = script.replace(".venv/bin/candor", "candor")  # the checkout's venv is the test's: on PATH
    result = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout.split(END + "\n")


def _readme_service_lines() -> list[str]:
    """README's service snippet without its `candor serve &` line (the fixture runs the server)."""
    (snippet,) = [body for _, body in blocks(README, ("sh",)) if "candor serve" in body]
    return [line for line in snippet.splitlines() if "candor serve" not in line]


@pytest.mark.parametrize("after_readme", [False, True], ids=["fresh-database", "after-readme"])
def test_http_api_page_runs_when_pasted_into_bash(served: tuple[Path, dict[str, str], int], after_readme: bool) -> None:
    """The page's session — get a key, start a thread, wait for the approval, manage the queued inbox, resume,
    list, archive — pasted into bash against `candor serve` answers what the page shows: on a fresh database, and
    (issue 35) in the shell of a reader who ran the README's snippet first, whose bootstrap already happened."""
    cwd, env, port = served
    page = blocks(DOC)
    commands = [body for lang, body in page if lang == "bash"]
    assert len(commands) >= 8 and sum(lang == "http" for lang, _ in page) >= 7
    if after_readme:
        outputs = run_session(["\n".join(_readme_service_lines()), *commands], cwd, env, port)[1:]
    else:
        outputs = run_session(commands, cwd, env, port)
    position = -1
    for lang, body in page:
        if lang == "bash":
            position += 1
        else:
            check_response(body, outputs[position])


def test_readme_service_snippet_runs_when_pasted_into_bash(served: tuple[Path, dict[str, str], int]) -> None:
    """README's service snippet (without its first line, `candor serve &`, which the fixture runs) creates a
    thread: 201."""
    cwd, env, port = served
    output = run_session(["\n".join(_readme_service_lines())], cwd, env, port)[0]
    assert '"thread"' in output and '"run"' in output, output


def test_an_empty_key_stops_the_page_with_a_message(served: tuple[Path, dict[str, str], int]) -> None:
    """Issue 35: when bootstrap refuses (a workspace exists) and no `$SECRET` is at hand, the page's key block
    stops with a message instead of leaving `CANDOR_KEY` empty for 401s later."""
    cwd, env, _ = served
    subprocess.run([sys.executable, "-m", "candor.cli", "bootstrap"], env=env, cwd=cwd, check=True, capture_output=True)
    key_block = next(body for lang, body in blocks(DOC) if lang == "bash")
    script = key_block.replace(".venv/bin/candor", "candor")
    result = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "CANDOR_KEY: is empty: a workspace exists already" in result.stderr
