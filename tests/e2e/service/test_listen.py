"""`candor serve` binds its listen address before anything else starts (§3.3, §10.1; issue 35)."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from candor.cli import EXIT_CANNOT_LISTEN, EXIT_DATABASE_UNREACHABLE
from candor.service.listen import ListenError, bind_listener, listen_failure_reason, split_listen


@pytest.mark.parametrize(
    ("listen", "expected"),
    [("127.0.0.1:8080", ("127.0.0.1", 8080)), ("[::1]:9", ("::1", 9)), ("localhost:65535", ("localhost", 65535))],
)
def test_split_listen(listen: str, expected: tuple[str, int]) -> None:
    """§10.1: `server.listen` is `host:port`, an IPv6 host in brackets."""
    assert split_listen(listen) == expected


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (OSError(errno.EADDRINUSE, "Address already in use"), "address already in use"),
        (OSError(errno.EACCES, "Permission denied"), "permission denied (ports below 1024 need privileges)"),
        (OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"), "the address is not one of this machine's"),
        (OSError(errno.ENOBUFS, "No buffer space available"), "No buffer space available"),
    ],
)
def test_listen_failure_reason(error: OSError, reason: str) -> None:
    """§10.1: the common bind failures by name, the rest in the OS's words."""
    assert listen_failure_reason(error) == reason


def test_bind_listener_refuses_a_port_in_use_and_binds_a_free_one() -> None:
    """§10.1: a second bind of a listening port is a ListenError naming the address; a free port listens."""
    first = bind_listener("127.0.0.1:0")
    try:
        port = first.getsockname()[1]
        with pytest.raises(ListenError) as refused:
            bind_listener(f"127.0.0.1:{port}")
        assert str(refused.value) == f"cannot listen on 127.0.0.1:{port}: address already in use"
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # the first socket is really listening
    finally:
        first.close()


@pytest.mark.crash
@pytest.mark.parametrize("role", ["all", "worker"])
def test_serve_on_a_port_in_use_says_so_in_one_line_and_starts_nothing(tmp_path: Path, role: str) -> None:
    """S-122, §10.1 (issue 35): `candor serve` on a port in use prints one line and exits with its own code (4,
    not 3 = database unreachable), before migrating or starting a worker: the database file is never created,
    whatever the role."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        database = tmp_path / "candor.db"
        env = {
            **os.environ,
            "CANDOR_DATABASE__URL": f"sqlite:///{database}",
            "CANDOR_SERVER__LISTEN": f"127.0.0.1:{port}",
        }
        result = subprocess.run(
            [sys.executable, "-m", "candor.cli", "serve", "--role", role],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert EXIT_CANNOT_LISTEN not in (0, EXIT_DATABASE_UNREACHABLE)
    assert result.returncode == EXIT_CANNOT_LISTEN, result.stderr
    assert result.stderr.strip().splitlines() == [f"candor: cannot listen on 127.0.0.1:{port}: address already in use"]
    assert result.stdout == ""
    assert not database.exists()
