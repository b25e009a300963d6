"""Every option of the `tableq` data source, parsed and checked in one place. Pure: no Spark
session, no database. Spark hands options over as case-insensitive strings; this module turns
them into typed, frozen values and says exactly which option is wrong and what it should be."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, get_args

from tableq.errors import InvalidArgument
from tableq.names import check_topic
from tableq.url import redact

SOURCES = {"live": "live", "dead": "dead", "archive": "done", "done": "done"}
SinkOnDuplicate = Literal["ignore", "replace"]  # a staged load cannot refuse ("error")
ON_DUPLICATE: tuple[SinkOnDuplicate, ...] = get_args(SinkOnDuplicate)
PAYLOAD_FORMATS = ("string", "json")
# Columns the sink understands; anything else in the DataFrame is refused at planning.
WRITE_COLUMNS = ("payload", "payload_bytes", "topic", "key", "kind", "headers", "priority",
                 "delay_s", "available_at")
MAX_ROWS_DEFAULT = 1000
LEASE_SECONDS_DEFAULT = 300.0
STALE_JOB_SECONDS_DEFAULT = 3600.0
# A stream batch's job is '<sinkName>:<queryId>:<batchId>', at most 200 characters in all.
SINK_NAME_MAX = 100


class OptionError(InvalidArgument):
    """A data-source option is missing or has a value tableq cannot use."""

    def __init__(self, option: str, problem: str) -> None:
        self.option = option
        super().__init__(f"tableq data source option {option!r}: {problem}")


def _get(opts: Mapping[str, str], name: str) -> str | None:
    # Spark lower-cases keys; a plain dict from a caller may not have.
    low = name.lower()
    for k, v in opts.items():
        if k.lower() == low:
            return None if v is None else str(v)
    return None


def _required(opts: Mapping[str, str], name: str, example: str) -> str:
    value = _get(opts, name)
    if value is None or not value.strip():
        raise OptionError(name, f"is required, e.g. .option({name!r}, {example!r})")
    return value.strip()


def _int(opts: Mapping[str, str], name: str, default: int | None, *, low: int = 1,
         high: int | None = None) -> int | None:
    raw = _get(opts, name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(name, f"must be a whole number, not {raw!r}") from None
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise OptionError(name, f"must be {bound}, not {value}")
    return value


def _float(opts: Mapping[str, str], name: str, default: float, *, low: float = 0.0) -> float:
    raw = _get(opts, name)
    if raw is None:
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise OptionError(name, f"must be a number of seconds, not {raw!r}") from None
    if not value >= low or value == float("inf"):
        raise OptionError(name, f"must be a finite number >= {low}, not {raw!r}")
    return value


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(opts, name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise OptionError(name, f"must be true or false, not {raw!r}")


def _choice(opts: Mapping[str, str], name: str, choices: Any, default: str) -> str:
    raw = _get(opts, name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in choices:
        raise OptionError(name, f"must be one of {sorted(choices)}, not {raw!r}")
    return value


def _topic(opts: Mapping[str, str], name: str = "topic", *, required: bool = True) -> str | None:
    raw = _get(opts, name)
    if raw is None:
        if required:
            raise OptionError(name, "is required, e.g. .option('topic', 'emails')")
        return None
    try:
        return check_topic(raw)
    except InvalidArgument as exc:
        raise OptionError(name, str(exc)) from None


def _time(opts: Mapping[str, str], name: str) -> datetime | None:
    """An instant as ISO 8601 (naive means UTC) or Unix seconds."""
    raw = _get(opts, name)
    if raw is None:
        return None
    text = raw.strip()
    try:
        number = float(text)
    except ValueError:
        number = None
    if number is not None:
        try:
            return datetime.fromtimestamp(number, UTC)
        except (ValueError, OverflowError, OSError):  # nan, inf, beyond year 9999
            raise OptionError(name, f"must be Unix seconds between 0 and year 9999 or an ISO "
                                    f"8601 time, not {raw!r}") from None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise OptionError(name, f"must be an ISO 8601 time or Unix seconds, not {raw!r}") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def url_of(opts: Mapping[str, str]) -> str:
    return _required(opts, "url", "postgresql://user@host/db")


class _HasURL:
    """The options carry the URL to the executors, password included; reprs leave it out
    (the dataclasses mark it repr=False) and messages use `where`."""

    url: str

    @property
    def where(self) -> str:
        return redact(self.url)


@dataclass(frozen=True)
class WriteOptions(_HasURL):
    url: str = field(repr=False)  # may hold a password: never in a repr (see where)
    topic: str | None  # None when every row names its topic in a `topic` column
    on_duplicate: SinkOnDuplicate
    payload_format: str
    job_id: str | None
    stale_job_seconds: float
    sink_name: str | None

    @classmethod
    def parse(cls, opts: Mapping[str, str], columns: list[str] | None = None) -> WriteOptions:
        url = url_of(opts)
        has_topic_column = columns is not None and "topic" in columns
        job_id = _get(opts, "jobId")
        if job_id is not None and not (1 <= len(job_id) <= 200 and job_id.isprintable()):
            raise OptionError("jobId", "must be 1-200 printable characters")
        sink = _get(opts, "sinkName")
        if sink is not None and not (1 <= len(sink) <= SINK_NAME_MAX and sink.isprintable()):
            raise OptionError("sinkName", f"must be 1-{SINK_NAME_MAX} printable characters")
        return cls(
            url=url,
            topic=_topic(opts, required=not has_topic_column),
            on_duplicate="replace" if _choice(opts, "onDuplicate", ON_DUPLICATE,
                                              "ignore") == "replace" else "ignore",
            payload_format=_choice(opts, "payloadFormat", PAYLOAD_FORMATS, "string"),
            job_id=job_id,
            stale_job_seconds=_float(opts, "staleJobSeconds", STALE_JOB_SECONDS_DEFAULT),
            sink_name=sink,
        )


@dataclass(frozen=True)
class ReadOptions(_HasURL):
    url: str = field(repr=False)
    topic: str | None
    source: str  # 'live', 'dead' or 'done'
    lo: int | None
    hi: int | None
    before: datetime | None
    num_partitions: int | None
    rows_per_read: int

    @classmethod
    def parse(cls, opts: Mapping[str, str]) -> ReadOptions:
        source = SOURCES[_choice(opts, "source", SOURCES, "live")]
        return cls(
            url=url_of(opts),
            topic=_topic(opts, required=source == "live"),
            source=source,
            lo=_int(opts, "lowerId", None),
            hi=_int(opts, "upperId", None),
            before=_time(opts, "before"),
            num_partitions=_int(opts, "numPartitions", None, high=10_000),
            rows_per_read=_int(opts, "rowsPerRead", 10_000, high=10_000) or 10_000,
        )


@dataclass(frozen=True)
class StreamOptions(_HasURL):
    url: str = field(repr=False)
    topic: str
    max_rows: int
    lease_seconds: float
    num_partitions: int
    retention: bool
    max_attempts: int | None
    prefetch: bool = True

    @classmethod
    def parse(cls, opts: Mapping[str, str]) -> StreamOptions:
        source = _get(opts, "source")
        if source is not None and source.strip().lower() != "live":
            raise OptionError("source", "a stream reads live messages only; use "
                                        "spark.read for 'dead' or 'archive'")
        return cls(
            url=url_of(opts),
            topic=_topic(opts) or "",
            max_rows=_int(opts, "maxRows", MAX_ROWS_DEFAULT, high=1_000_000) or 1,
            lease_seconds=_float(opts, "leaseSeconds", LEASE_SECONDS_DEFAULT, low=1.0),
            num_partitions=_int(opts, "numPartitions", 1, high=1000) or 1,
            retention=_bool(opts, "retention", False),
            max_attempts=_int(opts, "maxAttempts", None),
            prefetch=_bool(opts, "prefetch", True),
        )
