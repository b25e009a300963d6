"""A mixed load for L1, M1 and C1: producer processes (_sender.py) and consumer processes
(_consumer.py) on one topic until everything sent was processed, then the history checker's
verdict plus what only these tests look at: errors that reached user code, internal retries,
and every delivery's database times."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from checker import Result, check
from history import EffectTable, read_records, read_sends
from procs import child_env, finish, release_when_ready, spawn

import tableq
from tableq.testing import wait_until


@dataclass
class Mix:
    result: Result
    errors: Counter[str]
    error_texts: list[str]
    retries: int
    deliveries: list[dict] = field(default_factory=list)
    records: list[dict] = field(default_factory=list)
    load_s: float = 0.0  # from the producers' start to the last one's end


def run_mix(url: str, tmp_path: Path, test: str, *, producers: int, consumers: int,
            count: int, seconds: float = 3600, max_delay_s: float = 0.0, shared_keys: int = 0,
            delayed_share: float = 0.25, vt_s: float = 5.0, nack_share: float = 0.0,
            drain_timeout_s: float = 300,
            producer_prefix: Sequence[Sequence[str]] = (),
            consumer_prefix: Sequence[Sequence[str]] = (),
            env: dict[str, str] | None = None) -> Mix:
    """`count` messages per producer (or as many as fit in `seconds`). The prefixes, one per
    process, wrap a command (e.g. faketime); `env` is added to every process's environment."""
    dialect = url.split(":", 1)[0].replace("postgresql", "postgres")
    with tableq.connect(url, migrate=True):
        pass
    EffectTable(url).create()
    barrier, stop, log = tmp_path / "go", tmp_path / "stop", tmp_path / f"{test}.log"
    sender_paths = [tmp_path / f"s{i}.jsonl" for i in range(producers)]
    consumer_paths = [tmp_path / f"c{i}.jsonl" for i in range(consumers)]
    process_env = child_env(**(env or {}))
    cons = [spawn("_consumer.py", url, "m", consumer_paths[i], stop, vt_s, nack_share, log=log,
                  env=process_env, prefix=consumer_prefix[i] if consumer_prefix else ())
            for i in range(consumers)]
    prods = [spawn("_sender.py", url, "m", sender_paths[i], barrier, i, count, seconds,
                   max_delay_s, shared_keys, delayed_share, log=log, env=process_env,
                   prefix=producer_prefix[i] if producer_prefix else ())
             for i in range(producers)]
    try:
        release_when_ready(prods, sender_paths, barrier, log)
        started = time.monotonic()
        finish(prods, log, timeout=seconds + 300)
        load_s = time.monotonic() - started
        with tableq.connect(url) as q:
            def drained() -> bool:
                assert all(c.poll() is None for c in cons), log.read_text()[-3000:]
                s = q.stats("m")
                return not s or s[0].ready + s[0].in_flight + s[0].scheduled == 0
            wait_until(drained, timeout=drain_timeout_s, interval=0.2)
            dead = [d.payload["v"] for d in q.dead_letters("m", limit=100_000)]
    finally:
        stop.touch()
        finish(cons, log)
    records = list(read_records(sender_paths + consumer_paths))
    errors = Counter(r["error"] for r in records if r.get("op") == "error")
    texts = [r["text"] for r in records if r.get("op") == "error"][:5]
    retries = sum(r["n"] for r in records if r.get("op") == "retries")
    deliveries = [r for r in records if r.get("op") == "deliver"]
    nacked = sum(1 for r in records if r.get("op") == "nack")
    result = check(test, dialect, sends=read_sends(sender_paths),
                   effects=EffectTable(url).read(), dead=dead, deliveries=len(deliveries),
                   mode="at_least_once",
                   note=f"{nacked} nacked on purpose; {sum(errors.values())} errors reached "
                        f"user code, {retries} internal retries")
    return Mix(result, errors, texts, retries, deliveries, records, load_s)
