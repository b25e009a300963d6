"""tableq.client.Client: the Queue's methods over the HTTP API of `tableq serve`, for
processes that hold a token instead of database credentials (`tableq worker --api URL`).
Standard library only (http.client, one keep-alive connection per thread).

Retries: a kept-alive connection that the server has closed while it sat idle is seen before
it is used (its socket reads end-of-file) and replaced. A call that fails on its way out (the
request not written whole) is tried again on a fresh connection. A call whose reply is lost
after the request went out is tried again only when doing it twice does what doing it once
does: reads, sends (they carry an Idempotency-Key), heartbeats. Anything else raises
ServerUnavailable saying it may have taken effect: a retried at-most-once receive would take
(and lose) a second batch, and a retried ack would report an acked message as a LeaseLost."""

from __future__ import annotations

import base64
import http.client
import json
import select
import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

from tableq.errors import (
    AuthenticationFailed,
    ConfigurationError,
    DatabaseUnavailable,
    DuplicateMessage,
    InvalidArgument,
    LeaseLost,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    RemoteError,
    ServerUnavailable,
    TableqError,
)
from tableq.message import DeadLetter, Message, OnDuplicate, ReceiveMode, SendResult, Settler
from tableq.names import check_reason, check_where
from tableq.stats import TopicStats

P = TypeVar("P")
SEND_ATTEMPTS = 3
DEFAULT_TIMEOUT_S = 60.0
GATEWAY_DOWN = (502, 503, 504)  # what a proxy answers while the server behind it is down


def _seconds(value: float | timedelta | None) -> float | None:
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value


