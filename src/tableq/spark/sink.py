"""The `tableq` sink: the batch and streaming writers (built here for the DataSource in
source.py), which stage rows invisibly and publish them in one transaction on the driver. No
SQL here: staging, publishing and discarding are Queue methods; this module maps Spark columns
to queue items and Spark's commit protocol to them."""

from __future__ import annotations

import logging
import secrets
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from json.encoder import encode_basestring
from typing import Any, cast

import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from tableq.codecs import EncodedJson, JsonText
from tableq.errors import InvalidArgument
from tableq.spark._queues import bulk_for, ensure_kinds
from tableq.spark._seam import point
from tableq.spark.options import WRITE_COLUMNS, OptionError, WriteOptions

log = logging.getLogger("tableq.spark")

INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
NUMERIC = INTEGRAL + (FloatType, DoubleType, DecimalType)
# The payload column: JSON from strings, numbers, booleans, structs, maps and arrays, or bytes.
PAYLOAD_TYPES = NUMERIC + (StringType, BinaryType, BooleanType, StructType, MapType, ArrayType,
                           NullType)


class ColumnError(InvalidArgument):
    """The DataFrame given to the sink has a column the queue cannot take."""

    def __init__(self, column: str, problem: str) -> None:
        self.column = column
        super().__init__(f"tableq sink column {column!r}: {problem}")


def check_write_schema(schema: StructType) -> tuple[tuple[str, DataType], ...]:
    """The (name, type) plan of the sink's input; raises ColumnError at planning time."""
    names = [f.name for f in schema.fields]
    lowered = [n.lower() for n in names]
    if "payload" not in names:
        raise ColumnError("payload", f"is required; the DataFrame has only {names}; "
                          "e.g. df.select(struct(*df.columns).alias('payload'))")
    for f in schema.fields:
        if f.name not in WRITE_COLUMNS:
            hint = (f" (columns are case-sensitive: use {f.name.lower()!r})"
                    if f.name.lower() in WRITE_COLUMNS else "")
            raise ColumnError(f.name, f"unknown column{hint}; the sink takes "
                              f"{', '.join(WRITE_COLUMNS)}: select or rename columns first, "
                              "e.g. df.select(to_json(struct(...)).alias('payload'))")
    if len(set(lowered)) != len(lowered):
        raise ColumnError(names[0], "duplicate column names")
    if "delay_s" in names and "available_at" in names:
        raise ColumnError("available_at", "give either delay_s or available_at, not both")
    expected: dict[str, tuple[tuple[type, ...], str]] = {
        "payload": (PAYLOAD_TYPES, "string, binary, number, boolean, struct, map or array"),
        # As the source reads them: a non-null payload_bytes wins over payload for its row.
        "payload_bytes": ((BinaryType,), "binary"),
        "topic": ((StringType,), "string"),
        "key": ((StringType,), "string"),
        "kind": ((StringType,), "string"),
        "headers": ((MapType, StructType), "map<string,string> or a struct of strings"),
        "priority": (INTEGRAL, "an integer type"),
        "delay_s": (NUMERIC, "a number of seconds"),
        "available_at": ((TimestampType,), "timestamp (with time zone, not timestamp_ntz)"),
    }
    for f in schema.fields:
        types, wanted = expected[f.name]
        if not isinstance(f.dataType, types):
            raise ColumnError(f.name, f"has type {f.dataType.simpleString()}, must be {wanted}")
    headers = next((f for f in schema.fields if f.name == "headers"), None)
    if headers is not None:
        dt = headers.dataType
        values = ([dt.keyType, dt.valueType] if isinstance(dt, MapType)
                  else [x.dataType for x in cast(StructType, dt).fields])
        if not all(isinstance(v, StringType) for v in values):
            raise ColumnError("headers", f"has type {dt.simpleString()}; keys and values must "
                              "be strings")
    return tuple((f.name, f.dataType) for f in schema.fields)


