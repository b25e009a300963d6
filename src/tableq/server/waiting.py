"""Where long polls wait for messages without holding a database connection. On PostgreSQL
one listener thread (one LISTEN connection for the whole server) wakes the waiters of a topic
as soon as a NOTIFY names it; everywhere, a send through this server wakes its topic's waiters
at once, and waiters poll again with a short backoff (delayed messages and expired leases send
no notification). No SQL: the listener comes from the Queue."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from tableq.errors import TableqError
from tableq.names import ANY_TOPIC

log = logging.getLogger("tableq.server")
POLL_FIRST_S = 0.02
POLL_MAX_S = 1.0  # waits between polls grow to this; a NOTIFY ends any wait at once
LISTEN_SLICE_S = 0.5
LISTEN_RETRY_S = 5.0


def next_poll_delay(previous_s: float) -> float:
    """The pure backoff between empty receives of one long poll."""
    return POLL_FIRST_S if previous_s <= 0 else min(POLL_MAX_S, previous_s * 2)


class Waiter:
    """Wakes long polls. Create it inside the event loop (app startup); close() at shutdown."""

    def __init__(self, make_listener: Callable[[], Any] | None) -> None:
        self._loop = asyncio.get_running_loop()
        self._waiting: dict[str, set[asyncio.Event]] = {}
        self._arrived = threading.Event()  # a long poll began to wait
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.listening = False
        if make_listener is not None:
            self._thread = threading.Thread(target=self._listen, args=(make_listener,),
                                            name="tableq-server-listen", daemon=True)
            self._thread.start()

    def wake(self, topics: Any) -> None:
        """Ends the waits of these topics' long polls (ANY_TOPIC: all of them; call in the
        event loop)."""
        if ANY_TOPIC in topics:
            topics = list(self._waiting)
        for topic in topics:
            for event in self._waiting.get(topic, ()):
                event.set()

    async def wait(self, topic: str, timeout_s: float) -> bool:
        """Sleeps up to timeout_s; True when woken for `topic` before that."""
        event = asyncio.Event()
        self._waiting.setdefault(topic, set()).add(event)
        self._arrived.set()
        try:
            await asyncio.wait_for(event.wait(), timeout=max(0.0, timeout_s))
            return True
        except TimeoutError:
            return False
        finally:
            waiters = self._waiting.get(topic)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiting[topic]

    def _listen(self, make_listener: Callable[[], Any]) -> None:
        listener = None
        while not self._stop.is_set():
            if listener is None:
                try:
                    listener = make_listener()
                except TableqError as exc:
                    log.warning("tableq.server.listener_unavailable error=%s",
                                str(exc).splitlines()[0])
                if listener is None:
                    self.listening = False
                    self._stop.wait(LISTEN_RETRY_S)
                    continue
                self.listening = True
            try:
                if not self._waiting:
                    # No long poll waits: sends need not notify (PostgreSQL) until one does.
                    listener.pause()
                    self._arrived.wait(LISTEN_SLICE_S)
                    self._arrived.clear()
                    continue
                topics = listener.wait(LISTEN_SLICE_S)
            except Exception as exc:  # noqa: BLE001 - a hint source may fail in any way
                log.warning("tableq.server.listener_lost error=%s retry_in_s=%s",
                            str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                            LISTEN_RETRY_S)
                _close(listener)
                listener, self.listening = None, False
                self._stop.wait(LISTEN_RETRY_S)
                continue
            if topics and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self.wake, topics)
        if listener is not None:
            _close(listener)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=LISTEN_SLICE_S * 4)


def _close(listener: Any) -> None:
    try:
        listener.close()
    except Exception:  # noqa: BLE001 - closing a broken connection may fail too
        pass


class Deadline:
    """A long poll's time budget, by the monotonic clock."""

    def __init__(self, wait_s: float) -> None:
        self.end = time.monotonic() + wait_s

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())
