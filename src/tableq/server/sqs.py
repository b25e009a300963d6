"""An SQS-compatible endpoint under /sqs: a subset of the Amazon SQS JSON protocol
(X-Amz-Target AmazonSQS.*, application/x-amz-json-1.0) over topics, authenticated by AWS
Signature V4 with a token's key pair, so unmodified SQS clients (boto3, the aws CLI) work
against the queue. Receipt handles carry the message id and its lease: a stale one is refused
with ReceiptHandleIsInvalid and changes nothing. Only the public Queue API; no SQL."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import logging
import re
import struct
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from tableq.errors import LeaseLost, TableqError
from tableq.message import Message, SendResult
from tableq.names import check_headers, check_key, check_topic
from tableq.server import sigv4
from tableq.server.auth import ROLE_ACTIONS, Principal
from tableq.server.errors import status_of
from tableq.tokens import TokenRecord

if TYPE_CHECKING:
    from tableq.server.app import ServerState

log = logging.getLogger("tableq.server")
router = APIRouter(include_in_schema=False)
CONTENT_TYPE = "application/x-amz-json-1.0"
ACCOUNT = "000000000000"
BATCH_MAX = 10  # SQS's own limits, which its clients expect
RECEIVE_MAX = 10
WAIT_MAX_S = 20
VISIBILITY_MAX_S = 43_200
DELAY_MAX_S = 900
BODY_MAX = 262_144
TYPES_HEADER = "sqs-attribute-types"
HANDLE_PREFIX = "tq1:"
# What SQS takes in a message body and attribute values, and its attribute names and types
# (we keep String and Number: Binary attributes are not supported).
SQS_TEXT = re.compile("[\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]*")
SQS_CHARSET = "#x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF"
ATTRIBUTE_NAME = re.compile(
    r"(?!(?i:aws\.|amazon\.)|\.)(?!.*\.\.)[A-Za-z0-9_.-]{1,256}(?<!\.)")
# SQS's own rule for MessageDeduplicationId (and MessageGroupId).
DEDUP_ID = re.compile(r"[A-Za-z0-9!-/:-@\[-`{-~]{1,128}")
# The queue attributes SQS defines that tableq has no value for: asked for, they are left
# out of the answer, as SQS leaves out those a queue has not set. Any other name is refused.
QUEUE_ATTRIBUTES = frozenset({
    "Policy", "CreatedTimestamp", "LastModifiedTimestamp", "MessageRetentionPeriod",
    "RedrivePolicy", "RedriveAllowPolicy", "FifoQueue", "ContentBasedDeduplication",
    "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds", "DeduplicationScope",
    "FifoThroughputLimit", "SqsManagedSseEnabled"})
DATA_TYPE = re.compile(r"(?:String|Number)(?:\.[A-Za-z0-9_.-]{1,249})?")
# Our code -> (AWS query-compatible code, HTTP status): what botocore reports as the code.
_AWS = {
    "AccessDenied": ("AccessDenied", 403),
    "InvalidClientTokenId": ("InvalidClientTokenId", 403),
    "SignatureDoesNotMatch": ("SignatureDoesNotMatch", 403),
    "IncompleteSignature": ("IncompleteSignature", 400),
    "MissingAuthenticationToken": ("MissingAuthenticationToken", 403),
    "RequestExpired": ("RequestExpired", 400),
    "ReceiptHandleIsInvalid": ("ReceiptHandleIsInvalid", 400),
    "InvalidParameterValue": ("InvalidParameterValue", 400),
    "MissingParameter": ("MissingParameter", 400),
    "TooManyEntriesInBatchRequest": ("AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
                                     400),
    "EmptyBatchRequest": ("AWS.SimpleQueueService.EmptyBatchRequest", 400),
    "BatchEntryIdsNotDistinct": ("AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400),
    "InvalidBatchEntryId": ("AWS.SimpleQueueService.InvalidBatchEntryId", 400),
    "QueueDoesNotExist": ("AWS.SimpleQueueService.NonExistentQueue", 400),
    "UnsupportedOperation": ("AWS.SimpleQueueService.UnsupportedOperation", 400),
    "InvalidAction": ("InvalidAction", 400),
    "InvalidAttributeName": ("InvalidAttributeName", 400),
    "SerializationException": ("SerializationException", 400),
    "RequestTooLarge": ("RequestTooLarge", 413),
    "ServiceUnavailable": ("ServiceUnavailable", 503),
    "InternalError": ("InternalError", 500),
}


class SqsError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def too_large(message: str) -> Response:
    """A request body over the server's --max-body-bytes, answered in the SQS shape (the
    Guard and the endpoint call it for /sqs)."""
    return _error("RequestTooLarge", message)


def _error(code: str, message: str) -> Response:
    query_code, status = _AWS.get(code, (code, 400))
    fault = "Sender" if status < 500 else "Receiver"
    return JSONResponse({"__type": f"com.amazonaws.sqs#{code}", "message": message},
                        status_code=status, media_type=CONTENT_TYPE,
                        headers={"x-amzn-query-error": f"{query_code};{fault}",
                                 "x-amzn-RequestId": str(uuid.uuid4())})


def _library_error(exc: TableqError) -> SqsError:
    if isinstance(exc, LeaseLost):
        return SqsError("ReceiptHandleIsInvalid", "The receipt handle has expired: the message "
                        "was received again, deleted or its visibility ran out.")
    if status_of(exc) >= 500:
        return SqsError("ServiceUnavailable", str(exc))
    if status_of(exc) in (401, 403):
        return SqsError("AccessDenied", str(exc))
    return SqsError("InvalidParameterValue", str(exc))


# --- values ------------------------------------------------------------------------------------


def receipt_handle(msg: Message) -> str:
    raw = f"{HANDLE_PREFIX}{msg.id}:{msg.lease}".encode()
    return base64.urlsafe_b64encode(raw).decode("ascii")


def parse_handle(handle: Any) -> tuple[int, str]:
    """(message id, lease) from a receipt handle; SqsError if it is not one of ours."""
    try:
        text = base64.urlsafe_b64decode(str(handle).encode("ascii")).decode("utf-8")
        if not text.startswith(HANDLE_PREFIX):
            raise ValueError
        ident, lease = text[len(HANDLE_PREFIX):].split(":", 1)
        if not lease or len(lease) > 200 or not lease.isprintable() or int(ident) < 1:
            raise ValueError  # a lease tableq never hands out (the library would refuse it)
        return int(ident), lease
    except (ValueError, UnicodeError, binascii.Error):
        raise SqsError("ReceiptHandleIsInvalid", "The input receipt handle is invalid.") from None


def queue_url(base: str, topic: str) -> str:
    return f"{base}/sqs/{ACCOUNT}/{quote(topic, safe='')}"


def topic_of(url: Any) -> str:
    """The topic a QueueUrl (or a bare queue name) names."""
    if not isinstance(url, str) or not url:
        raise SqsError("MissingParameter", "The request must contain the parameter QueueUrl.")
    path = urlsplit(url).path if "://" in url else url
    if "/sqs/" in path:
        path = path.split("/sqs/", 1)[1]
        path = path.split("/", 1)[1] if "/" in path else path
    elif path.startswith("/"):
        # Another server's form (AWS, LocalStack: /<account>/<name>): the name is the last
        # part, as everywhere in SQS (a queue name has no "/"; a topic's is encoded).
        path = path.rstrip("/").rsplit("/", 1)[-1]
    try:
        return check_topic(unquote(path))
    except TableqError as exc:
        raise SqsError("QueueDoesNotExist", f"The specified queue does not exist: {exc}") from None


def md5_hex(text: str) -> str:
    return hashlib.md5(text.encode("utf-8"), usedforsecurity=False).hexdigest()


def attributes_md5(attrs: dict[str, dict[str, str]]) -> str:
    """MD5OfMessageAttributes as SQS computes it: names sorted, each name, type and value
    length-prefixed, with a transport byte (1 = string)."""
    out = b""
    for name in sorted(attrs):
        a = attrs[name]
        for part in (name, a["DataType"]):
            data = part.encode("utf-8")
            out += struct.pack(">I", len(data)) + data
        value = a["StringValue"].encode("utf-8")
        out += b"\x01" + struct.pack(">I", len(value)) + value
    return hashlib.md5(out, usedforsecurity=False).hexdigest()


def body_text(payload: Any) -> str:
    if isinstance(payload, str):
        return payload
    if isinstance(payload, bytes):
        return base64.b64encode(payload).decode("ascii")
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def _int(params: dict[str, Any], name: str, default: int | None, lo: int, hi: int) -> int | None:
    value = params.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise SqsError("InvalidParameterValue",
                       f"Value {value!r} for parameter {name} is invalid. Reason: must be "
                       f"between {lo} and {hi}.")
    return value


def _names(params: dict[str, Any], field: str) -> list[str]:
    """A list-of-names parameter (AttributeNames, ...), refused the SQS way if it is not one."""
    value = params.get(field) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SqsError("InvalidParameterValue", f"{field} must be a list of names")
    return value


def _text(what: str, value: str) -> str:
    if not SQS_TEXT.fullmatch(value):
        raise SqsError("InvalidParameterValue", f"{what} holds a character SQS does not "
                       f"allow; the allowed ones are {SQS_CHARSET}")
    return value


def _headers(attrs: Any) -> dict[str, str] | None:
    """MessageAttributes (String and Number) as message headers, checked as SQS and the
    library check them, so that nothing is refused after it was stored."""
    if not attrs:
        return None
    if not isinstance(attrs, dict) or len(attrs) > 10:
        raise SqsError("InvalidParameterValue", "MessageAttributes takes at most 10 entries")
    headers: dict[str, str] = {}
    types: dict[str, str] = {}
    for name, a in attrs.items():
        kind = a.get("DataType", "") if isinstance(a, dict) else ""
        if (not isinstance(kind, str) or not DATA_TYPE.fullmatch(kind)
                or not isinstance(a.get("StringValue"), str)):
            raise SqsError("InvalidParameterValue", f"message attribute {name!r}: only String "
                           "and Number attributes (DataType String, Number or either with a "
                           ".label of letters, digits, '_', '-' and '.') with a StringValue "
                           "are supported")
        if name == TYPES_HEADER:
            raise SqsError("InvalidParameterValue", f"{TYPES_HEADER} is a reserved name")
        if not ATTRIBUTE_NAME.fullmatch(name):
            raise SqsError("InvalidParameterValue", f"message attribute name {name!r}: use "
                           "letters, digits, '_', '-' and '.', not starting with 'AWS.' or "
                           "'Amazon.' and without '..'")
        value = _text(f"message attribute {name!r}", a["StringValue"])
        if kind.startswith("Number") and not _number(value):
            raise SqsError("InvalidParameterValue", f"message attribute {name!r}: "
                           f"{value[:40]!r} is not a number")
        headers[name] = value
        if kind != "String":
            types[name] = kind
    if types:
        headers[TYPES_HEADER] = json.dumps(types)
    try:
        return check_headers(headers)
    except TableqError as exc:
        raise SqsError("InvalidParameterValue", f"MessageAttributes: {exc}") from None


def _number(text: str) -> bool:
    try:
        return Decimal(text).is_finite()
    except InvalidOperation:
        return False


def _types(headers: Mapping[str, str]) -> dict[str, str]:
    """The SQS data types kept with a message's headers. Headers are written by /v1 clients
    too, so a value that is not ours reads as "every attribute is a String"."""
    try:
        types = json.loads(headers.get(TYPES_HEADER, "{}"))
    except ValueError:
        return {}
    if not isinstance(types, dict):
        return {}
    return {k: v for k, v in types.items() if isinstance(v, str) and DATA_TYPE.fullmatch(v)}


def _attributes(headers: Mapping[str, str], wanted: list[str]
                ) -> dict[str, dict[str, str]]:
    """MessageAttributes from a message's headers (those in `wanted`, or "All")."""
    if not wanted:
        return {}
    types = _types(headers)
    return {name: {"DataType": types.get(name, "String"), "StringValue": value}
            for name, value in headers.items()
            if name != TYPES_HEADER and ("All" in wanted or ".*" in wanted or name in wanted)}


