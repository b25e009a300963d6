"""A small thread-safe, fork-aware connection pool shared by the backends. Knows nothing of
SQL: it hands out connections made by the backend's factory and drops broken ones."""

from __future__ import annotations

import os
import select
import threading
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any

from tableq.errors import DatabaseError, TableqError


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
        ref = weakref.ref(self)

        def after_fork() -> None:
            pool = ref()
            if pool is not None:
                pool._after_fork()
        # A lock held by another thread at fork time would stay locked forever in the child.
        os.register_at_fork(after_in_child=after_fork)

    def _after_fork(self) -> None:
        # A forked child must never use its parent's sockets: forget them without closing
        # (closing would tell the server the parent's sessions ended).
        self._lock = threading.Lock()
        self._idle = []
        self._pid = os.getpid()

    def acquire(self) -> Any:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._connect()
            if not self._stale(conn):
                return conn
            self._discard(conn)

    def release(self, conn: Any, *, healthy: bool, pid: int) -> None:
        """Returns a connection taken by acquire() in process `pid`; an unhealthy one, or one
        carried across a fork, is closed instead of reused."""
        if healthy and pid == os.getpid() and not self._closed:
            with self._lock:
                if len(self._idle) < self._max_idle:
                    self._idle.append(conn)
                    return
        if pid == os.getpid():
            self._discard(conn)

    def connection(self, *, own: bool = False) -> Borrowed:
        """A connection for a with-block. It goes back to the pool unless the block raised a
        database error (the connection may be broken or mid-transaction) or was interrupted
        (see `interrupted`; `own`: the block runs only tableq's own statements). Any other
        exception was raised by code that used a healthy connection."""
        return Borrowed(self, own)

    def _stale(self, conn: Any) -> bool:
        """An idle connection whose socket is readable was closed by the server (restart,
        idle timeout, pg_terminate_backend): found without a round trip, so the caller gets a
        fresh connection instead of an error."""
        if self._socket_of is None:
            return False
        try:
            poller = select.poll()  # select() cannot watch descriptors >= 1024
            poller.register(self._socket_of(conn), select.POLLIN | select.POLLPRI)
            return bool(poller.poll(0))
        except (OSError, ValueError, AttributeError):
            return True

    def _discard(self, conn: Any) -> None:
        try:
            self._close(conn)
        except Exception:  # closing a broken connection may fail; it is gone either way
            pass

    def close(self) -> None:
        with self._lock:
            idle, self._idle, self._closed = self._idle, [], True
        for conn in idle:
            self._discard(conn)


class Borrowed:
    """Pool.connection()'s context manager: a class, not a generator, as every statement a
    backend runs on its own passes through it (about half the cost)."""

    __slots__ = ("conn", "own", "pid", "pool")

    def __init__(self, pool: Pool, own: bool) -> None:
        self.pool, self.own = pool, own

    def __enter__(self) -> Any:
        self.pid = os.getpid()
        self.conn = self.pool.acquire()
        return self.conn

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:
            healthy = True
        elif issubclass(kind, DatabaseError) or interrupted(kind, own=self.own):
            healthy = False
        else:
            healthy = not _is_driver_error(self.conn)
        self.pool.release(self.conn, healthy=healthy, pid=self.pid)


class Deliberate(Exception):  # noqa: N818 - a marker, not an error users see
    """Raised on purpose by tableq's own code inside a pooled block once its statements are
    complete (control flow, such as a batch ack that finds a lease lost): the connection is
    in step, so `interrupted` does not count it."""


def interrupted(kind: type[BaseException], *, own: bool) -> bool:
    """Whether an exception may have left its connection mid-statement: a result half read,
    a command still in flight. An interrupt (KeyboardInterrupt, SystemExit) can land anywhere;
    in a block that runs only tableq's own statements (`own`) so can any exception tableq did
    not raise on purpose (a value that fails to decode, a bug). Such a connection is closed,
    which rolls its transaction back, and is neither rolled back by a statement nor reused:
    PyMySQL would read the interrupted statement's result as the next one's."""
    return not issubclass(kind, Exception) or (
        own and not issubclass(kind, (TableqError, Deliberate)))


def _is_driver_error(conn: Any) -> bool:
    """A non-tableq exception leaves the connection reusable only if the driver says it is
    still open (psycopg's `closed`, PyMySQL's `open`; sqlite3 has neither and never breaks
    this way)."""
    closed = getattr(conn, "closed", None)
    if closed is None:
        return not getattr(conn, "open", True)
    return bool(closed() if callable(closed) else closed)
