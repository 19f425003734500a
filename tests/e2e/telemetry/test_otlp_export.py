"""`candor serve` with `[telemetry]` on exports its spans over OTLP/HTTP to the endpoint of the standard
`OTEL_EXPORTER_OTLP_ENDPOINT` variable: a tiny HTTP server in the test receives the protobuf export (docs/telemetry.md;
issue 35 item 2)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from e2e.service.test_serve import free_port, wait_ready

pytestmark = pytest.mark.crash  # a real `candor serve` process

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


class _Receiver(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[tuple[str, str, ExportTraceServiceRequest]] = []


class _Handler(BaseHTTPRequestHandler):
    server: _Receiver

    def do_POST(self) -> None:  # http.server's name for the POST handler
        body = self.rfile.read(int(self.headers["Content-Length"]))
        export = ExportTraceServiceRequest()
        export.ParseFromString(body)
        self.server.requests.append((self.path, self.headers["Content-Type"], export))
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    server = _Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_serve_exports_run_attempt_and_step_spans_over_otlp_http(tmp_path: Path, receiver: _Receiver) -> None:
    """A run created with a `traceparent` against `candor serve` (SQLite default, the demo agent): the receiver
    gets protobuf exports at `/v1/traces` holding the run span (in the request's trace, under its span), the
    attempt span under it and a model-request step span, with `service.name` "candor"; the stop flushes them."""
    port = free_port()
    env = {
        **os.environ,
        "CANDOR_DATABASE__URL": f"sqlite:///{tmp_path / 'candor.db'}",
        "CANDOR_SERVER__LISTEN": f"127.0.0.1:{port}",
        "CANDOR_TELEMETRY__ENABLED": "true",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.server_address[1]}",
        "OTEL_BSP_SCHEDULE_DELAY": "600000",  # nothing leaves before the stop: the SIGTERM must flush the batch
    }
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "candor.cli"]
    process = subprocess.Popen(
        [*command, "serve"], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_ready(base, process)
        booted = subprocess.run([*command, "bootstrap"], env=env, capture_output=True, check=True, text=True)
        auth = {"Authorization": f"Bearer {json.loads(booted.stdout)['secret']}"}
        body = {"agent": "support", "input": {"content": [{"type": "text", "text": "Hi, my name is Ada"}]}}
        created = httpx.post(
            f"{base}/v1/threads",
            json=body,
            headers=auth | {"Idempotency-Key": "t", "traceparent": f"00-{TRACE}-{SPAN}-01"},
        )
        assert created.status_code == 201, created.text
        run_id = created.json()["run"]["id"]
        deadline = time.monotonic() + 30
        while httpx.get(f"{base}/v1/runs/{run_id}", headers=auth).json()["status"] != "completed":
            assert time.monotonic() < deadline, "the run did not complete"
            time.sleep(0.1)
        assert not receiver.requests  # still batched
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    assert receiver.requests, "nothing was exported"
    assert {(path, kind) for path, kind, _ in receiver.requests} == {("/v1/traces", "application/x-protobuf")}
    spans: dict[str, list[Any]] = {}
    for _, _, export in receiver.requests:
        for resource_spans in export.resource_spans:
            resource = {attr.key: attr.value.string_value for attr in resource_spans.resource.attributes}
            assert resource["service.name"] == "candor"
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.setdefault(span.name, []).append(span)
    (run,) = spans["candor.run"]
    (attempt,) = spans["candor.attempt"]
    attributes = {attr.key: attr.value.string_value for attr in run.attributes}
    assert attributes["candor.run.id"] == run_id and attributes["candor.run.status"] == "completed"
    assert (run.trace_id.hex(), run.parent_span_id.hex()) == (TRACE, SPAN)
    assert attempt.parent_span_id == run.span_id and attempt.trace_id == run.trace_id
    steps = spans["candor.step model_request"]
    assert steps and all(step.trace_id == run.trace_id for step in steps)
