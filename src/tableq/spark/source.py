"""The `tableq` data source: the DataSource (schemas; its writers come from sink.py), the batch
reader (snapshots of live messages, dead letters and the archive of done messages) and the
lease-based stream reader. No SQL here: every database step is a Queue method; this module
maps Spark's read protocols onto them."""

from __future__ import annotations

import json
import json.encoder
import json.scanner
import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from tableq.spark._queues import bulk_for, queue_for
from tableq.spark._seam import point
from tableq.spark.options import ReadOptions, StreamOptions
from tableq.spark.sink import TableqStreamWriter, TableqWriter, batch_writer, stream_writer

log = logging.getLogger("tableq.spark")

_COMMON = ("id long, topic string, key string, kind string, payload string, "
           "payload_bytes binary, headers map<string,string>, priority int, attempts int, "
           "created_at timestamp, ")
LIVE_SCHEMA = (_COMMON + "available_at timestamp, first_available_at timestamp, "
               "received_at timestamp, lease string")
DEAD_SCHEMA = (_COMMON + "first_available_at timestamp, received_at timestamp, error string, "
               "dead_at timestamp")
DONE_SCHEMA = (_COMMON + "first_available_at timestamp, received_at timestamp, "
               "done_at timestamp, lease string")
SCHEMAS = {"live": LIVE_SCHEMA, "dead": DEAD_SCHEMA, "done": DONE_SCHEMA}
# Re-reading a batch's lease on replay must not be outrun by its expiry.
ACK_WINDOW_ON_START = 3
CLAIM_CHUNK = 10_000  # receive_batch's largest `max`
# Chunks claimed at once: a 50,000-row claim took 0.29-0.49 s instead of 0.32-0.80 s with 2.
CLAIM_PARALLEL = 2
# read() extends a batch's lease only when less than this share of leaseSeconds is left.
EXTEND_WHEN_LEFT = 0.9


def _columns(schema: str) -> list[str]:
    return [part.strip().split(" ", 1)[0] for part in schema.split(",")]


def to_tuple(row: dict[str, Any], columns: Sequence[str]) -> tuple[Any, ...]:
    """A queue row (from history() or a Message) as a tuple in schema order: JSON payloads as
    JSON text in `payload`, byte payloads in `payload_bytes`."""
    out: list[Any] = []
    payload = row.get("payload")
    for name in columns:
        if name == "payload":
            out.append(None if isinstance(payload, (bytes, bytearray)) else
                       json.dumps(payload, ensure_ascii=False, separators=(",", ":")))
        elif name == "payload_bytes":
            out.append(bytes(payload) if isinstance(payload, (bytes, bytearray)) else None)
        elif name == "headers":
            out.append(row.get("headers") or {})
        else:
            out.append(row.get(name))
    return tuple(out)


ARROW_BATCH_ROWS = 10_000