def _millis(at: datetime | None) -> str:
    return str(int((at or datetime.now(UTC)).timestamp() * 1000))


# --- the endpoint -------------------------------------------------------------------------------


@router.post("/sqs")
@router.post("/sqs/")
async def endpoint(request: Request) -> Response:
    st: ServerState = request.app.state.tableq
    target = request.headers.get("x-amz-target", "")
    if not target.startswith("AmazonSQS."):
        return _error("InvalidAction", "this endpoint speaks the SQS JSON protocol: set "
                      "X-Amz-Target: AmazonSQS.<Action> and Content-Type: " + CONTENT_TYPE)
    action = target.split(".", 1)[1]
    try:
        raw = await request.body()
    except HTTPException as exc:  # the Guard's cap on a body that came without a length
        if exc.status_code != 413:
            raise
        return too_large(str(exc.detail))
    try:
        p = await run_in_threadpool(_authenticate, st, request, raw)
        try:
            params = json.loads(raw or b"{}")
        except (ValueError, RecursionError):
            raise SqsError("SerializationException", "the body is not valid JSON") from None
        if not isinstance(params, dict):
            raise SqsError("SerializationException", "the body must be a JSON object")
        handler = ACTIONS.get(action)
        if handler is None:
            raise SqsError("UnsupportedOperation" if action[:1].isupper() else "InvalidAction",
                           f"{action} is not supported by tableq's SQS endpoint")
        if action == "ReceiveMessage":
            out = await _receive(st, request, p, params)
        else:
            out = await run_in_threadpool(handler, st, request, p, params)
    except SqsError as exc:
        return _error(exc.code, exc.message)
    except TableqError as exc:
        err = _library_error(exc)
        return _error(err.code, err.message)
    except Exception:  # a bug: the SQS shape, that clients can read, and the log has it
        log.exception("tableq.server.unexpected_error path=/sqs action=%s", action)
        return _error("InternalError", "the server failed unexpectedly; its log has the "
                      "details")
    return JSONResponse(out, media_type=CONTENT_TYPE,
                        headers={"x-amzn-RequestId": str(uuid.uuid4())})


