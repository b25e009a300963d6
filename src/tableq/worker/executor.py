"""Runs one handler call and reports its outcome: success, error or timeout. No SQL and no
settling: settling.py decides what the outcome means for the message.

Timeouts. An `async def` handler that outruns its timeout is cancelled. A plain function
cannot be stopped from outside in Python, so with a timeout it runs in a helper thread: when
the timeout passes, the outcome is "timeout" at once (the worker nacks the message and the
slot is free again) while the helper thread runs on until the function returns; its result
is then ignored. Its late writes are not fenced, except in exactly_once mode, where its ack
fails with LeaseLost and its transaction rolls back. Handlers that may hang should use async
or time out their own I/O; in process mode (`--processes`) a worker whose handler timed out
is replaced by a fresh process once its other handlers are done."""

from __future__ import annotations

import inspect
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import asyncio

# "outage": an exactly-once transaction failed because the database or the connection to it
# did (the worker then asks the database whether the message is still held, see settling).
Status = Literal["ok", "error", "timeout", "lease_lost", "outage"]


@dataclass(frozen=True, slots=True)
class Outcome:
    status: Status
    error: str | None = None
    duration_s: float = 0.0
    value: Any = None
    exc: BaseException | None = field(default=None, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def describe(exc: BaseException) -> str:
    """The error text kept on the message: type, message and the innermost frames."""
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-3)
    text = "".join(tb).strip()
    return text[-4000:]


class Executor:
    """Calls handlers. Async handlers run on one event loop owned by this executor."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        import asyncio  # only workers with async handlers pay for it

        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                t = threading.Thread(target=loop.run_forever, name="tableq-asyncio", daemon=True)
                t.start()
                self._loop, self._loop_thread = loop, t
            return self._loop

    def close(self) -> None:
        with self._lock:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                if self._loop_thread is not None:
                    self._loop_thread.join(timeout=5)
                self._loop = None

    def run(self, fn: Callable[..., Any], arg: Any, timeout_s: float | None,
            is_async: bool | None = None) -> Outcome:
        """Calls fn(arg) (awaiting it if it is a coroutine function) within timeout_s.
        is_async: inspect.iscoroutinefunction(fn), if the caller asked once already."""
        start = time.monotonic()
        if inspect.iscoroutinefunction(fn) if is_async is None else is_async:
            import asyncio

            fut = asyncio.run_coroutine_threadsafe(_contained(fn(arg)), self._event_loop())
            # Timed out only if it has not finished: a TimeoutError the handler raised
            # itself (asyncio.wait_for, a socket) is its own failure.
            if not wait([fut], timeout_s).done:
                fut.cancel()
                return Outcome("timeout", f"timed out after {timeout_s} s (cancelled)",
                               time.monotonic() - start)
            try:
                value = fut.result()
            except BaseException as exc:  # noqa: BLE001 - the handler's failure, whatever it is
                return _failed(exc, start)
            return Outcome("ok", None, time.monotonic() - start, value)
        if timeout_s is None:
            try:
                value = fn(arg)
            except BaseException as exc:  # noqa: BLE001 - SystemExit too: the handler's failure
                return _failed(exc, start)
            result = fn_result(value, self)
            return result if result is not None else Outcome("ok", None,
                                                                  time.monotonic() - start, value)
        box: Future[Any] = Future()

        def call() -> None:
            try:
                box.set_result(fn(arg))
            except BaseException as exc:  # noqa: BLE001 - reported through the future
                box.set_exception(exc)

        threading.Thread(target=call, name="tableq-handler", daemon=True).start()
        if not wait([box], timeout_s).done:
            return Outcome("timeout", f"timed out after {timeout_s} s (the handler thread "
                           "still runs; its result will be ignored)", time.monotonic() - start)
        try:
            value = box.result()
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: the handler's failure
            return _failed(exc, start)
        return Outcome("ok", None, time.monotonic() - start, value)


def fn_result(value: Any, executor: Executor) -> Outcome | None:
    """A sync function that returned an awaitable (e.g. a lambda around a coroutine) is
    awaited on the executor's loop."""
    if value is not None and inspect.isawaitable(value):
        import asyncio

        start = time.monotonic()

        async def wait() -> Any:
            return await value

        try:
            result = asyncio.run_coroutine_threadsafe(_contained(wait()),
                                                      executor._event_loop()).result()
        except BaseException as exc:  # noqa: BLE001 - any handler exception is its failure
            return _failed(exc, start)
        return Outcome("ok", None, time.monotonic() - start, result)
    return None


class _Escaped(Exception):
    """A handler's SystemExit or KeyboardInterrupt on its way out of the event loop."""


async def _contained(coro: Any) -> Any:
    """Awaits a handler's coroutine. asyncio lets SystemExit and KeyboardInterrupt out of a
    task to stop its loop, which would leave every later async handler waiting on a dead
    loop; a handler's are its failure, so they travel as a plain exception."""
    try:
        return await coro
    except (SystemExit, KeyboardInterrupt) as exc:
        raise _Escaped() from exc


def _failed(exc: BaseException, start: float) -> Outcome:
    if isinstance(exc, _Escaped) and exc.__cause__ is not None:
        exc = exc.__cause__
    return Outcome("error", describe(exc), time.monotonic() - start, exc=exc)