def _plain(dt: DataType) -> bool:
    """True when Arrow's to_pylist already gives JSON-able values for this type (structs as
    dicts, lists, numbers, strings, booleans), so no per-row conversion is needed."""
    if isinstance(dt, StructType):
        return all(_plain(f.dataType) for f in dt.fields)
    if isinstance(dt, ArrayType):
        return _plain(dt.elementType)
    return isinstance(dt, INTEGRAL + (FloatType, DoubleType, StringType, BooleanType, NullType))


def _jsonable(dt: DataType) -> Callable[[Any], Any]:
    """Converts what Arrow's to_pylist gives for a Spark type into a JSON-able value."""
    if _plain(dt):
        return lambda v: v
    if isinstance(dt, StructType):
        subs = [(f.name, _jsonable(f.dataType)) for f in dt.fields]
        return lambda v: None if v is None else {n: c(v.get(n)) for n, c in subs}
    if isinstance(dt, MapType):
        kc, vc = _jsonable(dt.keyType), _jsonable(dt.valueType)
        return lambda v: None if v is None else {str(kc(k)): vc(x) for k, x in v}
    if isinstance(dt, ArrayType):
        ec = _jsonable(dt.elementType)
        return lambda v: None if v is None else [ec(x) for x in v]
    if isinstance(dt, DecimalType):
        return lambda v: None if v is None else (int(v) if dt.scale == 0 else float(v))
    if isinstance(dt, (TimestampType, TimestampNTZType, DateType)):
        return lambda v: None if v is None else v.isoformat()
    if isinstance(dt, BinaryType):
        return lambda v: None if v is None else bytes(v).hex()
    return lambda v: v


def _payload_converter(dt: DataType, payload_format: str) -> Callable[[Any], Any]:
    if isinstance(dt, BinaryType):
        return lambda v: bytes(v) if v is not None else None
    if isinstance(dt, StringType) and payload_format == "json":
        # Stored as given after a syntax check (Queue refuses text that is not JSON).
        return lambda v: JsonText(v) if v is not None else None
    return _jsonable(dt)


# JSON for Arrow columns of these Spark types is made column by column, without building a
# dict per row: a bulk load's Python time was mostly dicts and their encoding.
_TEMPLATE_TYPES = INTEGRAL + (StringType, BooleanType, FloatType, DoubleType)


def _column_json(arr: Any, dt: DataType) -> list[Any] | None:
    """JSON texts (or values %s-formatting turns into JSON) for one Arrow column of a plain
    type, or None when the column needs the general path (nested lists, maps, NaN, ...)."""
    if isinstance(dt, StructType):
        return _struct_json(arr, dt)
    if not isinstance(dt, _TEMPLATE_TYPES):
        return None
    if isinstance(dt, (FloatType, DoubleType)) and (
            pc.any(pc.invert(pc.is_finite(arr))).as_py()):
        return None  # NaN and infinities: the general path refuses them with its message
    values = arr.to_pylist()
    if isinstance(dt, StringType):
        return [encode_basestring(v) if v is not None else "null" for v in values]
    if isinstance(dt, BooleanType):
        return ["null" if v is None else "true" if v else "false" for v in values]
    if isinstance(dt, (FloatType, DoubleType)):
        return [float.__repr__(v) if v is not None else "null" for v in values]
    return values if arr.null_count == 0 else ["null" if v is None else v for v in values]


def _struct_json(arr: Any, dt: StructType) -> list[str] | None:
    names = [f.name for f in dt.fields]
    if not names or len(set(names)) != len(names):
        return None
    columns = []
    for i, f in enumerate(dt.fields):
        col = _column_json(arr.field(i), f.dataType)
        if col is None:
            return None
        columns.append(col)
    fmt = "{" + ",".join(encode_basestring(n).replace("%", "%%") + ":%s" for n in names) + "}"
    texts = [fmt % row for row in zip(*columns, strict=True)]
    if arr.null_count:  # a null struct is JSON null, whatever its children hold
        valid = arr.is_valid().to_pylist()
        texts = [t if ok else "null" for t, ok in zip(texts, valid, strict=True)]
    return texts