def _authenticate(st: ServerState, request: Request, raw: bytes) -> Principal:
    try:
        cred = sigv4.parse_authorization(request.headers.get("authorization"))
    except sigv4.SignatureError as exc:
        raise SqsError(exc.code, str(exc)) from None
    record = _active_token(st, cred.access_key)
    headers = {k.lower(): v for k, v in request.headers.items()}
    assert record.sqs_secret is not None  # _active_token
    try:
        sigv4.verify(cred, record.sqs_secret, method=request.method,
                     path=request.scope.get("raw_path", b"").decode("latin-1").split("?")[0]
                     or request.url.path, query=request.url.query, headers=headers, body=raw,
                     now=datetime.now(UTC))
    except sigv4.SignatureError as exc:
        raise SqsError(exc.code, str(exc)) from None
    return Principal.of(record)


def _active_token(st: ServerState, access_key: str) -> TokenRecord:
    """The token of an SQS access key, refused unless it has an SQS secret and is active."""
    record = st.store.find_token(access_key=access_key)
    if record is None or record.sqs_secret is None:
        raise SqsError("InvalidClientTokenId", "The security token included in the request is "
                       "invalid: no tableq token has this access key id")
    if not record.active:
        raise SqsError("InvalidClientTokenId", "The access key belongs to a token that was "
                       "revoked or has expired")
    return record


