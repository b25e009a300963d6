"""D1/D2: eight producer processes send the same keys at once, each in its own random order,
singly and in send_many batches, on every backend.

- D1 (on_duplicate="ignore"): exactly one live message per key; per-call results say "sent"
  exactly once per key and "duplicate" for all the rest, always with the live message's id;
  no exception (IntegrityError, deadlock) reaches a producer.
- D2 "replace": one live message per key, whose payload and priority are one sender's own
  (never a mix of two: a torn row); "sent" once per key, "replaced" the rest.
- D2 "error": single sends; exactly one succeeds per key and every other one raises
  DuplicateMessage, and nothing else is raised.
The internal retries the producers made (deadlocks, lock waits, busy) are reported.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
from checker import Effect, SendOp, check
from history import live_rows, read_records
from procs import finish, release_when_ready, spawn
from sizes import size

import tableq

pytestmark = pytest.mark.slow
PRODUCERS = 8


def _dialect(url: str) -> str:
    return url.split(":", 1)[0].replace("postgresql", "postgres")


def _run(url: str, tmp_path: Path, on_duplicate: str, n_keys: int, max_batch: int
         ) -> tuple[list[dict], int]:
    tableq.connect(url, migrate=True).close()
    barrier, log = tmp_path / "go", tmp_path / "producers.log"
    paths = [tmp_path / f"p{i}.jsonl" for i in range(PRODUCERS)]
    procs = [spawn("_producer.py", url, "d", paths[i], barrier, i, n_keys, on_duplicate,
                   max_batch, log=log) for i in range(PRODUCERS)]
    release_when_ready(procs, paths, barrier, log)
    finish(procs, log)
    records = list(read_records(paths))
    retries = sum(r["n"] for r in records if r.get("op") == "retries")
    return [r for r in records if r.get("op") == "send"], retries


@pytest.mark.parametrize("on_duplicate", ["ignore", "replace"])
def test_d1_d2_concurrent_producers_on_the_same_keys(db_url: str, tmp_path: Path,
                                                     on_duplicate: str) -> None:
    n_keys = size("d1_keys", 2000) if on_duplicate == "ignore" else size("d2_keys", 1000)
    sends, retries = _run(db_url, tmp_path, on_duplicate, n_keys, max_batch=20)
    errors = Counter(r["error"] for r in sends if r["phase"] == "fail")
    statuses = Counter(r["status"] for r in sends if r["phase"] == "ok")
    ids: dict[str, set[int]] = defaultdict(set)
    for r in sends:
        if r["phase"] == "ok":
            ids[r["value"]].add(r["id"])
    with tableq.connect(db_url) as q:
        live = [SimpleNamespace(**r) for r in live_rows(q, "d")]
    per_key = Counter(m.key for m in live)
    torn = [m for m in live if m.payload["k"] != m.key or m.payload["proc"] != m.priority
            or not 0 <= m.priority < PRODUCERS]
    wrong_id = [k for k, got in ids.items() if got != {m.id for m in live if m.key == k}]
    test = "D1" if on_duplicate == "ignore" else "D2"
    other = "duplicate" if on_duplicate == "ignore" else "replaced"
    result = check(test, _dialect(db_url), sends=[SendOp(f"k{i}", "ok") for i in range(n_keys)],
                   effects=[Effect(m.key) for m in live],
                   note=f"on_duplicate={on_duplicate}: {PRODUCERS} producers x {n_keys} keys: "
                        f"{statuses['sent']} sent, {statuses[other]} {other}, "
                        f"{sum(errors.values())} errors surfaced, {len(torn)} torn rows, "
                        f"{retries} internal retries")
    print("\n" + result.line())
    assert not errors, errors
    assert statuses == {"sent": n_keys, other: (PRODUCERS - 1) * n_keys}, statuses
    assert len(live) == n_keys and set(per_key.values()) == {1}
    assert not torn, torn[:3]
    assert not wrong_id, wrong_id[:5]
    assert result.ok, result.explain()


def test_d2_error_mode_raises_only_duplicate_message(db_url: str, tmp_path: Path) -> None:
    n_keys = size("d2_error_keys", 300)
    sends, retries = _run(db_url, tmp_path, "error", n_keys, max_batch=1)
    ok = Counter(r["value"] for r in sends if r["phase"] == "ok")
    errors = Counter(r["error"] for r in sends if r["phase"] == "fail")
    with tableq.connect(db_url) as q:
        live = [SimpleNamespace(**r) for r in live_rows(q, "d")]
    result = check("D2", _dialect(db_url), sends=[SendOp(k, "ok") for k in ok],
                   effects=[Effect(m.key) for m in live],
                   note=f"on_duplicate=error: {PRODUCERS} producers x {n_keys} keys: "
                        f"{sum(ok.values())} sent, {dict(errors)} raised, "
                        f"{retries} internal retries")
    print("\n" + result.line())
    assert set(ok) == {f"k{i}" for i in range(n_keys)} and set(ok.values()) == {1}
    assert errors == {"DuplicateMessage": (PRODUCERS - 1) * n_keys}, errors
    assert len(live) == n_keys
    assert result.ok, result.explain()
