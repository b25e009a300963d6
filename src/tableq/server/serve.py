"""Running the app with uvicorn: in the foreground (`tableq serve`) or on a background
thread with a free port (tests, benchmarks, notebooks)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

STARTUP_TIMEOUT_S = 30.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def config(app: Any, host: str, port: int, **options: Any) -> uvicorn.Config:
    # The app's own log lines say what happened; uvicorn's access log would double them.
    options.setdefault("access_log", False)
    options.setdefault("log_level", "warning")
    # Long polls last up to 20 s: give them time to end on shutdown.
    options.setdefault("timeout_graceful_shutdown", 25)
    # Workers and clients keep connections between polls; uvicorn's default is 5 s.
    options.setdefault("timeout_keep_alive", 75)
    return uvicorn.Config(app, host=host, port=port, **options)


def foreground(app: Any, host: str, port: int, **options: Any) -> None:
    """Serves `app` until interrupted (`tableq serve`)."""
    uvicorn.Server(config(app, host, port, **options)).run()


@contextmanager
def background(app: Any, host: str = "127.0.0.1", port: int | None = None,
               **options: Any) -> Iterator[str]:
    """Serves `app` on a thread until the block ends; yields its base URL."""
    port = port or free_port(host)
    server = uvicorn.Server(config(app, host, port, **options))
    thread = threading.Thread(target=server.run, name="tableq-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the tableq server did not start on {host}:{port}")
        time.sleep(0.01)  # polling uvicorn's own started flag: it has no event to wait on
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