def arrow_batches(rows: Iterator[dict[str, Any]], schema: StructType) -> Iterator[Any]:
    """Queue rows as Arrow record batches in the exact Arrow schema Spark expects for
    `schema` (what pyspark itself derives), built column by column: much cheaper than
    yielding tuples, which Spark converts value by value."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    pa_schema = to_arrow_schema(schema, timezone="UTC")
    columns = schema.fieldNames()
    chunk: list[list[Any]] = [[] for _ in columns]
    n = 0
    for row in rows:
        for i, value in enumerate(to_tuple(row, columns)):
            chunk[i].append(value)
        n += 1
        if n == ARROW_BATCH_ROWS:
            yield pa.RecordBatch.from_arrays(chunk, schema=pa_schema)
            chunk, n = [[] for _ in columns], 0
    if n:
        yield pa.RecordBatch.from_arrays(chunk, schema=pa_schema)


# json.loads / json.dumps without their per-call wrappers (a 50,000-row batch makes 100,000
# calls): the same decoder and the same compact encoder the reader has always used.
# (typeshed types make_scanner's argument as a scanner, not the decoder it takes.)
_scan_json = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


def _compact_encoder() -> Any:
    """json.dumps(value, ensure_ascii=False, separators=(",", ":")), as a function. The C
    encoder is made once here; JSONEncoder.encode makes a new one for every value."""
    encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
    try:
        make = json.encoder.c_make_encoder  # type: ignore[attr-defined]
        c_encode = make(None, encoder.default, json.encoder.encode_basestring, None, ":", ",",
                        False, False, True)

        def encode(value: Any) -> str:
            return "".join(c_encode(value, 0))

        probe = {"a": [1, 2.5, None, True, "é\n"], "b": {}}
        if encode(probe) == encoder.encode(probe):
            return encode
    except (AttributeError, TypeError):  # another Python's json: the plain way
        pass
    return encoder.encode


_compact_json = _compact_encoder()


def _json_value(text: str) -> Any:
    try:
        value, end = _scan_json(text, 0)
    except (StopIteration, ValueError):
        end = -1
    return value if end == len(text) else json.loads(text)  # json.loads says what is wrong


def _payload_text(text: str | None) -> str:
    """A stored JSON payload as compact JSON text (json.dumps of the decoded value; SQL NULL
    is JSON null, as it decodes to None)."""
    return "null" if text is None else _compact_json(_json_value(text))


def _headers(text: str | None) -> Any:
    return {} if text is None or text == "{}" else (_json_value(text) or {})


def _lease_column(name: str, columns: dict[str, list[Any]]) -> list[Any]:
    if name == "payload":
        return [None if b is not None else _payload_text(t)
                for t, b in zip(columns["payload"], columns["payload_bytes"], strict=True)]
    if name == "payload_bytes":
        return [None if b is None else bytes(b) for b in columns["payload_bytes"]]
    if name == "headers":
        return [_headers(t) for t in columns["headers"]]
    return columns.get(name) or [None] * len(columns["id"])


def lease_batches(columns: dict[str, list[Any]], schema: StructType) -> Iterator[Any]:
    """The columns of Bulk.leased_rows as Arrow record batches in the exact Arrow schema
    Spark expects for `schema`: the values arrow_batches gives for the same messages, built
    a column at a time with no Message, dict or tuple per row in between."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    if not columns:
        return
    pa_schema = to_arrow_schema(schema, timezone="UTC")
    arrays = [_lease_column(name, columns) for name in schema.fieldNames()]
    for start in range(0, len(columns["id"]), ARROW_BATCH_ROWS):
        yield pa.RecordBatch.from_arrays([a[start:start + ARROW_BATCH_ROWS] for a in arrays],
                                         schema=pa_schema)