def _still_active(st: ServerState, request: Request) -> None:
    """For a long poll: its access key's token is still there and active (the signature was
    checked when the request came in)."""
    _active_token(st, sigv4.parse_authorization(request.headers.get("authorization")).access_key)


def _may(p: Principal, action: str, topic: str) -> None:
    if not p.may(action, topic):
        raise SqsError("AccessDenied", f"a {p.role} token may not {action} on this queue")


def _base(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def create_queue(st: ServerState, request: Request, p: Principal, params: dict[str, Any]
                 ) -> dict[str, Any]:
    name = params.get("QueueName")
    if not isinstance(name, str):
        raise SqsError("MissingParameter", "The request must contain the parameter QueueName.")
    topic = topic_of(name)
    if not p.sees(topic):
        raise SqsError("AccessDenied", "this token's topic scopes do not include the queue")
    # Topics need no creation: a queue exists as soon as it is named.
    return {"QueueUrl": queue_url(_base(request), topic)}


def list_queues(st: ServerState, request: Request, p: Principal, params: dict[str, Any]
                ) -> dict[str, Any]:
    prefix = params.get("QueueNamePrefix") or ""
    if not isinstance(prefix, str):
        raise SqsError("InvalidParameterValue", "QueueNamePrefix must be a string")
    limit = _int(params, "MaxResults", 1000, 1, 1000)
    names = [t for t in st.queue.topics() if p.sees(t) and t.startswith(prefix)]
    return {"QueueUrls": [queue_url(_base(request), t) for t in names[:limit]]}


def get_queue_attributes(st: ServerState, request: Request, p: Principal,
                         params: dict[str, Any]) -> dict[str, Any]:
    topic = topic_of(params.get("QueueUrl"))
    _may(p, "stats", topic)
    s = st.queue.stats(topic)[0]
    every = {
        "ApproximateNumberOfMessages": s.ready,
        "ApproximateNumberOfMessagesNotVisible": s.in_flight,
        "ApproximateNumberOfMessagesDelayed": s.scheduled,
        "VisibilityTimeout": int(st.queue.visibility_timeout_s),
        "MaximumMessageSize": st.queue.max_payload_bytes,
        "DelaySeconds": 0,
        "ReceiveMessageWaitTimeSeconds": 0,
        "QueueArn": f"arn:aws:sqs:tableq:{ACCOUNT}:{topic}",
    }
    wanted = _names(params, "AttributeNames") or ["All"]
    unknown = [n for n in wanted if n != "All" and n not in every and n not in QUEUE_ATTRIBUTES]
    if unknown:
        raise SqsError("InvalidAttributeName", f"Unknown Attribute {unknown[0]}.")
    return {"Attributes": {k: str(v) for k, v in every.items()
                           if "All" in wanted or k in wanted}}


def _message(topic: str, entry: dict[str, Any]) -> dict[str, Any]:
    body = entry.get("MessageBody")
    if not isinstance(body, str) or not body:
        raise SqsError("MissingParameter", "The request must contain the parameter "
                       "MessageBody.")
    if len(_text("MessageBody", body).encode("utf-8")) > BODY_MAX:
        raise SqsError("InvalidParameterValue", f"One or more parameters are invalid. Reason: "
                       f"Message must be shorter than {BODY_MAX} bytes.")
    dedup = entry.get("MessageDeduplicationId")
    if isinstance(dedup, str) and not DEDUP_ID.fullmatch(dedup):
        raise SqsError("InvalidParameterValue", "MessageDeduplicationId is 1 to 128 "
                       "characters of a-z, A-Z, 0-9 and punctuation (!\"#$%&'()*+,-./:;<=>?@"
                       "[\\]^_`{|}~)")
    try:
        check_key(dedup)
    except TableqError as exc:
        raise SqsError("InvalidParameterValue", f"MessageDeduplicationId: {exc}") from None
    return {"payload": body, "key": dedup,
            "delay": _int(entry, "DelaySeconds", 0, 0, DELAY_MAX_S),
            "headers": _headers(entry.get("MessageAttributes"))}


def _sent(entry: dict[str, Any], msg_id: int) -> dict[str, Any]:
    out = {"MessageId": str(msg_id), "MD5OfMessageBody": md5_hex(entry["payload"])}
    if entry["headers"]:
        out["MD5OfMessageAttributes"] = attributes_md5(_attributes(entry["headers"], ["All"]))
    return out


def send_message(st: ServerState, request: Request, p: Principal, params: dict[str, Any]
                 ) -> dict[str, Any]:
    topic = topic_of(params.get("QueueUrl"))
    _may(p, "send", topic)
    entry = _message(topic, params)
    result = st.queue.send(topic, entry["payload"], key=entry["key"], delay=entry["delay"],
                           headers=entry["headers"])
    st.metrics.sent.labels(topic).inc()
    st.wake_threadsafe(topic)
    return _sent(entry, result.id)


_BATCH_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")  # SQS's rule for a batch entry's Id


def _entries(params: dict[str, Any]) -> list[dict[str, Any]]:
    entries = params.get("Entries")
    if not isinstance(entries, list) or not entries:
        raise SqsError("EmptyBatchRequest", "There should be at least one entry in the "
                       "request.")
    if len(entries) > BATCH_MAX:
        raise SqsError("TooManyEntriesInBatchRequest", f"Maximum number of entries per "
                       f"request is {BATCH_MAX}.")
    ids = [e.get("Id") if isinstance(e, dict) else None for e in entries]
    if any(not isinstance(i, str) or not _BATCH_ID.fullmatch(i) for i in ids):
        raise SqsError("InvalidBatchEntryId", "A batch entry Id can only contain alphanumeric "
                       "characters, hyphens and underscores. It can be at most 80 letters long.")
    if len(set(ids)) != len(ids):
        raise SqsError("BatchEntryIdsNotDistinct", "Two or more batch entries have the same "
                       "Id.")
    return entries


def _failed(entry_id: str, exc: Exception) -> dict[str, Any]:
    err = exc if isinstance(exc, SqsError) else _library_error(exc)  # type: ignore[arg-type]
    return {"Id": entry_id, "SenderFault": _AWS.get(err.code, ("", 400))[1] < 500,
            "Code": err.code, "Message": err.message}


def send_message_batch(st: ServerState, request: Request, p: Principal,
                       params: dict[str, Any]) -> dict[str, Any]:
    topic = topic_of(params.get("QueueUrl"))
    _may(p, "send", topic)
    ok, failed = [], []
    good: list[tuple[str, dict[str, Any]]] = []
    for e in _entries(params):
        try:
            good.append((e["Id"], _message(topic, e)))
        except SqsError as exc:
            failed.append(_failed(e["Id"], exc))
    if good:
        items = [{k: v for k, v in entry.items() if v is not None} for _, entry in good]
        try:
            results: list[SendResult | Exception] = list(st.queue.send_many(topic, items))
        except TableqError as exc:
            if status_of(exc) >= 500:
                raise
            # An entry the library refuses (the queue's own payload limit, ...): nothing was
            # sent, so each entry is sent alone and fails alone, as in SQS; from here even a
            # database failure is one entry's, so that the answer says which were sent.
            results = [_send_alone(st, topic, item) for item in items]
        for (entry_id, entry), result in zip(good, results, strict=True):
            if isinstance(result, Exception):
                failed.append(_failed(entry_id, result))
            else:
                ok.append({"Id": entry_id, **_sent(entry, result.id)})
        sent = sum(not isinstance(r, Exception) for r in results)
        if sent:
            st.metrics.sent.labels(topic).inc(sent)
            st.wake_threadsafe(topic)
    return {"Successful": ok, "Failed": failed}


def _send_alone(st: ServerState, topic: str, item: dict[str, Any]) -> SendResult | Exception:
    try:
        return st.queue.send(topic, **item)
    except TableqError as exc:
        return exc


async def _receive(st: ServerState, request: Request, p: Principal, params: dict[str, Any]
                   ) -> dict[str, Any]:
    from tableq.server.api import give_back, long_poll

    topic = topic_of(params.get("QueueUrl"))
    _may(p, "consume", topic)
    most = _int(params, "MaxNumberOfMessages", 1, 1, RECEIVE_MAX)
    vt = _int(params, "VisibilityTimeout", None, 0, VISIBILITY_MAX_S)
    wait = _int(params, "WaitTimeSeconds", 0, 0, WAIT_MAX_S)
    wanted_attrs = _names(params, "MessageAttributeNames")
    system = set(_names(params, "AttributeNames")) | set(
        _names(params, "MessageSystemAttributeNames"))

    def take() -> list[Message]:
        return st.queue.receive(topic, max=most or 1, visibility_timeout=vt)

    msgs = await long_poll(request, st, topic, float(wait or 0), take,
                           recheck=lambda: _still_active(st, request))
    try:
        return _received(msgs, wanted_attrs, system)
    except Exception:
        await run_in_threadpool(give_back, st.queue, msgs)  # leased, never delivered
        raise


def _received(msgs: list[Message], wanted_attrs: list[str], system: set[str]
              ) -> dict[str, Any]:
    out = []
    for m in msgs:
        body = body_text(m.payload)
        item: dict[str, Any] = {"MessageId": str(m.id), "ReceiptHandle": receipt_handle(m),
                                "MD5OfBody": md5_hex(body), "Body": body}
        attrs = _attributes(m.headers, wanted_attrs)
        if attrs:
            item["MessageAttributes"] = attrs
            item["MD5OfMessageAttributes"] = attributes_md5(attrs)
        if system:
            every = {"ApproximateReceiveCount": str(m.attempts),
                     "SentTimestamp": _millis(m.created_at),
                     "ApproximateFirstReceiveTimestamp": _millis(m.received_at),
                     "SenderId": "tableq"}
            if m.key is not None:
                every["MessageDeduplicationId"] = m.key
            item["Attributes"] = {k: v for k, v in every.items()
                                  if "All" in system or k in system}
        out.append(item)
    return {"Messages": out} if out else {}


def _held(st: ServerState, p: Principal, topic: str, handle: Any) -> Message:
    """The message a receipt handle names, as held under its lease, after checking the row's
    topic against the queue and the token's scopes."""
    msg_id, lease = parse_handle(handle)
    row = st.queue.get(msg_id)
    if row is None or row.topic != topic:
        raise SqsError("ReceiptHandleIsInvalid", "The receipt handle has expired: the message "
                       "is no longer in flight on this queue.")
    if not p.may("consume", row.topic):
        raise SqsError("AccessDenied", f"a {p.role} token may not consume this queue")
    return dataclasses.replace(row, lease=lease)


def _consumer(p: Principal, topic: str) -> None:
    if "consume" not in ROLE_ACTIONS.get(p.role, frozenset()) or not p.may("consume", topic):
        raise SqsError("AccessDenied", f"a {p.role} token may not consume this queue")


def delete_message(st: ServerState, request: Request, p: Principal, params: dict[str, Any]
                   ) -> dict[str, Any]:
    topic = topic_of(params.get("QueueUrl"))
    _consumer(p, topic)
    msg = _held(st, p, topic, params.get("ReceiptHandle"))
    st.queue.ack(msg)
    st.metrics.acked.labels(topic).inc()
    return {}


def _batch(st: ServerState, p: Principal, params: dict[str, Any],
           one: Callable[[str, dict[str, Any]], None]) -> dict[str, Any]:
    topic = topic_of(params.get("QueueUrl"))
    _consumer(p, topic)
    ok, failed = [], []
    for e in _entries(params):
        try:
            one(topic, e)
            ok.append({"Id": e["Id"]})
        except (SqsError, TableqError) as exc:
            failed.append(_failed(e["Id"], exc))
    return {"Successful": ok, "Failed": failed}


def delete_message_batch(st: ServerState, request: Request, p: Principal,
                         params: dict[str, Any]) -> dict[str, Any]:
    def one(topic: str, e: dict[str, Any]) -> None:
        st.queue.ack(_held(st, p, topic, e.get("ReceiptHandle")))
        st.metrics.acked.labels(topic).inc()
    return _batch(st, p, params, one)


def _change(st: ServerState, p: Principal, topic: str, params: dict[str, Any]) -> None:
    msg = _held(st, p, topic, params.get("ReceiptHandle"))
    vt = _int(params, "VisibilityTimeout", None, 0, VISIBILITY_MAX_S)
    if vt is None:
        raise SqsError("MissingParameter", "The request must contain the parameter "
                       "VisibilityTimeout.")
    if vt == 0:
        # Visible again at once; the receive still counts, as in SQS.
        st.queue.nack(msg, delay=0)
        st.wake_threadsafe(topic)
    else:
        st.queue.heartbeat(msg, extend=vt)


def change_message_visibility(st: ServerState, request: Request, p: Principal,
                              params: dict[str, Any]) -> dict[str, Any]:
    topic = topic_of(params.get("QueueUrl"))
    _consumer(p, topic)
    _change(st, p, topic, params)
    return {}


def change_message_visibility_batch(st: ServerState, request: Request, p: Principal,
                                    params: dict[str, Any]) -> dict[str, Any]:
    return _batch(st, p, params, lambda topic, e: _change(st, p, topic, e))


def purge_queue(st: ServerState, request: Request, p: Principal, params: dict[str, Any]
                ) -> dict[str, Any]:
    topic = topic_of(params.get("QueueUrl"))
    _may(p, "manage", topic)
    st.queue.purge(topic)
    return {}


def _receive_marker(*args: Any) -> Any:  # ReceiveMessage is async (long polling)
    raise AssertionError("unreachable")


ACTIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "CreateQueue": create_queue,
    "GetQueueUrl": create_queue,
    "ListQueues": list_queues,
    "GetQueueAttributes": get_queue_attributes,
    "SendMessage": send_message,
    "SendMessageBatch": send_message_batch,
    "ReceiveMessage": _receive_marker,
    "DeleteMessage": delete_message,
    "DeleteMessageBatch": delete_message_batch,
    "ChangeMessageVisibility": change_message_visibility,
    "ChangeMessageVisibilityBatch": change_message_visibility_batch,
    "PurgeQueue": purge_queue,
}
