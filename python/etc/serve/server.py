"""Running the server's app with uvicorn: the listening socket opened (and
checked) before anything slow happens, and a shutdown (Ctrl-C, SIGTERM)
that ends the requests in flight instead of waiting for them."""

from __future__ import annotations

import logging
import socket
from typing import Optional

import uvicorn

from .app import build_app

__all__ = ["Server", "listen", "run", "SHUTDOWN_SECONDS"]

logger = logging.getLogger("etc.serve")

#: How long a shutdown waits for the connections to close once their
#: requests were ended (a client that reads nothing more keeps its
#: connection open): then their tasks are cancelled.
SHUTDOWN_SECONDS = 5.0


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket listening on `host`:`port` (IPv4 or IPv6, as the host
    resolves; port 0: one the system picks). Raises ValueError for a port
    outside 0-65535 and OSError naming the address when it cannot listen
    there (in use, not this machine's, no such host)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port {port!r} is not a TCP port (0 to 65535)")
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as error:
        reason = error.strerror or str(error)
        raise OSError(error.errno, f"cannot listen on {host}:{port}: {reason}") from None


class Server(uvicorn.Server):
    """uvicorn's server for an app of `build_app`. Its shutdown first ends
    the app's requests in flight (`app.state.close`: a stream ends with an
    error event and `[DONE]`, a request not streamed with 503) and refuses
    new ones, then lets uvicorn close the connections: Ctrl-C or SIGTERM
    stops it within a step, not after the longest generation."""

    def __init__(self, app, **config):
        config.setdefault("timeout_graceful_shutdown", SHUTDOWN_SECONDS)
        super().__init__(uvicorn.Config(app, **config))
        self.app = app

    async def shutdown(self, sockets=None) -> None:
        close = getattr(self.app.state, "close", None)
        if close is not None:
            close()
        await super().shutdown(sockets=sockets)


def run(model, host: str = "127.0.0.1", port: int = 8000, *,
        served_model_name: Optional[str] = None, max_num_seqs: int = 8,
        max_model_len: Optional[int] = None, max_step_tokens: Optional[int] = None,
        speculative=None, log_level: str = "info", sock: Optional[socket.socket] = None,
        tool_call_parser: Optional[str] = None, reasoning_parser: Optional[str] = "auto") -> None:
    """Serves `model` over HTTP at `host`:`port` (or on `sock`, a socket of
    `listen`) until interrupted (Ctrl-C, SIGTERM), then returns: `build_app`
    (same options) run by a `Server`. `max_model_len` is at most what the KV
    cache holds (`GET /v1/models` says what it is)."""
    sock = sock if sock is not None else listen(host, port)
    app = build_app(model, served_model_name=served_model_name, max_num_seqs=max_num_seqs,
                    max_model_len=max_model_len, max_step_tokens=max_step_tokens,
                    speculative=speculative, tool_call_parser=tool_call_parser,
                    reasoning_parser=reasoning_parser)
    engine = app.state.engine
    logger.info("serving %s (%s): %d requests at once, sequences of up to %d tokens%s",
                app.state.model_name, model.dtype, engine.max_num_seqs, engine.max_model_len,
                " (all the KV cache holds)" if engine.limited_by_cache else "")
    try:
        Server(app, log_level=log_level).run(sockets=[sock])
    except KeyboardInterrupt:
        # uvicorn raises the signal that stopped it again once it has shut
        # down: the shutdown was the point, not an error (uvicorn.run too).
        pass
