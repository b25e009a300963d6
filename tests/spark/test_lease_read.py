"""The stream reader's fast path (Bulk.leased_rows -> lease_batches) gives exactly the Arrow
batches the Message path (Bulk.leased_messages -> arrow_batches) gives for the same lease, on
every backend: JSON re-encoded compactly, bytes payloads, headers, times (the session only
parses the schema)."""

from __future__ import annotations

from typing import Any

from pyspark.sql.types import _parse_datatype_string

import tableq
from tableq.bulk import Bulk
from tableq.spark.source import LIVE_SCHEMA, arrow_batches, lease_batches

PAYLOADS: list[Any] = [
    {"n": 1, "s": "payload-1"}, {"ünï": "cödé ✓", "nested": {"a": [1, 2.5, None, True]}},
    [1, "two", {"three": 3}], "a string", 12345678901234567890, -0.1, 1e100, None, {},
    {"spaces": "a, b: c", "quote": "\"q\"", "slash": "a\\b"},
]


def _row(m: Any) -> dict[str, Any]:
    return {"id": m.id, "topic": m.topic, "key": m.key, "kind": m.kind, "payload": m.payload,
            "headers": m.headers, "priority": m.priority, "attempts": m.attempts,
            "created_at": m.created_at, "available_at": m.available_at,
            "first_available_at": m.first_available_at, "received_at": m.received_at,
            "lease": m.lease}


def test_lease_batches_equal_the_message_path(spark, q: tableq.Queue) -> None:
    q.send_many("t", PAYLOADS)
    q.send("t", b"\x00raw bytes", headers={"h": "1", "ü": "✓"}, priority=3)
    q.send("t", {"k": 1}, key="k1", headers={"x": "y"})
    b = Bulk(q)
    ids = b.lease_batch("t", "ep:1", max=100, visibility_timeout=60)
    span = (min(ids), max(ids))
    schema = _parse_datatype_string(LIVE_SCHEMA)
    for share in ((0, 1), (0, 2), (1, 2)):
        fast = list(lease_batches(b.leased_rows("t", "ep:1", ids=span, share=share), schema))
        slow = list(arrow_batches((_row(m) for m in b.leased_messages("t", "ep:1", ids=span,
                                                                        share=share)), schema))
        assert [x.to_pylist() for x in fast] == [x.to_pylist() for x in slow]
    assert sum(x.num_rows for x in lease_batches(b.leased_rows("t", "ep:1"), schema)) == 12
    assert list(lease_batches(b.leased_rows("t", "ep:2"), schema)) == []


def test_extend_lease_ending_within_leaves_fresh_leases_alone(q: tableq.Queue) -> None:
    q.send_many("t", [1, 2, 3])
    b = Bulk(q)
    ids = b.lease_batch("t", "ep:1", max=10, visibility_timeout=100)
    span = (min(ids), max(ids))
    before = {m.id: m.available_at for m in b.leased_messages("t", "ep:1")}
    assert b.extend_lease("t", "ep:1", 1000, ids=span, ending_within=90) == 0
    assert {m.id: m.available_at for m in b.leased_messages("t", "ep:1")} == before
    assert b.extend_lease("t", "ep:1", 1000, ids=span, ending_within=900) == 3
    assert all(m.available_at > before[m.id] for m in b.leased_messages("t", "ep:1"))
    assert b.extend_lease("t", "ep:1", 1000, ending_within=900) == 0  # now 1000 s left
    assert b.extend_lease("t", "ep:2", 1000, ending_within=900) == 0
