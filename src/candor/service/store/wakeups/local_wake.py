"""Cross-process wake-ups for SQLite (§2.2): unix datagram sockets in a directory next to the database file.

Each worker process binds a socket in `<database file>.wake/` (mode 0700); a process that made a run due sends one
empty datagram to every socket there. Sending never blocks: a full buffer means a wake-up is pending already, and a
socket nobody reads is removed. A wake-up is only an optimisation: workers still scan every `worker.scan_seconds`.
When the path would exceed the unix socket limit, the directory is `<temp dir>/candor-wake-<hash of the database
path>` instead, the same for every process.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ("LocalWakeups", "wake_directory")

log = logging.getLogger("candor.notify")

_SOCKET_PATH_LIMIT = 100
"""Below the kernel's `sun_path` size (108 bytes, minus room for the socket's own name)."""
_SUFFIX = ".sock"


def wake_directory(database_path: str) -> Path:
    """Where the wake-up sockets for the SQLite database at `database_path` live (see the module docstring)."""
    real = os.path.realpath(database_path)
    beside = Path(real + ".wake")
    if len(str(beside)) + 40 <= _SOCKET_PATH_LIMIT:
        return beside
    digest = hashlib.sha256(real.encode()).hexdigest()[:24]
    return Path(tempfile.gettempdir()) / f"candor-wake-{digest}"


class LocalWakeups:
    """Send to and receive from the wake-up directory of one SQLite database."""

    def __init__(self, database_path: str) -> None:
        self.directory = wake_directory(database_path)
        self._sender: socket.socket | None = None

    def notify(self) -> None:
        """One datagram to every listening socket in the directory; never blocks, never raises."""
        try:
            names = [entry.path for entry in os.scandir(self.directory) if entry.name.endswith(_SUFFIX)]
        except OSError:
            return  # no directory: nobody listens
        if self._sender is None:
            self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sender.setblocking(False)
        for path in names:
            try:
                self._sender.sendto(b"", path)
            except BlockingIOError:
                pass  # its buffer is full: a wake-up is pending there already
            except OSError as exc:
                if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                    with contextlib.suppress(OSError):
                        os.unlink(path)  # its process is gone (or the socket went away meanwhile)
                else:
                    log.debug("Wake-up not sent", extra={"error_type": type(exc).__name__})

    def close(self) -> None:
        if self._sender is not None:
            self._sender.close()
            self._sender = None

    async def listen(self, on_wake: Callable[[], None], on_ready: Callable[[], None] = lambda: None) -> None:
        """Bind this process's socket, call `on_ready()`, then `on_wake()` per datagram until cancelled; the socket
        is removed at the end. Raises `OSError` when the directory or the socket cannot be made."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.directory / f"{os.getpid()}-{os.urandom(6).hex()}{_SUFFIX}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()

        def readable() -> None:
            with contextlib.suppress(BlockingIOError, InterruptedError):
                while True:
                    sock.recv(16)
            on_wake()

        try:
            sock.bind(str(path))
            loop.add_reader(sock.fileno(), readable)
            on_ready()
            try:
                on_wake()  # a wake-up may have been sent before we were listening: scan once now
                await asyncio.Event().wait()
            finally:
                loop.remove_reader(sock.fileno())
        finally:
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
