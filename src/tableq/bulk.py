"""Internal: the bulk and streaming plumbing the Spark layer builds on (staged loads, group
leases, snapshot reads of the history). Not part of the public API: `tableq.Queue` is, and
`tableq/__init__.py` does not export this module. `Bulk(queue)` wraps a Queue and reaches its
backend directly, validating arguments the same way the Queue does. No SQL here."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal, SupportsIndex, cast

from tableq.backends.base import GroupLease, PayloadBatch, Row
from tableq.codecs import encode_texts
from tableq.errors import InvalidArgument
from tableq.message import Message, OnDuplicate
from tableq.names import check_topic
from tableq.queue import (
    ID_MAX,
    INT32_MAX,
    Queue,
    backend_of,
    check_at,
    check_ids,
    check_token,
    is_many,
    seconds,
    shown,
)


class Bulk:
    """The building blocks of bulk pipelines (the Spark source and sink) on one Queue: its
    settings (retention, the visibility timeout, max_attempts per topic, kinds) apply."""

    __slots__ = ("queue",)

    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    # --- staged loads (the sink) ------------------------------------------------------------

    def stage_many(self, job: str, part: int, topic: str, items: Iterable[Any], *,
                   on_duplicate: OnDuplicate = "ignore") -> int:
        """Stages messages invisibly under (job, part); nothing is delivered until
        publish_staged(job, parts) makes the listed parts visible together."""
        q = self.queue
        check_topic(topic)
        q._check_send(on_duplicate, None)
        batch = q._batch(topic, items, None, None, 0, None, None)
        return backend_of(q).stage_write(check_token(job), _part(part), batch) if len(batch) else 0

    def stage_json(self, job: str, part: int, topic: str, texts: list[str]) -> int:
        """stage_many for bare payloads given as JSON texts that tableq's own encoders made
        (the Spark sink's column-wise encoder): valid by construction, so only their size and
        NUL are checked, once for the whole batch."""
        q = self.queue
        batch = PayloadBatch(q._plain_template(topic),
                             encode_texts(texts, q.max_payload_bytes))
        return backend_of(q).stage_write(check_token(job), _part(part), batch) if texts else 0

    def publish_staged(self, job: str, parts: Sequence[int], *,
                       on_duplicate: Literal["ignore", "replace"] = "ignore",
                       expected_rows: int | None = None) -> int | None:
        """In one transaction: makes the staged rows of `parts` visible, drops every other
        staged row of the job, and marks the job committed. Returns the number published, or
        None when the job was already committed (so a rerun is a no-op). `expected_rows`
        (what the writers reported staging) guards against staged rows lost to a database
        crash: fewer or more raise LoadIncomplete and nothing is published."""
        if on_duplicate not in ("ignore", "replace"):
            raise InvalidArgument("publish_staged takes on_duplicate='ignore' or 'replace'")
        if not is_many(parts):
            raise InvalidArgument(f"publish_staged takes a list of part numbers, not "
                                  f"{shown(parts)}")
        if expected_rows is not None and (isinstance(expected_rows, bool) or not isinstance(
                expected_rows, int) or expected_rows < 0):
            raise InvalidArgument(f"expected_rows must be a whole number >= 0 (the rows the "
                                  f"writers reported staging), not {shown(expected_rows)}")
        return backend_of(self.queue).stage_publish(check_token(job), [_part(p) for p in parts],
                                              on_duplicate, expected_rows)

    def discard_staged(self, job: str) -> int:
        """Drops every staged row of the job (an aborted load). Returns how many."""
        return backend_of(self.queue).stage_discard(check_token(job))

    def cleanup_staged(self, older_than: float | timedelta = 3600.0) -> int:
        """Drops staged rows of loads still open after `older_than` seconds (their driver
        died between writing and committing). Returns how many rows."""
        return backend_of(self.queue).stage_cleanup(seconds("older_than", older_than, 3600.0))

    def staged_job_state(self, job: str) -> str | None:
        """'open', 'committed', 'aborted', or None for a job never seen."""
        return backend_of(self.queue).stage_job_state(check_token(job))

    def accept_kinds(self, kinds: Iterable[str]) -> None:
        """Registers, without codecs, each of `kinds` the queue does not know yet: the sink
        passes payloads through unchanged, and the queue refuses kinds it has not seen
        registered."""
        if not is_many(kinds):
            raise InvalidArgument(f"accept_kinds takes a list of kind names, not {shown(kinds)}")
        registry = self.queue._kinds
        known = set(registry.names())
        for kind in set(kinds) - known:
            registry.register(kind)

    # --- group leases (the streaming source) ------------------------------------------------

    def receive_batch(self, topic: str, lease: str, *, max: int = 1000,
                      visibility_timeout: float | timedelta | None = None,
                      max_attempts: int | None = None) -> list[Message]:
        """Leases up to `max` due messages under one caller-chosen lease token, so they can
        be read again (leased_messages), extended and acked as a group."""
        q = self.queue
        spec = q._spec(topic, max, visibility_timeout, None, max_attempts, check_token(lease))
        return q._claim(spec, None, None)

    def lease_batch(self, topic: str, lease: str, *, max: int = 1000,
                    visibility_timeout: float | timedelta | None = None,
                    max_attempts: int | None = None) -> list[int]:
        """receive_batch for a holder that reads the messages later (leased_messages): the
        same lease, returning only the ids, about three times faster for large batches.
        Payloads are not decoded here, so a kind's decoder sees them only when read."""
        q = self.queue
        spec = q._spec(topic, max, visibility_timeout, None, max_attempts, check_token(lease))
        ids: list[int] = []
        for _ in range(10):  # bounded: each pass leases or buries something
            result = backend_of(q).message_claim(dataclasses.replace(spec, max=spec.max - len(ids),
                                                             ids_only=True))
            ids += [r["id"] for r in result.rows]
            if len(ids) >= spec.max or result.dead_lettered == 0:
                break
        return ids

    def leased_messages(self, topic: str, lease: str, *, ids: tuple[int, int] | None = None,
                        share: tuple[int, int] = (0, 1)) -> list[Message]:
        """The messages held under a group lease. `ids` (lowest, highest id leased, e.g. from
        receive_batch's result) makes it a primary-key range lookup instead of a scan of the
        topic; share=(k, n) returns one of n readers' part: the ids with id mod n = k."""
        q = self.queue
        return [q._message(r) for r in backend_of(q).lease_rows(_group(topic, lease, ids,
                                                                         share))]

    def leased_rows(self, topic: str, lease: str, *, ids: tuple[int, int] | None = None,
                    share: tuple[int, int] = (0, 1)) -> dict[str, list[Any]]:
        """leased_messages column by column ({name: values in row order}, {} when none) for
        a reader that ships them on (the Spark source): payload and headers as their JSON
        text (payload None when payload_bytes holds the payload), times as aware datetimes;
        no Message is built."""
        return backend_of(self.queue).lease_read(_group(topic, lease, ids, share))

    def ack_lease(self, topic: str, lease: str, *, ids: tuple[int, int] | None = None) -> int:
        """Acks every message still held under the group lease; returns how many."""
        return backend_of(self.queue).lease_ack(_group(topic, lease, ids), self.queue.retention)

    def extend_lease(self, topic: str, lease: str, extend: float | timedelta, *,
                     ids: tuple[int, int] | None = None,
                     ending_within: float | timedelta | None = None) -> int:
        """Sets the group's leases to end `extend` seconds from now; with `ending_within`,
        only those that would end sooner than that from now (a lease just taken is left
        alone). Returns how many it extended."""
        within = None if ending_within is None else seconds("ending_within", ending_within, 0.0)
        return backend_of(self.queue).lease_extend(
            _group(topic, lease, ids), seconds("extend", extend, self.queue.visibility_timeout_s),
            within)

    def release_lease(self, topic: str, lease: str, *,
                      ids: tuple[int, int] | None = None) -> int:
        """Gives back every message still held under the group lease, unread: due now, the
        lease cleared and the attempt its claim charged refunded (the stream source's batch
        leased ahead of Spark, when the query stops first). Returns how many."""
        return backend_of(self.queue).lease_release(_group(topic, lease, ids))

    # --- snapshot reads of the history (the batch source and the archive pipeline) ---------

    def history_bounds(self, source: str, topic: str | None = None) -> tuple[int, int] | None:
        """(min id, max id) of the live messages (source='live'), the dead-letter store
        ('dead') or the acked messages kept in 'done', or None when empty."""
        return backend_of(self.queue).history_bounds(_source(source), _opt_topic(topic))

    def history(self, source: str, topic: str | None, lo: int, hi: int, *,
                before: datetime | None = None) -> list[Row]:
        """Rows with lo <= id <= hi, as plain dicts: live messages ('live', created before
        `before`; their lease is not returned), dead letters ('dead', dead_at before `before`)
        or acked messages kept in 'done' ('done', done_at before `before`). A snapshot read: nothing
        is leased or changed."""
        if not _is_id_bound(lo) or not _is_id_bound(hi):
            raise InvalidArgument(f"lo and hi must be 64-bit whole numbers, not {shown(lo)} "
                                  f"and {shown(hi)}")
        rows = backend_of(self.queue).history_rows(_source(source), _opt_topic(topic), lo, hi,
                                                   check_at(before))
        if source == "live":
            for row in rows:
                row["lease"] = None  # a reader must never be able to settle someone's delivery
        return rows

    def delete_history(self, source: str, ids: Sequence[int], *,
                       before: datetime | None = None) -> int:
        """Deletes dead letters ('dead') or kept acked messages ('done') by id; with `before`,
        only those that died or were acked before it (one requeued and dead again since it was
        read keeps its new death). Returns how many."""
        return backend_of(self.queue).history_delete(_source(source, ("dead", "done")),
                                                     check_ids(ids) or [], check_at(before))


def _group(topic: str, lease: str, ids: tuple[int, int] | None,
           share: tuple[int, int] = (0, 1)) -> GroupLease:
    check_topic(topic)
    if not isinstance(share, (tuple, list)) or len(share) != 2:
        raise InvalidArgument(f"share must be (k, n), a pair, not {shown(share)}")
    if ids is not None and (not isinstance(ids, (tuple, list)) or len(ids) != 2):
        raise InvalidArgument(f"ids must be (lowest id, highest id), a pair, not {shown(ids)}")
    k, n = share
    if isinstance(n, bool) or not isinstance(n, int) or not isinstance(k, int) \
            or not 1 <= n <= INT32_MAX or not 0 <= k < n:
        raise InvalidArgument(f"share must be (k, n) with 0 <= k < n <= {INT32_MAX}, not "
                              f"{shown(share)}")
    if ids is None:
        return GroupLease(topic, check_token(lease), k=k, n=n)
    lo, hi = ids
    if not _is_id_bound(lo) or not _is_id_bound(hi) or lo > hi:
        raise InvalidArgument(f"ids must be (lowest id, highest id), 64-bit whole numbers, "
                              f"not {shown(ids)}")
    return GroupLease(topic, check_token(lease), lo, hi, k, n)


def _is_id_bound(value: object) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)
            and -ID_MAX - 1 <= value <= ID_MAX)


def _part(value: object) -> int:
    """A staged load's part number (a Spark task attempt id: a 64-bit column)."""
    try:
        number = operator.index(cast(SupportsIndex, value))  # int, or a NumPy integer
    except TypeError:
        number = -1
    if isinstance(value, bool) or not 0 <= number <= ID_MAX:
        raise InvalidArgument(f"a part number must be a whole number from 0 to 2**63-1, "
                              f"not {shown(value)}")
    return number


def _source(source: str, allowed: tuple[str, ...] = ("live", "dead", "done")) -> str:
    if source not in allowed:
        raise InvalidArgument(f"source must be one of {allowed}, not {source!r}")
    return source


def _opt_topic(topic: str | None) -> str | None:
    return None if topic is None else check_topic(topic)
