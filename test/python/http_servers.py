"""Helpers for the tests that start `etc serve` in its own process and talk
to it over HTTP on localhost."""

from __future__ import annotations

import re
import select
import subprocess
import time
import urllib.request

_LISTENING = re.compile(r"etc: listening on http://\S+:(\d+)")


def listening_port(server: subprocess.Popen, *, timeout: float = 300) -> int:
    """The port an `etc serve --port 0` process bound, read from the line it
    prints as it listens (before it loads the model): no port is picked
    before the server binds it, so two tests never race for one. The
    server's output must be a text pipe; the lines read here are kept in
    `server.lines_before_port`."""
    deadline = time.monotonic() + timeout
    lines = server.lines_before_port = []
    while True:
        left = deadline - time.monotonic()
        assert left > 0, "the server did not say where it listens:\n" + "".join(lines)
        ready, _, _ = select.select([server.stdout], [], [], min(left, 1.0))
        if not ready:
            assert server.poll() is None, "".join(lines) + server.stdout.read()
            continue
        line = server.stdout.readline()
        assert line, "the server exited before it listened:\n" + "".join(lines)
        lines.append(line)
        found = _LISTENING.search(line)
        if found:
            return int(found.group(1))


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
