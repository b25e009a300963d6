"""F6: the reply to COMMIT lost, through the fault proxy (tests/faults/proxy.py) in front of a
throwaway PostgreSQL and MariaDB (SQLite has no network, so the fault does not apply).

- A producer that retries a keyed send after the ambiguous failure gets exactly one message
  per key (the retry answers "duplicate" with the original id): 0 duplicates, 0 lost.
  Without keys the same retries duplicate exactly the messages whose reply was lost: the
  count is reported (it is why keys matter).
- An exactly-once transaction (receive, its own write, ack) whose COMMIT reply is lost, or
  whose COMMIT never reaches the server: the effect and the ack are both there or both
  absent, so every job has exactly one effect.
- The proxy's other toxics (latency, stall, reset) do what they say.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from checker import Effect, Fault, SendOp, check
from history import EffectTable, epoch, live_rows
from proxy import FaultProxy
from sizes import size

import tableq
from tableq.testing import wait_until

pytestmark = pytest.mark.slow
RETRIES = 20


@pytest.fixture
def proxied(server) -> Iterator[tuple[str, str, FaultProxy]]:  # type: ignore[no-untyped-def]
    """(direct URL, URL through a fresh fault proxy, the proxy) on a fresh schema/database."""
    name = "f6_" + uuid.uuid4().hex[:8]
    direct = server.url(name)
    proxy = FaultProxy(server.port, server.dialect).start()
    through = direct.replace(f":{server.port}/", f":{proxy.port}/")
    if server.dialect == "postgres":
        through += "&sslmode=disable"  # the proxy reads the plain protocol
    with tableq.connect(direct, migrate=True):
        pass
    try:
        yield direct, through, proxy
    finally:
        proxy.stop()


def _send_until_answered(q: tableq.Queue, value: str, key: str | None,
                         sends: list[SendOp]) -> tableq.SendResult:
    """Sends, retrying after every ambiguous failure (the reply was lost), as a careful
    producer does; each ambiguous attempt is an `info` in the history."""
    for _ in range(RETRIES):
        try:
            result = q.send("f6", {"v": value}, key=key)
        except tableq.DatabaseUnavailable:
            sends.append(SendOp(value, "info", time.time()))
            continue
        sends.append(SendOp(value, "ok" if result.status == "sent" else "fail", time.time()))
        return result
    raise AssertionError(f"{value}: no answer after {RETRIES} attempts")


def test_f6_keyed_retry_after_lost_commit_reply(server, proxied) -> None:  # type: ignore[no-untyped-def]
    direct, through, proxy = proxied
    n_keyed, n_plain = size("f6_keyed", 2000), size("f6_plain", 500)
    proxy.cut_commit = 1 / 20
    sends: list[SendOp] = []
    statuses: Counter[str] = Counter()
    with tableq.connect(through) as q:
        for i in range(n_keyed):
            statuses[_send_until_answered(q, f"k{i}", f"k{i}", sends).status] += 1
        keyed_cuts, keyed_commits = proxy.commits_cut, proxy.commits_seen
        for i in range(n_plain):
            _send_until_answered(q, f"u{i}", None, [])
        plain_cuts = proxy.commits_cut - keyed_cuts
    with tableq.connect(direct) as q:
        rows = Counter(r["payload"]["v"] for r in live_rows(q, "f6"))
    # A keyed send whose reply was lost committed: its retry must say "duplicate" (the first
    # attempt's message), and the key must have exactly one message.
    keyed = [SendOp(op.value, "ok" if op.phase != "info" else "info", op.t) for op in sends]
    result = check("F6", server.dialect, sends=keyed,
                   effects=[Effect(v) for v, n in rows.items() for _ in range(n)
                            if v.startswith("k")],
                   faults=[Fault("commit-reply cut", op.t, op.t) for op in sends
                           if op.phase == "info"],
                   note=f"{keyed_cuts} commit replies cut in {keyed_commits} commits of "
                        f"keyed sends, the retries answered duplicate ({statuses['duplicate']} "
                        "keys); "
                        f"without keys {plain_cuts} cuts gave "
                        f"{sum(n - 1 for v, n in rows.items() if v.startswith('u'))} duplicates "
                        f"of {n_plain}")
    print("\n" + result.line())
    plain_dups = {v: n for v, n in rows.items() if v.startswith("u") and n > 1}
    assert keyed_cuts > 0 and plain_cuts > 0, "no commit reply was cut: nothing was tested"
    cut_keys = {op.value for op in sends if op.phase == "info"}  # some were cut twice
    assert statuses == {"sent": n_keyed - len(cut_keys), "duplicate": len(cut_keys)}, statuses
    assert result.ok and not result.duplicated, result.explain()
    # Without keys each lost reply made exactly one duplicate, and nothing was lost.
    assert sum(n - 1 for n in plain_dups.values()) == plain_cuts
    assert {v for v in rows if v.startswith("u")} == {f"u{i}" for i in range(n_plain)}


def test_f6_exactly_once_commit_reply_lost(server, proxied) -> None:  # type: ignore[no-untyped-def]
    direct, through, proxy = proxied
    n = size("f6_jobs", 500)
    with tableq.connect(direct) as q:
        q.send_many("jobs", [{"v": f"j{i}"} for i in range(n)])
    table = EffectTable(direct)
    table.create()
    proxy.cut_commit = proxy.cut_before_commit = 1 / 20
    rng = random.Random(6)
    faults: list[Fault] = []
    with tableq.connect(through) as qp, tableq.connect(direct) as q:
        def drained() -> bool:
            s = q.stats("jobs")[0]
            return s.ready + s.in_flight + s.scheduled == 0

        deadline = time.monotonic() + 300
        while not drained():
            assert time.monotonic() < deadline, "the jobs were not all processed in 300 s"
            try:
                with qp.transaction() as tx:
                    for m in tx.receive("jobs", max=rng.randint(1, 5), visibility_timeout=30):
                        table.record(tx.connection, m.payload["v"], lease=m.lease,
                                     until=epoch(m.available_at))
                        m.ack()
            except tableq.DatabaseUnavailable:
                # Committed or not: the database knows, and the next loop sees which.
                faults.append(Fault("commit cut", time.time(), time.time()))
    effects = table.read()
    result = check("F6", server.dialect, sends=[SendOp(f"j{i}", "ok") for i in range(n)],
                   effects=effects, faults=faults,
                   note=f"exactly_once transactions: {proxy.commits_cut} COMMIT replies lost "
                        f"and {proxy.commits_dropped} COMMITs dropped of {proxy.commits_seen} "
                        f"commits")
    print("\n" + result.line())
    assert proxy.commits_cut > 0 and proxy.commits_dropped > 0, "nothing was tested"
    assert result.ok, result.explain()  # exactly_once: no job has two effects, none has none


def test_proxy_toxics_latency_stall_reset(server, proxied) -> None:  # type: ignore[no-untyped-def]
    _, through, proxy = proxied
    with tableq.connect(through) as q:
        q.send("toxic", {"v": 0})  # connected
        t0 = time.monotonic()
        q.stats("toxic")
        base = time.monotonic() - t0
        proxy.latency_s = 0.2
        t0 = time.monotonic()
        q.stats("toxic")
        assert time.monotonic() - t0 >= 0.2 + base * 0.5  # at least one delayed round trip
        proxy.latency_s = 0.0
        # Stall: a call blocks (the socket stays open) until the proxy flows again.
        proxy.stall()
        done = threading.Event()
        caller = threading.Thread(target=lambda: (q.stats("toxic"), done.set()), daemon=True)
        caller.start()
        with pytest.raises(TimeoutError):
            wait_until(done.is_set, timeout=0.5)
        proxy.unstall()
        wait_until(done.is_set, timeout=10)
        caller.join(5)
        # Reset during a call: that call fails with DatabaseUnavailable (nothing hangs), an
        # idle pooled connection that was reset is replaced without an error.
        proxy.stall()
        errors: list[BaseException] = []

        def call() -> None:
            try:
                q.stats("toxic")
            except BaseException as exc:  # noqa: BLE001 - checked below
                errors.append(exc)
        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        with pytest.raises(TimeoutError):
            wait_until(lambda: not caller.is_alive(), timeout=0.3)
        proxy.reset()
        caller.join(10)
        proxy.unstall()
        assert len(errors) == 1 and isinstance(errors[0], tableq.DatabaseUnavailable), errors
        proxy.reset()
        assert q.stats("toxic")[0].ready == 1