def _headers(v: Any) -> dict[str, str] | None:
    if v is None:
        return None
    pairs = v.items() if isinstance(v, dict) else v
    return {k: x for k, x in pairs if x is not None} or None


def _at(v: Any) -> datetime | None:
    if v is None:
        return None
    when: datetime = v if v.tzinfo is not None else v.replace(tzinfo=UTC)
    return when


def _delay(v: Any) -> float | None:
    if v is None:
        return None
    return float(v) if not isinstance(v, Decimal) else float(v)


class RowMapper:
    """Turns Arrow record batches of the checked schema into (topic, queue item) pairs."""

    def __init__(self, plan: tuple[tuple[str, DataType], ...], opts: WriteOptions) -> None:
        self.plan, self.opts = plan, opts
        self.columns = {name for name, _ in plan}

    def json_texts(self, batch: Any) -> tuple[str, list[str]] | None:
        """(topic, the payloads as JSON texts) when the rows are bare payloads for the `topic`
        option (no other column) in a struct of plain fields: a bulk load's common case,
        staged without an item per row. None otherwise: items() then."""
        dt, topic = dict(self.plan)["payload"], self.opts.topic
        if self.columns != {"payload"} or topic is None or not isinstance(dt, StructType):
            return None
        texts = _struct_json(batch.column("payload"), dt)
        return None if texts is None else (topic, texts)

    def payloads(self, batch: Any) -> list[Any]:
        """The payload column as values stage_many takes: JSON text built column-wise for
        structs of plain fields, converted values otherwise."""
        dt = dict(self.plan)["payload"]
        arr = batch.column("payload")
        if isinstance(dt, StructType):
            texts = _struct_json(arr, dt)
            if texts is not None:
                return [EncodedJson(t) for t in texts]
        values: list[Any] = arr.to_pylist()
        if not _plain(dt) or (isinstance(dt, StringType) and self.opts.payload_format == "json"):
            convert = _payload_converter(dt, self.opts.payload_format)
            values = [convert(v) for v in values]
        return values

    def items(self, batch: Any) -> dict[str, list[Any]]:
        types = dict(self.plan)
        payloads = self.payloads(batch)
        if set(types) == {"payload"} and self.opts.topic is not None:
            # A bare value is a payload for stage_many, unless it is a dict with a "payload"
            # field (then it must be wrapped to stay the payload).
            return {self.opts.topic: [{"payload": v} if isinstance(v, dict) and "payload" in v
                                      else v for v in payloads]}
        cols = {name: batch.column(name).to_pylist() for name in types if name != "payload"}
        n = batch.num_rows
        out: dict[str, list[Any]] = {}
        topics = cols.get("topic")
        raw = cols.get("payload_bytes")
        for i in range(n):
            if raw is not None and raw[i] is not None:
                item: dict[str, Any] = {"payload": bytes(raw[i])}
            else:
                item = {"payload": payloads[i]}
            if "key" in cols:
                item["key"] = cols["key"][i]
            if "kind" in cols and cols["kind"][i] is not None:
                item["kind"] = cols["kind"][i]
            if "headers" in cols:
                item["headers"] = _headers(cols["headers"][i])
            if "priority" in cols and cols["priority"][i] is not None:
                item["priority"] = int(cols["priority"][i])
            if "delay_s" in cols and cols["delay_s"][i] is not None:
                item["delay"] = _delay(cols["delay_s"][i])
            if "available_at" in cols and cols["available_at"][i] is not None:
                item["at"] = _at(cols["available_at"][i])
            topic = topics[i] if topics is not None else None
            if topic is None:  # only a null falls back to the option: "" is refused below
                topic = self.opts.topic
            if topic is None:
                raise InvalidArgument(f"row {i} has a null topic and no 'topic' option is set")
            out.setdefault(topic, []).append(item)
        return out


