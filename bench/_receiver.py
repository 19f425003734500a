"""A minimal, fast webhook receiver for `bench.outbox_throughput`: `python -m bench._receiver --port PORT`.

Not a benchmark itself (private module, skipped by `bench.run_all`). Plain asyncio, HTTP/1.1 with keep-alive: it
reads each request's head and `Content-Length` body, answers `204 No Content`, and counts the requests whose
`Candor-Delivery-Id` header names a delivery (every delivery id once, plus how many arrived more than once). It
prints `ready` once listening; on SIGTERM it prints one JSON line `{"requests": n, "deliveries": n,
"duplicates": n}` and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

from candor.service.outbox.webhooks import DELIVERY_ID_HEADER

RESPONSE = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"
DELIVERY_HEADER = DELIVERY_ID_HEADER.lower().encode("ascii")


class Counts:
    def __init__(self) -> None:
        self.requests = 0
        self.deliveries: set[bytes] = set()
        self.duplicates = 0

    def record(self, head: bytes) -> None:
        self.requests += 1
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == DELIVERY_HEADER:
                delivery = value.strip()
                if delivery in self.deliveries:
                    self.duplicates += 1
                self.deliveries.add(delivery)

    def as_json(self) -> str:
        return json.dumps(
            {"requests": self.requests, "deliveries": len(self.deliveries), "duplicates": self.duplicates}
        )


def content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


async def serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counts: Counts) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(content_length(head))
            counts.record(head)
            writer.write(RESPONSE)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main_async(port: int) -> None:
    counts = Counts()
    server = await asyncio.start_server(lambda r, w: serve_connection(r, w, counts), "127.0.0.1", port)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    async with server:
        await stop.wait()
    print(counts.as_json(), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._receiver", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="port on 127.0.0.1 to listen on")
    args = parser.parse_args(argv)
    asyncio.run(main_async(args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
