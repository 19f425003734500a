"""The HTTP listening socket of `candor serve`, bound before anything else starts.

A port already in use used to surface only after the process had migrated, announced "listening on …" and (role
`all`) started its worker, as uvicorn's `[Errno 98]` with the exit code of an unreachable database. Binding first
turns it into one line and its own exit code, with nothing started.
"""

from __future__ import annotations

import errno
import socket

__all__ = ("ListenError", "bind_listener", "listen_failure_reason", "split_listen")

# What uvicorn passes to listen(): the kernel clamps it to net.core.somaxconn.
_BACKLOG = 2048


class ListenError(Exception):
    """The listen address cannot be bound; `str()` is the one line the CLI prints."""

    def __init__(self, listen: str, reason: str) -> None:
        super().__init__(f"cannot listen on {listen}: {reason}")
        self.listen = listen
        self.reason = reason


def split_listen(listen: str) -> tuple[str, int]:
    """`"127.0.0.1:8080"` → `("127.0.0.1", 8080)`; `"[::1]:8080"` → `("::1", 8080)` (validated by the settings)."""
    host, _, port = listen.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


def listen_failure_reason(error: OSError) -> str:
    """A short human reason for a failed bind, the common ones by name and the rest by the OS's own words."""
    if error.errno == errno.EADDRINUSE:
        return "address already in use"
    if error.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges)"
    if error.errno == errno.EADDRNOTAVAIL:
        return "the address is not one of this machine's"
    if isinstance(error, socket.gaierror):
        return f"unknown host ({error.strerror})"
    return error.strerror or str(error)


def bind_listener(listen: str) -> socket.socket:
    """A bound, listening, non-blocking TCP socket for `listen` (`host:port`), handed to uvicorn; `ListenError`
    when the address cannot be bound. `SO_REUSEADDR` as uvicorn sets it: a restart may rebind a port whose old
    connections linger in TIME_WAIT, never one another process listens on."""
    host, port = split_listen(listen)
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ListenError(listen, listen_failure_reason(exc)) from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(_BACKLOG)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise ListenError(listen, listen_failure_reason(exc)) from exc
    return sock