def _at(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _when(value: str) -> datetime:
    """A time the API always gives (created_at, a lease's expiry)."""
    return datetime.fromisoformat(value)


def _payload(value: Any) -> dict[str, Any]:
    if isinstance(value, (bytes, bytearray)):
        return {"payload_base64": base64.b64encode(bytes(value)).decode("ascii")}
    return {"payload": value}


def _closed_by_peer(sock: Any) -> bool:
    """Whether an idle kept-alive socket has something to read: end-of-file (the server
    closed it) or bytes no request asked for; either way it is not fit for the next call.
    poll() where there is one: select() refuses descriptors from 1024 on."""
    try:
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            return bool(poller.poll(0))
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _item(payload: Any, **options: Any) -> dict[str, Any]:
    return {**_payload(payload), **{k: v for k, v in options.items() if v is not None}}


class Client:
    """A queue reached through `tableq serve` at `base_url` with an access token."""

    def __init__(self, base_url: str, token: str, *, timeout: float = DEFAULT_TIMEOUT_S,
                 max_attempts: int = 5, visibility_timeout: float = 30.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(f"the API URL must be http(s)://host:port, not {base_url!r}")
        if not token:
            raise ConfigurationError("a token is needed: pass one from `tableq token create`")
        self.base_url = base_url.rstrip("/")
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self._prefix = parts.path.rstrip("/")
        self._token = token
        self._timeout = timeout
        self._local = threading.local()
        self.max_attempts = max_attempts
        self.visibility_timeout_s = float(visibility_timeout)
        self.dialect = "http"

    def __repr__(self) -> str:
        return f"<tableq.client.Client {self.base_url}>"

    @property
    def where(self) -> str:
        """Where the client points (as Queue.where): the server's base URL."""
        return self.base_url

    # --- transport ----------------------------------------------------------------------------

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and conn.sock is not None and _closed_by_peer(conn.sock):
            self._drop()  # the server ended the kept-alive connection while it sat idle
            conn = None
        if conn is None:
            cls = (http.client.HTTPSConnection if self._scheme == "https"
                   else http.client.HTTPConnection)
            conn = cls(self._host, self._port, timeout=self._timeout)
            self._local.conn = conn
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
        self._local.used = 0

    def call(self, method: str, path: str, body: Any = None, *,
             headers: Mapping[str, str] | None = None, retries: int = 1,
             idempotent: bool | None = None, timeout: float | None = None) -> Any:
        """One API call; returns the decoded JSON body or raises the matching tableq error.

        `retries` is how many times a call may be tried in all; `idempotent` (by default:
        reads, and calls given more than one try) says whether a call whose reply was lost
        may be sent again; one that is not raises ServerUnavailable instead."""
        data = json.dumps(body).encode() if body is not None else None
        hdrs = {"Authorization": f"Bearer {self._token}", "Accept": "application/json",
                **(headers or {})}
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        if idempotent is None:
            idempotent = method == "GET" or retries > 1
        last: Exception | None = None
        attempt = 0
        while attempt < retries:
            attempt += 1
            conn = self._conn()
            reused = getattr(self._local, "used", 0) > 0
            if timeout is not None:
                conn.timeout = timeout
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
            sent = False
            try:
                conn.request(method, self._prefix + path, body=data, headers=hdrs)
                sent = True
                resp = conn.getresponse()
                raw = resp.read()
                status = resp.status
                self._local.used = getattr(self._local, "used", 0) + 1
                if (resp.getheader("connection") or "").lower() == "close":
                    self._drop()
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                last = exc
                if sent and not idempotent:
                    raise ServerUnavailable(
                        self.base_url, f"{type(exc).__name__}: {exc} after {method} {path} "
                        "was sent, so it may have taken effect; it is not sent twice (look at "
                        "what it would have changed before doing it again)") from exc
                if reused and isinstance(exc, (http.client.RemoteDisconnected,
                                               ConnectionResetError, BrokenPipeError)):
                    # A kept-alive connection that failed at once: one more try on a fresh
                    # connection, beyond the call's own tries.
                    attempt -= 1
                    reused = False
                continue
            finally:
                conn_now = getattr(self._local, "conn", None)
                if timeout is not None and conn_now is not None:
                    conn_now.timeout = self._timeout
                    if conn_now.sock is not None:
                        conn_now.sock.settimeout(self._timeout)
            return self._decode(status, raw)
        raise ServerUnavailable(self.base_url, f"{type(last).__name__}: {last}")

    def _decode(self, status: int, raw: bytes) -> Any:
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        if 200 <= status < 300:
            if body is None and raw:
                raise RemoteError(status, "HTTPError", "the reply was not JSON: "
                                  + raw[:200].decode("utf-8", "replace"))
            return body
        error = (body or {}).get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict):
            if status in GATEWAY_DOWN:  # a proxy in front of the server, not tableq itself
                raise ServerUnavailable(self.base_url, f"HTTP {status} from a gateway")
            raise RemoteError(status, "HTTPError", raw[:200].decode("utf-8", "replace"))
        raise _error(status, error, self.base_url)

    # --- sending ------------------------------------------------------------------------------

    @staticmethod
    def _topic(topic: str) -> str:
        return quote(topic, safe="")

    def send(self, topic: str, payload: Any, *, key: str | None = None,
             kind: str | None = None, headers: Mapping[str, str] | None = None,
             priority: int = 0, delay: float | timedelta | None = None,
             at: datetime | None = None, on_duplicate: OnDuplicate = "ignore",
             idempotency_key: str | None = None, connection: None = None) -> SendResult:
        """Like Queue.send. `connection` is there for the Queue's signature only: the outbox
        (a send in the caller's own transaction) needs the database, not the HTTP API."""
        if connection is not None:
            raise InvalidArgument("send(connection=...) needs a Queue on the database; the "
                                  "HTTP client cannot join the caller's transaction")
        body = _item(payload, key=key, kind=kind, headers=dict(headers) if headers else None,
                     priority=priority or None, delay=_seconds(delay), at=_at(at))
        body["on_duplicate"] = on_duplicate
        out = self.call("POST", f"/v1/topics/{self._topic(topic)}/messages", body,
                        headers={"Idempotency-Key": idempotency_key or uuid.uuid4().hex},
                        retries=SEND_ATTEMPTS)
        return SendResult(out["id"], out["status"], out.get("key"))

    def send_many(self, topic: str, items: Iterable[Any], *, kind: str | None = None,
                  headers: Mapping[str, str] | None = None, priority: int = 0,
                  delay: float | timedelta | None = None, at: datetime | None = None,
                  on_duplicate: OnDuplicate = "ignore",
                  idempotency_key: str | None = None) -> list[SendResult]:
        defaults = {"kind": kind, "headers": dict(headers) if headers else None,
                    "priority": priority or None, "delay": _seconds(delay), "at": _at(at)}
        messages = []
        for item in items:
            if isinstance(item, Mapping) and "payload" in item:
                extra = {k: (_at(v) if k == "at" else _seconds(v) if k == "delay" else v)
                         for k, v in item.items() if k != "payload"}
                messages.append(_item(item["payload"], **{**defaults, **extra}))
            else:
                messages.append(_item(item, **defaults))
        if not messages:
            return []
        out = self.call("POST", f"/v1/topics/{self._topic(topic)}/messages",
                        {"messages": messages, "on_duplicate": on_duplicate},
                        headers={"Idempotency-Key": idempotency_key or uuid.uuid4().hex},
                        retries=SEND_ATTEMPTS)
        return [SendResult(r["id"], r["status"], r.get("key")) for r in out["results"]]

    # --- receiving and settling -----------------------------------------------------------------

    def receive(self, topic: str, *, max: int = 1,
                visibility_timeout: float | timedelta | None = None,
                where: Mapping[str, Any] | None = None, mode: ReceiveMode = "at_least_once",
                max_attempts: int | None = None, wait: float = 0.0) -> list[Message]:
        """Like Queue.receive; `wait` > 0 long-polls up to that many seconds (at most 20)."""
        body: dict[str, Any] = {"max": max, "mode": mode, "wait_s": wait}
        vt = _seconds(visibility_timeout)
        body["visibility_timeout"] = self.visibility_timeout_s if vt is None else vt
        if max_attempts is not None:
            body["max_attempts"] = max_attempts
        if where:
            body["where"] = _where(where)
        out = self.call("POST", f"/v1/topics/{self._topic(topic)}/receive", body,
                        timeout=self._timeout + wait)
        return [self._message(m) for m in out["messages"]]

    # --- what a worker running over HTTP needs (tableq worker --api) ----------------------------

    def _receive_deferred(self, topic: str, *, max: int, charge: int,
                          charge_last: int | None = None,
                          visibility_timeout: float | timedelta | None = None,
                          max_attempts: int | None = None,
                          settler: Callable[[], Settler] | None = None,
                          buried: list[int] | None = None,
                          ) -> list[tuple[Message, bool]]:
        """The worker's receive. Over HTTP a receive charges every message's attempt at once
        (the API has no deferred charge), so every message comes back charged and the worker
        never needs _charge for them. `settler` is not used: the messages settle through this
        client, and the worker copies each for its run's tracker. `buried` stays empty: the
        API does not say what a receive dead-lettered."""
        msgs = self.receive(topic, max=max, visibility_timeout=visibility_timeout,
                            max_attempts=max_attempts)
        return [(m, True) for m in msgs]

    def _charge(self, msgs: Sequence[Message[P]], *,
                extend: float | timedelta | None = None) -> list[Message[P]]:
        """Messages from _receive_deferred are all charged already: only the lease is
        extended, as the library's charge would."""
        return self.heartbeat_many(msgs, extend=extend)

    def _message(self, m: dict[str, Any]) -> Message:
        payload = (base64.b64decode(m["payload_base64"]) if m.get("payload_base64") is not None
                   else m.get("payload"))
        return Message(
            id=m["id"], topic=m["topic"], key=m.get("key"), kind=m.get("kind"),
            payload=payload, headers=m.get("headers") or {}, priority=m["priority"],
            attempts=m["attempts"], created_at=_when(m["created_at"]),
            available_at=_when(m["available_at"]),
            first_available_at=_when(m["first_available_at"]),
            lease=m.get("lease"), last_error=m.get("last_error"), progress=m.get("progress"),
            received_at=_time(m.get("received_at")), _queue=self,
        )

    @staticmethod
    def _leased(msg: Message, action: str) -> tuple[int, str]:
        if msg.lease is None:
            raise InvalidArgument(f"cannot {action} message {msg.id}: it holds no lease")
        return msg.id, msg.lease

    def ack(self, msg: Message) -> None:
        msg_id, lease = self._leased(msg, "ack")
        self.call("POST", f"/v1/messages/{msg_id}/ack", {"lease": lease})

    def ack_many(self, msgs: Sequence[Message]) -> None:
        refs = [self._leased(m, "ack") for m in msgs]
        if not refs:
            return
        out = self.call("POST", "/v1/messages/ack",
                        {"messages": [{"id": i, "lease": lease} for i, lease in refs]})
        if out["lost"]:
            first = next(m for m in msgs if m.id == out["lost"][0])
            raise LeaseLost(first.topic, first.id, "ack", list(out["lost"]))

    def nack(self, msg: Message, *, delay: float | timedelta | None = None,
             error: str | None = None) -> None:
        msg_id, lease = self._leased(msg, "nack")
        body: dict[str, Any] = {"lease": lease}
        if delay is not None:
            body["delay"] = _seconds(delay)
        if error is not None:
            body["error"] = error[:65_536]
        self.call("POST", f"/v1/messages/{msg_id}/nack", body)

    def release(self, msg: Message, *, delay: float | timedelta | None = None) -> None:
        msg_id, lease = self._leased(msg, "release")
        body: dict[str, Any] = {"lease": lease}
        if delay is not None:
            body["delay"] = _seconds(delay)
        self.call("POST", f"/v1/messages/{msg_id}/release", body)

    def heartbeat(self, msg: Message[P], *, extend: float | timedelta | None = None,
                  progress: Any = None) -> Message[P]:
        msg_id, lease = self._leased(msg, "heartbeat")
        body: dict[str, Any] = {"lease": lease}
        if extend is not None:
            body["extend"] = _seconds(extend)
        if progress is not None:
            body["progress"] = progress
        out = self.call("POST", f"/v1/messages/{msg_id}/heartbeat", body, idempotent=True)
        return replace(msg, available_at=_when(out["lease_expires_at"]),
                       progress=progress if progress is not None else msg.progress)

    def heartbeat_many(self, msgs: Sequence[Message[P]], *,
                       extend: float | timedelta | None = None) -> list[Message[P]]:
        refs = [self._leased(m, "heartbeat") for m in msgs]
        if not refs:
            return []
        body: dict[str, Any] = {"messages": [{"id": i, "lease": lease} for i, lease in refs]}
        if extend is not None:
            body["extend"] = _seconds(extend)
        out = self.call("POST", "/v1/messages/heartbeat", body, idempotent=True)
        until = {h["id"]: _when(h["lease_expires_at"]) for h in out["held"]}
        return [replace(m, available_at=until[m.id]) for m in msgs if m.id in until]

    def dead_letter(self, msg: Message, error: str) -> None:
        msg_id, lease = self._leased(msg, "dead-letter")
        check_reason(error)
        self.call("POST", f"/v1/messages/{msg_id}/dead-letter",
                  {"lease": lease, "error": error[:65_536]})

    def forward(self, msg: Message, topic: str, payload: Any, *, key: str | None = None,
                kind: str | None = None, headers: Mapping[str, str] | None = None,
                priority: int = 0, delay: float | timedelta | None = None,
                at: datetime | None = None, on_duplicate: OnDuplicate = "ignore") -> SendResult:
        """Sends the next step and acks `msg` atomically (needs an admin token: it both
        consumes and sends)."""
        msg_id, lease = self._leased(msg, "forward")
        body = _item(payload, key=key, kind=kind, headers=dict(headers) if headers else None,
                     priority=priority or None, delay=_seconds(delay), at=_at(at))
        if on_duplicate != "ignore":  # the default is left out: older servers do not know it
            body["on_duplicate"] = on_duplicate
        out = self.call("POST", f"/v1/messages/{msg_id}/forward",
                        {**body, "lease": lease, "topic": topic})
        return SendResult(out["id"], out["status"], out.get("key"))

    # --- looking and housekeeping ---------------------------------------------------------------

    def peek(self, topic: str, limit: int = 10) -> list[Message]:
        out = self.call("GET", f"/v1/topics/{self._topic(topic)}/messages?limit={int(limit)}")
        return [self._message(m) for m in out["messages"]]

    def get(self, msg_id: int) -> Message | None:
        try:
            return self._message(self.call("GET", f"/v1/messages/{int(msg_id)}"))
        except NotFound:
            return None

    def topics(self) -> list[str]:
        return list(self.call("GET", "/v1/topics")["topics"])

    def stats(self, topic: str | None = None, *, exact: bool = False) -> list[TopicStats]:
        query = "?exact=true" if exact else ""
        if topic is not None:
            return [TopicStats(**self.call("GET",
                                           f"/v1/topics/{self._topic(topic)}/stats{query}"))]
        return [TopicStats(**s) for s in self.call("GET", f"/v1/stats{query}")["topics"]]

    def dead_letters(self, topic: str, *, limit: int = 100) -> list[DeadLetter]:
        out = self.call("GET", f"/v1/topics/{self._topic(topic)}/dead?limit={int(limit)}")
        return [DeadLetter(
            id=d["id"], topic=d["topic"], key=d.get("key"), kind=d.get("kind"),
            payload=(base64.b64decode(d["payload_base64"]) if d.get("payload_base64")
                     is not None else d.get("payload")),
            headers=d.get("headers") or {}, priority=d["priority"], attempts=d["attempts"],
            created_at=_time(d["created_at"]),  # type: ignore[arg-type]
            first_available_at=_time(d["first_available_at"]),  # type: ignore[arg-type]
            error=d.get("error"), dead_at=_time(d["dead_at"]),  # type: ignore[arg-type]
        ) for d in out["dead_letters"]]

    def requeue_dead(self, topic: str, ids: Sequence[int] | None = None) -> int:
        return int(self.call("POST", f"/v1/topics/{self._topic(topic)}/requeue-dead",
                             {"ids": list(ids) if ids is not None else None})["count"])

    def purge_dead(self, topic: str, ids: Sequence[int] | None = None) -> int:
        return int(self.call("POST", f"/v1/topics/{self._topic(topic)}/purge-dead",
                             {"ids": list(ids) if ids is not None else None})["count"])

    def purge(self, topic: str) -> int:
        return int(self.call("POST", f"/v1/topics/{self._topic(topic)}/purge")["count"])

    def now(self) -> datetime:
        return _time(self.call("GET", "/v1/time")["now"])  # type: ignore[return-value]

    def whoami(self) -> dict[str, Any]:
        return self.call("GET", "/v1/whoami")  # type: ignore[no-any-return]

    # --- what the worker asks of a queue ----------------------------------------------------------

    def max_attempts_for(self, topic: str, override: int | None = None) -> int:
        return override if override is not None else self.max_attempts

    def listener(self, topics: Collection[str] | None = None) -> None:
        """No push channel over HTTP: workers poll (with backoff)."""
        return None

    supports_transactions = False  # the worker refuses exactly_once handlers over HTTP

    def transaction(self) -> Any:
        raise ConfigurationError("exactly-once processing needs the database itself (the "
                                 "handler's writes and the ack commit together); run this "
                                 "handler with a database URL, not --api")

    def close(self) -> None:
        self._drop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _where(where: Mapping[str, Any]) -> dict[str, Any]:
    """The library's short filter form ({field: value, kind=, key=}) as the API's, refused
    here as the library refuses it (the API reads a null kind or key as not given)."""
    check_where(where)
    out: dict[str, Any] = {}
    fields: dict[str, Any] = dict(where.get("payload") or {})
    for name, value in where.items():
        if name in ("kind", "key"):
            out[name] = value
        elif name != "payload":
            fields[name] = value
    if fields:
        out["payload"] = fields
    return out


def _error(status: int, error: dict[str, Any], where: str) -> TableqError:
    code, message = str(error.get("code", "")), str(error.get("message", ""))
    if code == "LeaseLost":
        ids = error.get("message_ids") or [error.get("message_id") or 0]
        return LeaseLost(error.get("topic") or "?", int(ids[0]), str(error.get("action", "ack")),
                         [int(i) for i in ids])
    if code == "DuplicateMessage":
        return DuplicateMessage(str(error.get("topic")), error.get("key"),
                                error.get("existing_id"))
    if code == "AuthenticationFailed":
        exc: TableqError = AuthenticationFailed.__new__(AuthenticationFailed)
    elif code == "PermissionDenied":
        exc = PermissionDenied.__new__(PermissionDenied)
    elif code == "NotFound" or status == 404:
        exc = NotFound.__new__(NotFound)
    elif code == "PayloadTooLarge":
        exc = PayloadTooLarge.__new__(PayloadTooLarge)
    elif status == 503:
        return DatabaseUnavailable(where, message)
    elif status in (400, 413, 422):
        return InvalidArgument(message)
    else:
        return RemoteError(status, code, message)
    Exception.__init__(exc, message)  # the server's own words, which say what to do
    return exc
