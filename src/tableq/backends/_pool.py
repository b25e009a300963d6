"""A small thread-safe, fork-aware connection pool shared by the backends. Knows nothing of
SQL: it hands out connections made by the backend's factory and drops broken ones."""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class Pool:
    def __init__(
        self,
        connect: Callable[[], Any],
        close: Callable[[Any], None],
        *,
        max_idle: int = 32,
        socket_of: Callable[[Any], int] | None = None,
    ) -> None:
        self._connect, self._close = connect, close
        self._socket_of = socket_of
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._max_idle = max_idle
        self._closed = False

    def _check_fork(self) -> None:
        # A forked child must never use its parent's sockets: forget them without closing.
        if os.getpid() != self._pid:
            with self._lock:
                self._idle = []
                self._pid = os.getpid()

    @contextmanager
    def connection(self) -> Iterator[Any]:
        self._check_fork()
        conn = None
        while conn is None:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = self._connect()
            elif self._stale(conn):
                self._discard(conn)
                conn = None
        healthy = False
        try:
            yield conn
            healthy = True
        finally:
            if healthy and not self._closed:
                with self._lock:
                    if len(self._idle) < self._max_idle:
                        self._idle.append(conn)
                        conn = None
            if conn is not None:
                self._discard(conn)

    def _stale(self, conn: Any) -> bool:
        """An idle connection whose socket is readable was closed by the server (restart,
        idle timeout, pg_terminate_backend): found without a round trip, so the caller gets a
        fresh connection instead of an error."""
        if self._socket_of is None:
            return False
        try:
            readable, _, _ = select.select([self._socket_of(conn)], [], [], 0)
        except (OSError, ValueError, AttributeError):
            return True
        return bool(readable)

    def _discard(self, conn: Any) -> None:
        try:
            self._close(conn)
        except Exception:  # closing a broken connection may fail; it is gone either way
            pass

    def close(self) -> None:
        self._check_fork()
        with self._lock:
            idle, self._idle, self._closed = self._idle, [], True
        for conn in idle:
            self._discard(conn)