@dataclass(frozen=True)
class StagedPart(WriterCommitMessage):
    """What a write task reports to the driver: the task attempt's rows are staged under
    (job, part). Only these messages reach commit(); nothing a task sets on self does."""

    job: str
    part: int
    partition: int
    rows: int


RUN_BITS = 31  # a writer run's random number, above the task attempt id's 32 bits


def new_run() -> int:
    """A writer run's number (drawn on the driver when the writer is made): a part number is
    (run << 32) | task attempt id, because task attempt ids start again at 0 in every Spark
    application, so a rerun of a job after its driver died would otherwise stage onto the
    dead run's open parts (and its publish find more rows than its tasks reported)."""
    return secrets.randbelow(1 << RUN_BITS)


def stage_task(plan: tuple[tuple[str, DataType], ...], opts: WriteOptions, job: str,
               batches: Iterator[Any], run: int = 0) -> StagedPart:
    ctx = TaskContext.get()
    attempt = ctx.taskAttemptId() if ctx is not None else 0
    part = (run << 32) | (attempt & 0xFFFFFFFF)
    partition = ctx.partitionId() if ctx is not None else 0
    q = bulk_for(opts.url)
    mapper = RowMapper(plan, opts)
    rows = 0
    for batch in batches:
        # One short transaction per Arrow batch (and topic): staged rows are invisible
        # anyway, and SQLite's single writer lock is not held across a whole task.
        bare = mapper.json_texts(batch)
        if bare is not None:
            rows += q.stage_json(job, part, *bare)
        else:
            for topic, items in mapper.items(batch).items():
                kinds = ({it["kind"] for it in items if "kind" in it}
                         if "kind" in mapper.columns else set())
                if kinds:
                    ensure_kinds(q, kinds)
                rows += q.stage_many(job, part, topic, items, on_duplicate=opts.on_duplicate)
        # Staged but not reported to the driver: tests fail the task attempt here.
        point("sink.task_staged", job=job, part=part, partition=partition, rows=rows,
              attempt=ctx.attemptNumber() if ctx is not None else None)
    return StagedPart(job, part, partition, rows)


def batch_writer(options: Mapping[str, str], schema: StructType,
                 overwrite: bool) -> TableqWriter:
    """DataSource.writer: checks the columns and options at planning, then drops the loads of
    dead drivers (the janitor: neither commit nor abort ran) older than staleJobSeconds."""
    _no_overwrite(overwrite)
    plan = check_write_schema(schema)
    opts = WriteOptions.parse(options, schema.fieldNames())
    stale = bulk_for(opts.url).cleanup_staged(older_than=opts.stale_job_seconds)
    if stale:
        log.warning("tableq.stale_loads_dropped rows=%d", stale)
    return TableqWriter(plan, opts)


def stream_writer(options: Mapping[str, str], schema: StructType,
                  overwrite: bool) -> TableqStreamWriter:
    """DataSource.streamWriter: checks the columns and options when the query starts."""
    _no_overwrite(overwrite)
    plan = check_write_schema(schema)
    return TableqStreamWriter(plan, WriteOptions.parse(options, schema.fieldNames()))


def _no_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise OptionError("mode", "overwrite is not supported: a queue is only appended to; "
                                  "use .mode('append')")


def _parts(messages: list[Any]) -> list[int]:
    return [m.part for m in messages if isinstance(m, StagedPart)]