class TableqDataSource(DataSource):
    """format("tableq"): url and topic options, see docs/spark.md for the rest."""

    @classmethod
    def name(cls) -> str:
        return "tableq"

    def schema(self) -> str:
        # Called at load(), for batch and stream reads alike: the place to reject bad read
        # options before a query starts (a stream's own errors surface only once it runs).
        opts = ReadOptions.parse(self.options)
        if opts.source == "live":
            StreamOptions.parse(self.options)
        return SCHEMAS[opts.source]

    def reader(self, schema: StructType) -> DataSourceReader:
        return TableqBatchReader(ReadOptions.parse(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> TableqWriter:
        return batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> TableqStreamWriter:
        return stream_writer(self.options, schema, overwrite)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = StreamOptions.parse(self.options)
        queue_for(opts.url).stats(opts.topic)  # fail at planning if the database is unusable
        return TableqStreamReader(opts, schema)


# --- batch read ---------------------------------------------------------------------------


@dataclass(frozen=True)
class IdRange(InputPartition):
    url: str = field(repr=False)  # travels to the executors; never shown (it may hold a password)
    source: str
    topic: str | None
    lo: int
    hi: int
    before: Any
    rows_per_read: int


class TableqBatchReader(DataSourceReader):
    """A snapshot partitioned by id range (Bulk.history_bounds / Bulk.history, which lease
    nothing). Bounds are taken once, at planning.

    No pushFilters: in pyspark 4.3 the partitions planned for one filtered query were reused
    for later queries of the same DataFrame (df.where("topic = 'b'").count() then df.count()
    counted only topic b). Narrow the read with the topic / lowerId / upperId options."""

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self.columns = schema.fieldNames()
        self.topic, self.lo, self.hi = opts.topic, opts.lo, opts.hi

    def partitions(self) -> Sequence[InputPartition]:
        q = bulk_for(self.opts.url)
        bounds = q.history_bounds(self.opts.source, self.topic)
        lo = max(bounds[0], self.lo or bounds[0]) if bounds else 1
        hi = min(bounds[1], self.hi if self.hi is not None else bounds[1]) if bounds else 0
        if lo > hi:  # Spark reads an empty list as one bare InputPartition: give it an empty range
            return [IdRange(self.opts.url, self.opts.source, self.topic, 1, 0, None, 1)]
        n = self.opts.num_partitions or max(1, min(64, (hi - lo + 1) // 200_000 + 1))
        step = -(-(hi - lo + 1) // n)
        return [IdRange(self.opts.url, self.opts.source, self.topic, a, min(hi, a + step - 1),
                        self.opts.before, self.opts.rows_per_read)
                for a in range(lo, hi + 1, step)]

    def read(self, partition: IdRange) -> Iterator[tuple[Any, ...]]:  # type: ignore[override]
        q = bulk_for(partition.url)

        def rows() -> Iterator[dict[str, Any]]:
            a = partition.lo
            while a <= partition.hi:
                b = min(partition.hi, a + partition.rows_per_read - 1)
                yield from q.history(partition.source, partition.topic, a, b,
                                     before=partition.before)
                a = b + 1

        yield from arrow_batches(rows(), self.schema)


# --- streaming read -----------------------------------------------------------------------


@dataclass(frozen=True)
class LeasePart(InputPartition):
    url: str = field(repr=False)
    topic: str
    lease: str
    k: int
    n: int
    lease_seconds: float
    ids: tuple[int, int] | None = None


@dataclass(frozen=True)
class _Ahead:
    """Batch `seq` of `epoch`, being leased in the background (the prefetch option)."""

    epoch: str
    seq: int
    future: Future[list[int]]
    started: float  # time.monotonic() when its claim began

    @property
    def token(self) -> str:
        return _token(self.epoch, self.seq)


def _token(epoch: str, seq: int) -> str:
    """The lease token of micro-batch `seq` of `epoch`."""
    return f"{epoch}:{seq}"


def _seq(offset: dict[str, Any]) -> int:
    return int(offset["seq"])


def _ids(offset: dict[str, Any]) -> tuple[int, int] | None:
    """The id range of the offset's batch (absent in offsets written before it was kept)."""
    return (int(offset["lo"]), int(offset["hi"])) if "lo" in offset else None


class TableqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are {"epoch", "seq", "lo", "hi"}: micro-batch `seq` is the set of messages
    leased under the token "<epoch>:<seq>", whose ids lie in lo..hi (so reading, extending and
    acking the batch are primary-key range lookups). The epoch is chosen once and then
    carried by the checkpoint.

    latestOffset(start) runs on the driver only after batch `start` is durably committed by
    Spark, so it first acknowledges every lease <= start (Spark's own commit(end) for a batch
    comes only with the next batch, and never for the last one), then leases the next batch.
    A replayed batch is re-read by its lease token: the same messages as the first time."""

    def __init__(self, opts: StreamOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self.columns = schema.fieldNames()
        self.epoch = uuid.uuid4().hex[:16]
        self._acked: tuple[str, int] | None = None
        self._first_claim = True
        self._budget: int | None = None
        self._ahead: _Ahead | None = None
        self._ahead_pool: ThreadPoolExecutor | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader once for its read tasks: a batch leased ahead, and the
        # thread that leases it, stay with the driver's instance.
        return {**self.__dict__, "_ahead": None, "_ahead_pool": None}

    def _q(self) -> Any:
        return bulk_for(self.opts.url, retention=self.opts.retention)

    def initialOffset(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "seq": 0}  # the same on every call (Spark calls it twice)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.opts.max_rows)

    def prepareForTriggerAvailableNow(self) -> None:
        # The stream ends after this many messages (those due now) or when none is left.
        # Counted, not estimated: a short estimate of a big topic would end the stream early.
        s = self._q().queue.stats(self.opts.topic, exact=True)[0]
        self._budget = s.ready
        log.info("tableq.available_now topic=%s budget=%d", self.opts.topic, s.ready)

    def _ack_through(self, epoch: str, seq: int, ids: tuple[int, int] | None) -> None:
        """Acks the batches through `seq`; `ids` is the id range of batch `seq` itself."""
        q = self._q()
        if self._acked is not None and self._acked[0] == epoch:
            first = self._acked[1] + 1
        else:  # a fresh driver: the batches just before `start` may still be leased
            first = max(1, seq - ACK_WINDOW_ON_START)
        acked = 0
        for s in range(first, seq + 1):
            acked += q.ack_lease(self.opts.topic, _token(epoch, s),
                                 ids=ids if s == seq else None)
        if acked:
            log.debug("tableq.stream_acked topic=%s through=%s:%d messages=%d",
                      self.opts.topic, epoch, seq, acked)
        self._acked = (epoch, max(seq, self._acked[1] if self._acked and
                                  self._acked[0] == epoch else 0))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        epoch, seq = start["epoch"], _seq(start)
        self._ack_through(epoch, seq, _ids(start))
        want = limit.max_rows if isinstance(limit, ReadMaxRows) else self.opts.max_rows
        token = _token(epoch, seq + 1)
        q = self._q()
        held: list[int] = []  # ids
        if self._first_claim:
            # A previous driver may have leased this batch and died before Spark logged its
            # offset: those messages are already ours under the same token, so keep them.
            # The batch it leased ahead (the one after) is given back, due now.
            self._first_claim = False
            held = [m.id for m in q.leased_messages(self.opts.topic, token)]
            if held:
                q.extend_lease(self.opts.topic, token, self.opts.lease_seconds)
                log.info("tableq.stream_orphans_reclaimed lease=%s messages=%d", token,
                         len(held))
            released = self._give_back(q, _token(epoch, seq + 2))
            if self._budget is not None:  # not ready when the budget was counted
                self._budget += released
        ahead = self._take_ahead(q, epoch, seq + 1)
        # AvailableNow: at most the messages that were ready when the run started.
        room = max(0, want - len(held) - len(ahead))
        if self._budget is not None:
            room = min(room, self._budget)
        claimed = self._claim(q, token, room)
        if self._budget is not None:
            self._budget -= len(claimed)
        got = held + ahead + claimed
        if not got:
            return start
        # Leased in the database, not yet in Spark's offset log: tests kill the process here.
        point("source.stream_leased", topic=self.opts.topic, seq=seq + 1, rows=len(got))
        self._lease_ahead(q, epoch, seq + 2, want)
        return {"epoch": epoch, "seq": seq + 1, "lo": min(got), "hi": max(got)}

    def _lease_ahead(self, q: Any, epoch: str, seq: int, want: int) -> None:
        """Starts leasing batch `seq` in the background while Spark runs the batch before it
        (option prefetch): its claim then overlaps the reading instead of following it."""
        room = want if self._budget is None else min(want, self._budget)
        if not self.opts.prefetch or room <= 0:
            return
        token = _token(epoch, seq)

        def lease() -> list[int]:
            ids = self._claim(q, token, room)
            point("source.stream_prefetched", topic=self.opts.topic, seq=seq, rows=len(ids))
            return ids

        if self._ahead_pool is None:
            self._ahead_pool = ThreadPoolExecutor(1, thread_name_prefix="tableq-ahead")
        self._ahead = _Ahead(epoch, seq, self._ahead_pool.submit(lease), time.monotonic())

    def _take_ahead(self, q: Any, epoch: str, seq: int) -> list[int]:
        """The ids leased ahead for batch `seq` ([] if none were), charged to the budget. A
        batch leased ahead for another batch is given back."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return []
        ids = self._ahead_ids(q, ahead)
        if (ahead.epoch, ahead.seq) != (epoch, seq):
            self._give_back(q, ahead.token, ids)
            return []
        lease_s = self.opts.lease_seconds
        if ids and time.monotonic() - ahead.started > lease_s * (1 - EXTEND_WHEN_LEFT):
            # Leased a while ago (a long trigger interval): renewed before any read task
            # reads it, as read() renews only in task 0.
            q.extend_lease(self.opts.topic, ahead.token, lease_s, ids=(min(ids), max(ids)),
                           ending_within=lease_s * EXTEND_WHEN_LEFT)
        if self._budget is not None:
            self._budget -= len(ids)
        return ids

    def _ahead_ids(self, q: Any, ahead: _Ahead) -> list[int]:
        """What the lease ahead took; if it failed, what its token holds (a claim that failed
        may have leased some of its chunks)."""
        try:
            return ahead.future.result()
        except Exception as exc:  # noqa: BLE001 - recovered here, or raised from here
            log.warning("tableq.stream_lease_ahead_failed lease=%s error=%s", ahead.token, exc)
            return [m.id for m in q.leased_messages(self.opts.topic, ahead.token)]

    def _give_back(self, q: Any, token: str, ids: list[int] | None = None) -> int:
        """Releases what `token` holds (within the span of `ids`, when known), unread."""
        if ids == []:
            return 0
        span = (min(ids), max(ids)) if ids else None
        released: int = q.release_lease(self.opts.topic, token, ids=span)
        if released:
            log.info("tableq.stream_lease_given_back lease=%s messages=%d", token, released)
        return released

    def _claim(self, q: Any, token: str, room: int) -> list[int]:
        """Leases up to `room` due messages under `token`, in chunks of CLAIM_CHUNK, up to
        CLAIM_PARALLEL chunks at a time on connections of their own: SKIP LOCKED keeps the
        chunks disjoint, so together they take what one chunk after another would, while
        the database sorts and writes on more than one core."""
        def chunk(size: int) -> list[int]:
            ids: list[int] = q.lease_batch(self.opts.topic, token, max=size,
                                           visibility_timeout=self.opts.lease_seconds,
                                           max_attempts=self.opts.max_attempts)
            return ids

        claimed: list[int] = []
        with ThreadPoolExecutor(CLAIM_PARALLEL, thread_name_prefix="tableq-claim") as pool:
            while len(claimed) < room:
                left = room - len(claimed)
                sizes = [min(CLAIM_CHUNK, left - a)
                         for a in range(0, min(left, CLAIM_CHUNK * CLAIM_PARALLEL), CLAIM_CHUNK)]
                found = list(pool.map(chunk, sizes)) if len(sizes) > 1 else [chunk(sizes[0])]
                for ids in found:
                    claimed += ids
                if not all(found):  # nothing left that is due and not leased
                    break
        return claimed

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        hi = _seq(end)
        lo = _seq(start) if start.get("epoch") == end.get("epoch") else hi - 1
        return [LeasePart(self.opts.url, self.opts.topic, _token(end["epoch"], s), k,
                          self.opts.num_partitions, self.opts.lease_seconds,
                          _ids(end) if s == hi else None)
                for s in range(lo + 1, hi + 1) for k in range(self.opts.num_partitions)]

    def read(self, partition: LeasePart) -> Iterator[tuple[Any, ...]]:  # type: ignore[override]
        q = bulk_for(partition.url)
        if partition.k == 0:  # a replay may come late: keep the batch's messages ours
            # ...but only a lease with less than nine tenths of leaseSeconds left (a replay's,
            # or one taken a while ago): a batch leased a moment ago keeps its lease, as
            # rewriting every row of it costs nearly as much as the claim did.
            q.extend_lease(partition.topic, partition.lease, partition.lease_seconds,
                           ids=partition.ids,
                           ending_within=partition.lease_seconds * EXTEND_WHEN_LEFT)
        columns = q.leased_rows(partition.topic, partition.lease, ids=partition.ids,
                                share=(partition.k, partition.n))
        yield from lease_batches(columns, self.schema)

    def commit(self, end: dict[str, Any]) -> None:
        self._ack_through(end["epoch"], _seq(end), _ids(end))

    def stop(self) -> None:
        # The batch leased ahead goes back, due now: Spark has not logged it (it does only
        # once latestOffset returns it), so no replay can ask for it. pyspark 4.3 usually
        # ends this process (SIGTERM) before calling stop(); then the batch ahead, like the
        # last batch run, stays leased until a restart takes it over or leaseSeconds runs out.
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            q = self._q()
            self._give_back(q, ahead.token, self._ahead_ids(q, ahead))
        if self._ahead_pool is not None:
            self._ahead_pool.shutdown(wait=False)
        log.debug("tableq.stream_stopped topic=%s", self.opts.topic)
