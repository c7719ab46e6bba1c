"""Serving: an OpenAI-compatible HTTP server over the engine
(`etc.models.engine.Engine`) of a compiled model.

```python
import etc.models, etc.serve
model = etc.models.load("Qwen3-0.6B/")
etc.serve.run(model, "127.0.0.1", 8000, max_num_seqs=8)   # blocks; Ctrl-C stops it
```

`build_app(model, ...)` returns the FastAPI app (to run under any ASGI
server, or in tests: `app`); `run(model, host, port, ...)` runs it with
uvicorn (`server`: `listen` opens the socket, `Server` shuts down ending
the requests in flight). See docs/models.md, "The server".
"""

from .app import APIError, build_app
from .server import Server, listen, run

__all__ = ["build_app", "run", "listen", "Server", "APIError"]
