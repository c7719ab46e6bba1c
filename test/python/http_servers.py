"""Helpers for the tests that start `etc serve` in its own process and talk
to it over HTTP on localhost."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_healthy(server: subprocess.Popen, port: int, *, timeout: float = 300,
                       poll: float = 0.5) -> None:
    """Polls the server's /health until it answers. Fails with the server's
    output if it exits first, and after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        assert server.poll() is None, server.stdout.read()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(poll)