class TableqWriter(DataSourceArrowWriter):
    """Batch write: made on the driver at planning (validated there), pickled into tasks and,
    freshly unpickled, into commit/abort."""

    def __init__(self, plan: tuple[tuple[str, DataType], ...], opts: WriteOptions) -> None:
        self.plan, self.opts = plan, opts
        self.job = opts.job_id or f"spark-{uuid.uuid4().hex}"
        self.run = new_run()

    def write(self, iterator: Iterator[Any]) -> StagedPart:
        return stage_task(self.plan, self.opts, self.job, iterator, self.run)

    def commit(self, messages: list[Any]) -> None:
        point("sink.commit", job=self.job)  # tests fail the commit here: Spark must abort
        parts = _parts(messages)
        started = time.perf_counter()
        staged = sum(m.rows for m in messages if isinstance(m, StagedPart))
        n = bulk_for(self.opts.url).publish_staged(self.job, parts,
                                                   on_duplicate=self.opts.on_duplicate,
                                                   expected_rows=staged)
        if n is None:
            log.info("tableq.load_skipped job=%s reason=already_committed", self.job)
        else:
            log.info("tableq.load_committed job=%s parts=%d staged=%d published=%d "
                     "publish_s=%.2f", self.job, len(parts), staged, n,
                     time.perf_counter() - started)

    def abort(self, messages: list[Any]) -> None:
        n = bulk_for(self.opts.url).discard_staged(self.job)
        log.warning("tableq.load_aborted job=%s discarded=%d", self.job, n)


def _batch_id() -> str:
    ctx = TaskContext.get()
    value = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
    if value is None:
        raise RuntimeError("no streaming batch id in this task; the tableq stream sink runs "
                           "only inside a streaming query")
    return value


def _query_id() -> str | None:
    ctx = TaskContext.get()
    return ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None


def stream_job(sink_name: str | None, query_id: str | None, batch_id: int | str) -> str:
    """A micro-batch's job: '[<sinkName>:]<queryId>:<batchId>'. The query id persists across
    restarts of one checkpoint, so a replayed batch finds its job committed; a new checkpoint
    is a new query whose batch ids start again at 0, and must not find the old query's jobs
    (its batches would be skipped as replays and their messages acked unpublished)."""
    if query_id:
        return f"{sink_name}:{query_id}:{batch_id}" if sink_name else f"{query_id}:{batch_id}"
    if sink_name:
        return f"{sink_name}:{batch_id}"
    raise OptionError("sinkName", "is required: no streaming query id is visible to this "
                                  "task; set .option('sinkName', 'orders-to-b')")


class TableqStreamWriter(DataSourceStreamArrowWriter):
    """Streaming write: each micro-batch is staged under its job (stream_job) and published
    by commit(); publish_staged's job ledger makes a replayed batch a no-op."""

    def __init__(self, plan: tuple[tuple[str, DataType], ...], opts: WriteOptions) -> None:
        self.plan, self.opts = plan, opts
        self.run = new_run()

    def write(self, iterator: Iterator[Any]) -> StagedPart:
        job = stream_job(self.opts.sink_name, _query_id(), _batch_id())
        return stage_task(self.plan, self.opts, job, iterator, self.run)

    def commit(self, messages: list[Any], batchId: int) -> None:
        staged = [m for m in messages if isinstance(m, StagedPart)]
        if not staged:
            return
        job = staged[0].job
        n = bulk_for(self.opts.url).publish_staged(job, _parts(staged),
                                                   on_duplicate=self.opts.on_duplicate,
                                                   expected_rows=sum(m.rows for m in staged))
        # Published, but not yet in Spark's commit log: tests kill the process here.
        point("sink.stream_published", job=job, batch_id=batchId)
        if n is None:
            log.info("tableq.batch_replayed job=%s batch=%s", job, batchId)
        else:
            log.info("tableq.batch_committed job=%s batch=%s published=%d", job, batchId, n)

    def abort(self, messages: list[Any], batchId: int) -> None:
        q = bulk_for(self.opts.url)
        for job in {m.job for m in messages if isinstance(m, StagedPart)}:
            n = q.discard_staged(job)
            log.warning("tableq.batch_aborted job=%s batch=%s discarded=%d", job, batchId, n)
