"""The JSON shapes of the /v1 API as pydantic models: strict (no type coercion), closed
(unknown fields refused: no mass assignment of ids, leases or attempts), with the limits the
server enforces written into the schema, so the OpenAPI document says what is accepted."""

from __future__ import annotations

import base64
import binascii
import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    WithJsonSchema,
    model_validator,
)

from tableq.message import PRIORITY_MAX, PRIORITY_MIN, OnDuplicate, ReceiveMode
from tableq.queue import MAX_DURATION_S

# Over HTTP, topic names are printable ASCII without leading or trailing spaces (the library
# also takes other printable Unicode); exact, so the schema and the server agree.
TOPIC_PATTERN = r"^[!-~]([ -~]{0,198}[!-~])?$"
NAME_PATTERN = r"^[!-~]([ -~]*[!-~])?$"
FIELD_PATTERN = r"^[A-Za-z_][A-Za-z0-9_\-]{0,63}$"
LEASE_MAX = 200
MAX_VISIBILITY_S = 43_200.0  # 12 h, as SQS
MAX_WAIT_S = 20.0
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


def _whole(value: Any) -> Any:
    """A JSON integer: 3 or 3.0 (JSON Schema counts both as integers), never "3" or true."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("must be an integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("must be an integer")
        return int(value)
    return value


def _only_str(value: Any) -> Any:
    if not isinstance(value, str) or not re.match(AT_PATTERN, value):
        raise ValueError("must be an RFC 3339 date-time string with a time zone, in "
                         "1970-2099")
    return value


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


# Years 1970-2099: the library takes times within 100 years of now, and a schema cannot say
# "now"; this range stays inside it for decades.
AT_PATTERN = r"^(19[7-9][0-9]|20[0-9][0-9])-"
At = Annotated[AwareDatetime, BeforeValidator(_only_str), Field(strict=False),
               WithJsonSchema({"type": "string", "format": "date-time", "pattern": AT_PATTERN})]


# Integer fields: whole numbers (2.0 passes, 2.5 does not), with bounds that the schema shows
# as minimum/maximum.
# Ids above 2**53 are not exact in JSON numbers as many clients read them (doubles).
ID_MAX = 2**53 - 1
Id = Annotated[int, Field(strict=False, ge=1, le=ID_MAX), BeforeValidator(_whole)]
Count = Annotated[int, Field(strict=False, ge=1), BeforeValidator(_whole)]
Attempts = Annotated[int, Field(strict=False, ge=1, le=1_000_000), BeforeValidator(_whole)]
Seconds = Annotated[float, Field(ge=0, le=MAX_DURATION_S)]
Topic = Annotated[str, Field(pattern=TOPIC_PATTERN, max_length=200)]
Key = Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[^\x00]*$")]
Kind = Annotated[str, Field(pattern=NAME_PATTERN, max_length=100)]
# Leases tableq hands out are printable ASCII (hex tokens); the library refuses a lease that
# is not printable, so the schema says so instead of letting such a request reach a 422.
Lease = Annotated[str, Field(min_length=1, max_length=LEASE_MAX, pattern=r"^[ -~]+$")]
HeaderName = Annotated[str, Field(pattern=NAME_PATTERN, max_length=100)]
Headers = Annotated[dict[HeaderName, Annotated[str, Field(max_length=900,
                                                          pattern=r"^[^\x00]*$")]],
                    Field(max_length=16), WithJsonSchema({
                        "type": "object", "maxProperties": 16,
                        "propertyNames": {"pattern": NAME_PATTERN, "maxLength": 100},
                        "additionalProperties": {"type": "string", "maxLength": 900,
                                                 "pattern": r"^[^\x00]*$"}})]
Priority = Annotated[int, Field(strict=False, ge=PRIORITY_MIN, le=PRIORITY_MAX),
                     BeforeValidator(_whole)]
Scalar = str | int | float | bool | None


class MessageIn(Strict):
    """One message to send: `payload` (any JSON) or `payload_base64` (raw bytes); `delay`
    (seconds) or `at` (a time), not both."""

    model_config = ConfigDict(json_schema_extra={"not": {"anyOf": [
        {"required": ["payload", "payload_base64"]}, {"required": ["delay", "at"]}]}})

    payload: Any = None
    # Not nullable: a key that is present means "this one", so "both given" is well defined.
    payload_base64: Annotated[str, Field(max_length=2_000_000,
                                         pattern=BASE64_PATTERN)] = None  # type: ignore[assignment]
    key: Key | None = None
    kind: Kind | None = None
    headers: Headers | None = None
    priority: Priority = 0
    delay: Seconds = None  # type: ignore[assignment]
    at: At = None  # type: ignore[assignment]

    @model_validator(mode="after")
    def _one_payload(self) -> MessageIn:
        given = self.model_fields_set
        if "payload_base64" in given:
            if "payload" in given:
                raise ValueError("give payload or payload_base64, not both")
            try:
                base64.b64decode(self.payload_base64, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError("payload_base64 is not valid base64") from None
        if "delay" in given and "at" in given:
            raise ValueError("give delay or at, not both")
        return self

    def body(self) -> Any:
        if self.payload_base64 is not None:
            return base64.b64decode(self.payload_base64)
        return self.payload


class SendOne(MessageIn):
    model_config = ConfigDict(json_schema_extra={"not": {"anyOf": [
        {"required": ["payload", "payload_base64"]}, {"required": ["delay", "at"]}]}})
    on_duplicate: OnDuplicate = "ignore"


class SendBatch(Strict):
    messages: Annotated[list[MessageIn], Field(min_length=1)]
    on_duplicate: OnDuplicate = "ignore"


def _send_shape(value: Any) -> str:
    return "batch" if isinstance(value, dict) and "messages" in value else "one"


# A body with "messages" is a batch and is checked only as one, so that its errors name the
# batch's own fields instead of what a single send would not accept.
SendBody = Annotated[Annotated[SendOne, Tag("one")] | Annotated[SendBatch, Tag("batch")],
                     Discriminator(_send_shape)]


class SendResultOut(BaseModel):
    id: int
    status: Literal["sent", "duplicate", "replaced"]
    key: str | None = None


class SendBatchOut(BaseModel):
    results: list[SendResultOut]


class Where(Strict):
    kind: Kind | None = None
    key: Key | None = None
    payload: Annotated[dict[Annotated[str, Field(pattern=FIELD_PATTERN)], Scalar],
                       Field(max_length=16), WithJsonSchema({
                           "type": "object", "maxProperties": 16,
                           "propertyNames": {"pattern": FIELD_PATTERN},
                           "additionalProperties": {"type": ["string", "number", "boolean",
                                                             "null"]}})] | None = None


class ReceiveIn(Strict):
    max: Count = 1
    visibility_timeout: Annotated[float, Field(ge=0, le=MAX_VISIBILITY_S)] | None = None
    wait_s: Annotated[float, Field(ge=0, le=MAX_WAIT_S)] = 0.0
    where: Where | None = None
    mode: ReceiveMode = "at_least_once"
    max_attempts: Attempts | None = None


class _StoredOut(BaseModel):
    """What a live message and a dead letter share (payload_base64 for binary payloads)."""

    id: int
    topic: str
    key: str | None
    kind: str | None
    payload: Any = None
    payload_base64: str | None = None
    headers: dict[str, str]
    priority: int
    attempts: int
    created_at: datetime


class MessageOut(_StoredOut):
    available_at: datetime
    first_available_at: datetime
    lease: str | None = None
    lease_expires_at: datetime | None = None
    last_error: str | None = None
    progress: Any = None
    received_at: datetime | None = None


class MessagesOut(BaseModel):
    messages: list[MessageOut]


class LeaseIn(Strict):
    lease: Lease


class ReleaseIn(Strict):
    lease: Lease
    delay: Seconds | None = None


class NackIn(Strict):
    lease: Lease
    delay: Seconds | None = None
    error: Annotated[str, Field(max_length=65_536)] | None = None


class HeartbeatIn(Strict):
    lease: Lease
    extend: Annotated[float, Field(ge=0, le=MAX_VISIBILITY_S)] | None = None
    progress: Any = None


class DeadLetterIn(Strict):
    lease: Lease
    error: Annotated[str, Field(min_length=1, max_length=65_536)]


class ForwardIn(MessageIn):
    lease: Lease
    topic: Topic
    on_duplicate: OnDuplicate = "ignore"


class Ref(Strict):
    id: Id
    lease: Lease


class RefsIn(Strict):
    messages: Annotated[list[Ref], Field(min_length=1)]


class HeartbeatManyIn(RefsIn):
    extend: Annotated[float, Field(ge=0, le=MAX_VISIBILITY_S)] | None = None


class SettledOut(BaseModel):
    id: int
    status: Literal["acked", "nacked", "released", "dead_lettered"]


class HeartbeatOut(BaseModel):
    id: int
    lease_expires_at: datetime


class AckManyOut(BaseModel):
    acked: list[int]
    lost: list[int]


class HeartbeatManyOut(BaseModel):
    held: list[HeartbeatOut]
    lost: list[int]


class IdsIn(Strict):
    ids: Annotated[list[Id], Field(max_length=10_000)] | None = None


class CountOut(BaseModel):
    count: int


class StatsOut(BaseModel):
    topic: str
    ready: int
    scheduled: int
    in_flight: int
    dead: int
    done: int
    oldest_ready_age: float | None
    estimated: bool = False  # counts scaled up from a sample of a big table


class StatsListOut(BaseModel):
    topics: list[StatsOut]


class TopicsOut(BaseModel):
    topics: list[str]


class DeadLetterOut(_StoredOut):
    first_available_at: datetime
    error: str | None
    dead_at: datetime


class DeadLettersOut(BaseModel):
    dead_letters: list[DeadLetterOut]


class LimitsOut(BaseModel):
    max_body_bytes: int
    max_batch: int
    max_receive: int
    max_wait_s: float


class WhoAmIOut(BaseModel):
    token_id: str
    role: str
    topics: list[str]
    name: str | None
    limits: LimitsOut


class TimeOut(BaseModel):
    now: datetime


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")
    code: str
    message: str


class ErrorOut(BaseModel):
    error: ErrorDetail


class HealthOut(BaseModel):
    status: Literal["ok", "unavailable"]
    detail: str | None = None
