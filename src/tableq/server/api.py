"""The native JSON API under /v1: send, long-poll receive, settle by id and lease, stats,
peek, topics and dead letters, each checked against the token's role and topic scopes (for
id-based calls, the topic of the message's row). Only the public Queue API; no SQL."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import anyio.from_thread
from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from tableq.errors import (
    AuthenticationFailed,
    LeaseLost,
    NotFound,
    PermissionDenied,
    TableqError,
)
from tableq.message import DeadLetter, Message, SendResult
from tableq.server import models as m
from tableq.server.auth import (
    ROLE_ACTIONS,
    Principal,
    looks_like_secret,
    secret_hash,
    secret_matches,
)
from tableq.server.errors import ApiError
from tableq.server.waiting import Deadline, next_poll_delay

if TYPE_CHECKING:
    from tableq.queue import Queue
    from tableq.server.app import ServerState

log = logging.getLogger("tableq.server")

bearer = HTTPBearer(auto_error=False, description="A token from `tableq token create`.")
IDEMPOTENCY_KEY = re.compile(r"^[!-~]{1,255}$")
# How often a long poll asks again whether its token still holds.
RECHECK_EVERY_S = 1.0
TOKEN_QUERY_NAMES = ("token", "access_token", "api_key", "apikey", "auth", "authorization")
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": m.ErrorOut, "description": text} for code, text in (
        (400, "Malformed request (bad JSON, bad header)"),
        (401, "Missing, unknown, expired or revoked token"),
        (403, "The token's role or topic scopes do not allow this"),
        (413, "Request body or payload too large"),
        (415, "A body that is not sent as JSON (Content-Type: application/json)"),
        (422, "Invalid values (names, payloads, limits)"),
        (503, "The queue database is unreachable, busy or not migrated; retry"),
    )
}
# A topic path the router cannot take apart (e.g. an encoded line break) matches no route.
ERRORS_TOPIC = {**ERRORS, 404: {"model": m.ErrorOut, "description": "No such route"}}
ERRORS_ID = {**ERRORS, 404: {"model": m.ErrorOut, "description": "No such message"},
             409: {"model": m.ErrorOut, "description": "Lease lost: another receiver holds "
                   "the message, or it was settled"}}
ERRORS_SEND = {**ERRORS_TOPIC, 409: {"model": m.ErrorOut, "description": "Duplicate key (with "
                                     "on_duplicate=error), or an Idempotency-Key reused for "
                                     "a different request"}}

TopicPath = Annotated[str, Path(pattern=m.TOPIC_PATTERN, max_length=200,
                                description="Topic name (percent-encode it in the path)")]
MessageId = Annotated[int, Path(ge=1, le=m.ID_MAX)]


def state(request: Request) -> ServerState:
    return request.app.state.tableq  # type: ignore[no-any-return]


def authenticate(st: ServerState, secret: str) -> Principal:
    """The Principal of a presented token secret, or AuthenticationFailed. Reads the store on
    every request, so a revoked token fails on its next request."""
    if not looks_like_secret(secret):
        raise AuthenticationFailed("the bearer token is not a tableq token")
    record = st.store.find_token(secret_sha256=secret_hash(secret))
    if record is None or not secret_matches(secret, record):
        raise AuthenticationFailed("unknown token")
    if record.revoked_at is not None:
        raise AuthenticationFailed("the token was revoked")
    if record.expired:
        raise AuthenticationFailed("the token has expired")
    return Principal.of(record)


def principal(request: Request,
              creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
              ) -> Principal:
    if any(name in TOKEN_QUERY_NAMES for name in (k.lower() for k in request.query_params)):
        raise AuthenticationFailed("tokens are never accepted in the URL (they leak into logs "
                                   "and history)")
    if creds is None or creds.scheme.lower() != "bearer":
        raise AuthenticationFailed("no bearer token")
    return authenticate(state(request), creds.credentials)


Caller = Annotated[Principal, Depends(principal)]


def require(p: Principal, action: str, topic: str) -> None:
    if not p.may(action, topic):
        raise PermissionDenied(p.role, action, topic)


# --- shaping values --------------------------------------------------------------------------


def _payload_fields(payload: Any) -> dict[str, Any]:
    if isinstance(payload, bytes):
        return {"payload": None, "payload_base64": base64.b64encode(payload).decode("ascii")}
    return {"payload": payload, "payload_base64": None}


def message_out(msg: Message) -> dict[str, Any]:
    return {
        "id": msg.id, "topic": msg.topic, "key": msg.key, "kind": msg.kind,
        **_payload_fields(msg.payload), "headers": msg.headers, "priority": msg.priority,
        "attempts": msg.attempts, "created_at": msg.created_at,
        "available_at": msg.available_at, "first_available_at": msg.first_available_at,
        "lease": msg.lease, "lease_expires_at": msg.lease_expires_at,
        "last_error": msg.last_error, "progress": msg.progress, "received_at": msg.received_at,
    }


def dead_out(d: DeadLetter) -> dict[str, Any]:
    return {
        "id": d.id, "topic": d.topic, "key": d.key, "kind": d.kind, **_payload_fields(d.payload),
        "headers": d.headers, "priority": d.priority, "attempts": d.attempts,
        "created_at": d.created_at, "first_available_at": d.first_available_at,
        "error": d.error, "dead_at": d.dead_at,
    }


def result_out(r: SendResult) -> dict[str, Any]:
    return {"id": r.id, "status": r.status, "key": r.key}


def _send_options(item: m.MessageIn) -> dict[str, Any]:
    return {"key": item.key, "kind": item.kind, "headers": item.headers,
            "priority": item.priority, "delay": item.delay, "at": item.at}


def _item(item: m.MessageIn) -> dict[str, Any]:
    return {"payload": item.body(), **{k: v for k, v in _send_options(item).items()
                                       if v is not None}}


# --- messages by id: the row's topic decides ---------------------------------------------------


GONE_TOPIC = "(unknown topic)"


def leased(st: ServerState, p: Principal, msg_id: int, lease: str, action: str) -> Message:
    """The message `msg_id` as held under `lease`, after checking that the token may consume
    the topic of its row. A message no longer live is returned as a bare reference: settling
    it changes nothing (its lease cannot match) and reports the lease as lost."""
    if "consume" not in ROLE_ACTIONS.get(p.role, frozenset()):
        raise PermissionDenied(p.role, action)
    row = st.queue.get(msg_id)
    if row is None:
        return Message(id=msg_id, topic=GONE_TOPIC, key=None, kind=None, payload=None,
                       headers={}, priority=0, attempts=0, created_at=_epoch(),
                       available_at=_epoch(), first_available_at=_epoch(), lease=lease,
                       _queue=st.queue)
    if not p.may("consume", row.topic):
        raise PermissionDenied(p.role, f"{action} message {msg_id}: it is not on a topic this "
                               "token may consume")
    return dataclasses.replace(row, lease=lease)


def _epoch() -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC)


def _lost(msg: Message, exc: LeaseLost) -> Exception:
    if msg.topic == GONE_TOPIC:
        return ApiError(409, "LeaseLost", f"cannot {exc.action} message {msg.id}: it is no "
                        "longer live (acked, dead-lettered or purged) under this lease, so "
                        "nothing was changed", topic=None, message_id=msg.id,
                        message_ids=exc.message_ids, action=exc.action)
    return exc


# --- the router -------------------------------------------------------------------------------


router = APIRouter(prefix="/v1", tags=["v1"], generate_unique_id_function=lambda r: r.name)
_SETTLE = ("ack", "nack", "release", "heartbeat", "dead_letter")
# OpenAPI links: what a receive returns is what the settling calls take, so API fuzzers (and
# readers) can chain send -> receive -> ack with a real lease.
RECEIVE_LINKS = {name: {"operationId": name, "parameters": {
    "msg_id": "$response.body#/messages/0/id"}, "requestBody": {
    "lease": "$response.body#/messages/0/lease",
    **({"error": "dead-lettered by a link"} if name == "dead_letter" else {})}}
    for name in _SETTLE}
SEND_LINKS = {"get_message": {"operationId": "get_message",
                              "parameters": {"msg_id": "$response.body#/id"}}}


def _idempotency_key(value: str | None) -> str | None:
    if value is None:
        return None
    if not IDEMPOTENCY_KEY.match(value):
        raise ApiError(400, "InvalidIdempotencyKey",
                       "Idempotency-Key must be 1-255 printable ASCII characters, e.g. a UUID")
    return value


@router.post("/topics/{topic:path}/messages", response_model=m.SendResultOut | m.SendBatchOut,
             responses={**ERRORS_SEND, 200: {"links": SEND_LINKS}},
             summary="Send one message or a batch")
async def send(request: Request, topic: TopicPath, body: m.SendBody, p: Caller,
               response: Response,
               idempotency_key: Annotated[str | None, Header(
                   alias="Idempotency-Key", json_schema_extra={"pattern": IDEMPOTENCY_KEY.pattern},
                   description="Retrying a send with the same key returns the first result")]
               = None) -> Any:
    st = state(request)
    require(p, "send", topic)
    key = _idempotency_key(idempotency_key)
    if isinstance(body, m.SendBatch) and len(body.messages) > st.config.max_batch:
        raise ApiError(422, "BatchTooLarge", f"a batch holds at most {st.config.max_batch} "
                       f"messages, not {len(body.messages)}; split it")

    def do(target: Any) -> dict[str, Any]:
        if isinstance(body, m.SendBatch):
            results = target.send_many(topic, [_item(i) for i in body.messages],
                                       on_duplicate=body.on_duplicate)
            return {"results": [result_out(r) for r in results]}
        return result_out(target.send(topic, body.body(), on_duplicate=body.on_duplicate,
                                      **_send_options(body)))

    replayed = False
    if key is None:
        out = await run_in_threadpool(do, st.queue)
    else:
        raw = await request.body()
        fingerprint = hashlib.sha256(b"POST " + request.url.path.encode() + b"\n" + raw
                                     ).hexdigest()

        def idempotent() -> tuple[dict[str, Any], bool]:
            with st.store.idempotent(p.token_id, key, fingerprint) as call:
                if call.earlier is not None:
                    if call.earlier.fingerprint != fingerprint:
                        # 409: the key is taken by another request's outcome (the draft's
                        # SHOULD is 422; a conflict with stored state reads truer).
                        raise ApiError(409, "IdempotencyKeyReused",
                                       "this Idempotency-Key was used for a different request; "
                                       "use a new key for a new request")
                    return json.loads(call.earlier.response or "{}"), True
                result = do(call.tx)
                call.finish(200, json.dumps(result))
                return result, False
        out, replayed = await run_in_threadpool(idempotent)
    if replayed:  # the first call counted and woke; a replay sent nothing
        response.headers["Idempotent-Replayed"] = "true"
    else:
        st.metrics.sent.labels(topic).inc(len(out["results"]) if "results" in out else 1)
        st.wake(topic)
    return out


@router.post("/topics/{topic:path}/receive", response_model=m.MessagesOut,
             responses={**ERRORS_TOPIC, 200: {"links": RECEIVE_LINKS}},
             summary="Receive (lease) due messages, long polling up to wait_s")
async def receive(request: Request, topic: TopicPath, body: m.ReceiveIn, p: Caller) -> Any:
    st = state(request)
    require(p, "consume", topic)
    cfg = st.config
    if body.max > cfg.max_receive:
        raise ApiError(422, "InvalidArgument", f"max must be at most {cfg.max_receive}")
    if body.wait_s > cfg.max_wait_s:
        raise ApiError(422, "InvalidArgument", f"wait_s must be at most {cfg.max_wait_s:g}")
    where = body.where.model_dump(exclude_none=True) if body.where else None

    def take() -> list[Message]:
        if body.mode == "at_most_once":
            return take_while_connected(request, st.queue, topic, body.max, where,
                                        body.max_attempts)
        return st.queue.receive(topic, max=body.max, visibility_timeout=body.visibility_timeout,
                                where=where, mode=body.mode, max_attempts=body.max_attempts)

    secret = request.headers.get("authorization", "").partition(" ")[2].strip()
    msgs = await long_poll(request, st, topic, body.wait_s, take,
                           recheck=lambda: authenticate(st, secret))
    return {"messages": [message_out(x) for x in msgs]}


class _ClientGone(Exception):  # noqa: N818 - control flow: rolls the take back
    pass


def take_while_connected(request: Request, queue: Queue, topic: str, max: int,
                         where: Any, max_attempts: int | None) -> list[Message]:
    """An at-most-once receive whose messages are removed only if the client is still there
    once they are in hand: taken in a transaction, which rolls back (leaving them as they
    were) when the client went away during the take. What is lost is only what a client
    loses after the answer exists. Runs in a worker thread (run_in_threadpool)."""
    msgs: list[Message] = []
    try:
        with queue.transaction() as tx:
            msgs = tx.receive(topic, max=max, where=where, max_attempts=max_attempts,
                              mode="at_most_once")
            if msgs:
                gone: bool = anyio.from_thread.run(request.is_disconnected)
                if gone:
                    raise _ClientGone
    except _ClientGone:
        log.info("tableq.server.at_most_once_untaken topic=%s messages=%d (the client left)",
                 topic, len(msgs))
        return []
    return msgs


async def long_poll(request: Request, st: ServerState, topic: str, wait_s: float,
                    take: Callable[[], list[Message]],
                    recheck: Callable[[], object] | None = None) -> list[Message]:
    """Receives until something comes or `wait_s` runs out. Nothing is held while waiting:
    each try is one short query on a pooled connection. A client that went away stops the
    poll before it leases anything more, and what a try leased as it left is given back
    uncharged (an at-most-once take rolls back instead). `recheck` raises if the request's
    token no longer holds (revoked, expired): asked again before a try once a second has
    passed since the last check, so a revocation stops a waiting poll within about that."""
    deadline = Deadline(wait_s)
    delay = 0.0
    checked = time.monotonic()
    while True:
        if await request.is_disconnected():
            return []
        if recheck is not None and time.monotonic() - checked >= RECHECK_EVERY_S:
            await run_in_threadpool(recheck)
            checked = time.monotonic()
        msgs = await run_in_threadpool(take)
        if msgs:
            if await request.is_disconnected():
                await run_in_threadpool(give_back, st.queue, msgs)
                return []
            break
        if deadline.left() <= 0:
            break
        delay = next_poll_delay(delay)
        assert st.waiter is not None
        if await st.waiter.wait(topic, min(delay, deadline.left())):
            delay = 0.0
    if msgs:
        st.metrics.received.labels(topic).inc(len(msgs))
    return msgs


def give_back(queue: Queue, msgs: list[Message]) -> None:
    """Releases leased messages that no client will see (best effort: a lease already lost
    needs nothing, and one that cannot be released comes back when it ends). Messages
    received at most once were deleted as they were taken: they are gone, and said so."""
    gone = [m.id for m in msgs if m.lease is None]
    if gone:
        log.warning("tableq.server.at_most_once_undelivered topic=%s ids=%s", msgs[0].topic,
                    ",".join(map(str, gone)))
    for msg in msgs:
        if msg.lease is not None:
            try:
                queue.release(msg)
            except TableqError:
                log.warning("tableq.server.release_failed message=%s", msg.id)


@router.get("/topics/{topic:path}/messages", response_model=m.MessagesOut, responses=ERRORS_TOPIC,
            summary="Peek at live messages by priority, then due time (no lease)")
def peek(request: Request, topic: TopicPath, p: Caller,
         limit: Annotated[int, Query(ge=1, le=1000)] = 10) -> Any:
    require(p, "view", topic)
    return {"messages": [message_out(x) for x in state(request).queue.peek(topic, limit)]}


ExactStats = Annotated[bool, Query(
    description="Count every row even in a big table, where counts are otherwise estimated "
                "from a sample (`estimated: true`); takes time in proportion to the table")]


@router.get("/topics/{topic:path}/stats", response_model=m.StatsOut, responses=ERRORS_TOPIC,
            summary="Counts of one topic")
def topic_stats(request: Request, topic: TopicPath, p: Caller, exact: ExactStats = False) -> Any:
    require(p, "stats", topic)
    return dataclasses.asdict(state(request).queue.stats(topic, exact=exact)[0])


@router.get("/topics/{topic:path}/dead", response_model=m.DeadLettersOut, responses=ERRORS_TOPIC,
            summary="Dead letters of a topic, newest last")
def dead_list(request: Request, topic: TopicPath, p: Caller,
              limit: Annotated[int, Query(ge=1, le=10_000)] = 100) -> Any:
    require(p, "view", topic)
    return {"dead_letters": [dead_out(d) for d in
                             state(request).queue.dead_letters(topic, limit=limit)]}


@router.post("/topics/{topic:path}/requeue-dead", response_model=m.CountOut, responses=ERRORS_TOPIC,
             summary="Move dead letters (all, or these ids) back to the queue")
def requeue_dead(request: Request, topic: TopicPath, body: m.IdsIn, p: Caller) -> Any:
    require(p, "manage", topic)
    st = state(request)
    count = st.queue.requeue_dead(topic, body.ids)
    st.wake_threadsafe(topic)
    return {"count": count}


@router.post("/topics/{topic:path}/purge-dead", response_model=m.CountOut, responses=ERRORS_TOPIC,
             summary="Delete dead letters (all, or these ids)")
def purge_dead(request: Request, topic: TopicPath, body: m.IdsIn, p: Caller) -> Any:
    require(p, "manage", topic)
    return {"count": state(request).queue.purge_dead(topic, body.ids)}


@router.post("/topics/{topic:path}/purge", response_model=m.CountOut, responses=ERRORS_TOPIC,
             summary="Delete every live message of the topic (dead letters stay)")
def purge(request: Request, topic: TopicPath, p: Caller) -> Any:
    require(p, "manage", topic)
    return {"count": state(request).queue.purge(topic)}


@router.get("/topics", response_model=m.TopicsOut, responses=ERRORS,
            summary="Topics in the token's scope that hold live or dead messages")
def topics(request: Request, p: Caller) -> Any:
    return {"topics": [t for t in state(request).queue.topics() if p.sees(t)]}


@router.get("/stats", response_model=m.StatsListOut, responses=ERRORS,
            summary="Counts of every topic in the token's scope")
def stats(request: Request, p: Caller, exact: ExactStats = False) -> Any:
    return {"topics": [dataclasses.asdict(s) for s in state(request).queue.stats(exact=exact)
                       if p.may("stats", s.topic)]}


@router.get("/time", response_model=m.TimeOut, responses=ERRORS,
            summary="The database clock, which due times and leases follow")
def db_time(request: Request, p: Caller) -> Any:
    return {"now": state(request).queue.now()}


@router.get("/whoami", response_model=m.WhoAmIOut, responses=ERRORS,
            summary="The calling token's role, scopes and the server's limits")
def whoami(request: Request, p: Caller) -> Any:
    cfg = state(request).config
    return {"token_id": p.token_id, "role": p.role, "topics": list(p.topics), "name": p.name,
            "limits": {"max_body_bytes": cfg.max_body_bytes, "max_batch": cfg.max_batch,
                       "max_receive": cfg.max_receive, "max_wait_s": cfg.max_wait_s}}


@router.get("/messages/{msg_id:int}", response_model=m.MessageOut, responses=ERRORS_ID,
            summary="One live message by id (no lease)")
def get_message(request: Request, msg_id: MessageId, p: Caller) -> Any:
    found = state(request).queue.get(msg_id)
    # Out of scope looks the same as missing: ids must not reveal other topics' messages.
    if found is None or not p.may("view", found.topic):
        raise NotFound(f"live message {msg_id}")
    return message_out(found)


def _settle(st: ServerState, p: Principal, msg_id: int, lease: str, action: str,
            fn: Any) -> Any:
    msg = leased(st, p, msg_id, lease, action)
    try:
        return msg, fn(msg)
    except LeaseLost as exc:
        raise _lost(msg, exc) from None


@router.post("/messages/{msg_id:int}/ack", response_model=m.SettledOut, responses=ERRORS_ID,
             summary="Acknowledge (remove) a message held under this lease")
def ack(request: Request, msg_id: MessageId, body: m.LeaseIn, p: Caller) -> Any:
    st = state(request)
    msg, _ = _settle(st, p, msg_id, body.lease, "ack", st.queue.ack)
    st.metrics.acked.labels(msg.topic).inc()
    return {"id": msg_id, "status": "acked"}


@router.post("/messages/{msg_id:int}/nack", response_model=m.SettledOut, responses=ERRORS_ID,
             summary="Give the message back for a retry after `delay` seconds")
def nack(request: Request, msg_id: MessageId, body: m.NackIn, p: Caller) -> Any:
    st = state(request)
    msg, _ = _settle(st, p, msg_id, body.lease, "nack",
                     lambda x: st.queue.nack(x, delay=body.delay, error=body.error))
    st.metrics.failed.labels(msg.topic).inc()
    return {"id": msg_id, "status": "nacked"}


@router.post("/messages/{msg_id:int}/release", response_model=m.SettledOut, responses=ERRORS_ID,
             summary="Give the message back without charging the attempt, at once or after "
                     "`delay` seconds")
def release(request: Request, msg_id: MessageId, body: m.ReleaseIn, p: Caller) -> Any:
    st = state(request)
    msg, _ = _settle(st, p, msg_id, body.lease, "release",
                     lambda x: st.queue.release(x, delay=body.delay))
    if not body.delay:
        st.wake_threadsafe(msg.topic)
    return {"id": msg_id, "status": "released"}


@router.post("/messages/{msg_id:int}/heartbeat", response_model=m.HeartbeatOut,
             responses=ERRORS_ID, summary="Extend the lease (and save progress)")
def heartbeat(request: Request, msg_id: MessageId, body: m.HeartbeatIn, p: Caller) -> Any:
    st = state(request)
    _, held = _settle(st, p, msg_id, body.lease, "heartbeat",
                      lambda x: st.queue.heartbeat(x, extend=body.extend,
                                                   progress=body.progress))
    return {"id": msg_id, "lease_expires_at": held.lease_expires_at}


@router.post("/messages/{msg_id:int}/dead-letter", response_model=m.SettledOut,
             responses=ERRORS_ID, summary="Move the message to the dead-letter store")
def dead_letter(request: Request, msg_id: MessageId, body: m.DeadLetterIn, p: Caller) -> Any:
    st = state(request)
    msg, _ = _settle(st, p, msg_id, body.lease, "dead-letter",
                     lambda x: st.queue.dead_letter(x, body.error))
    st.metrics.dead_lettered.labels(msg.topic).inc()
    return {"id": msg_id, "status": "dead_lettered"}


@router.post("/messages/{msg_id:int}/forward", response_model=m.SendResultOut,
             responses=ERRORS_ID, summary="Send the next step and ack this message atomically")
def forward(request: Request, msg_id: MessageId, body: m.ForwardIn, p: Caller) -> Any:
    st = state(request)
    require(p, "send", body.topic)
    msg, result = _settle(st, p, msg_id, body.lease, "forward",
                          lambda x: st.queue.forward(x, body.topic, body.body(),
                                                     on_duplicate=body.on_duplicate,
                                                     **_send_options(body)))
    st.metrics.acked.labels(msg.topic).inc()
    st.metrics.sent.labels(body.topic).inc()
    st.wake_threadsafe(body.topic)
    return result_out(result)


def _refs(st: ServerState, p: Principal, refs: Sequence[m.Ref], action: str) -> list[Message]:
    if len(refs) > st.config.max_batch:
        raise ApiError(422, "BatchTooLarge", f"at most {st.config.max_batch} messages per call")
    return [leased(st, p, r.id, r.lease, action) for r in refs]


@router.post("/messages/ack", response_model=m.AckManyOut, responses=ERRORS,
             summary="Acknowledge many messages; the ones whose lease was lost are listed")
def ack_many(request: Request, body: m.RefsIn, p: Caller) -> Any:
    st = state(request)
    msgs = _refs(st, p, body.messages, "ack")
    lost: list[int] = []
    try:
        st.queue.ack_many(msgs)
    except LeaseLost as exc:
        lost = list(exc.message_ids)
    gone = set(lost)
    acked = list(dict.fromkeys(x.id for x in msgs if x.id not in gone))  # each id once
    topics = {x.id: x.topic for x in msgs}
    for i in acked:
        st.metrics.acked.labels(topics[i]).inc()
    return {"acked": acked, "lost": lost}


@router.post("/messages/heartbeat", response_model=m.HeartbeatManyOut, responses=ERRORS,
             summary="Extend many leases; the lost ones are listed")
def heartbeat_many(request: Request, body: m.HeartbeatManyIn, p: Caller) -> Any:
    st = state(request)
    msgs = _refs(st, p, body.messages, "heartbeat")
    held = st.queue.heartbeat_many(msgs, extend=body.extend)
    kept = {x.id for x in held}
    return {"held": [{"id": x.id, "lease_expires_at": x.lease_expires_at} for x in held],
            "lost": [x.id for x in msgs if x.id not in kept]}
