"""C1: application clocks an hour off the database's, on PostgreSQL and MariaDB. Half of the
producer and consumer processes run at +3600 s and half at -3600 s (libfaketime, with the
monotonic clock left alone so timeouts and pools keep working); the database keeps real time. Every
message is delayed. Due times and leases come from the database clock, so: 0 early
deliveries (a delivery's database time >= its due time), every lease is exactly the
visibility timeout long on the database clock (0 premature expiries), and no message is
handed out while its lease lives.

Not on SQLite: an embedded database has no clock of its own, its "now" is the clock of the
process running the statement, and processes sharing one file share one host clock (a
per-process libfaketime skew is a situation that cannot arise there; tried anyway, a +1 h
consumer takes a -1 h producer's delayed messages at once)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from mix import run_mix
from procs import HERE, SRC
from sizes import size

pytestmark = pytest.mark.slow
LIBFAKETIME = next((p for p in ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
                                "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
                                "/usr/lib/faketime/libfaketime.so.1") if os.path.exists(p)), None)
SKEW_S = 3600
VT_S = 5.0


def _skewed(offset: int) -> list[str]:
    """The command prefix of a process whose wall clock is `offset` seconds off; the shim
    works around libfaketime's broken time.sleep (see faketime_shim/sitecustomize.py)."""
    path = os.pathsep.join([str(HERE / "faketime_shim"), str(HERE), str(SRC)])
    return ["env", f"FAKETIME={offset:+d}s", f"LD_PRELOAD={LIBFAKETIME}",
            "FAKETIME_DONT_FAKE_MONOTONIC=1", f"PYTHONPATH={path}"]


@pytest.mark.parametrize("fresh_url", ["postgres", "mysql"], indirect=True)
def test_c1_skewed_application_clocks(fresh_url: str, tmp_path: Path) -> None:
    db_url = fresh_url
    if LIBFAKETIME is None or shutil.which("env") is None:
        pytest.fail("libfaketime is not installed (Debian package faketime; .ci/run installs "
                    "it)", pytrace=False)
    per_producer = size("c1_per_producer", 500)
    prefixes = [_skewed(SKEW_S), _skewed(-SKEW_S)] * 2
    mix = run_mix(db_url, tmp_path, "C1", producers=4, consumers=4, count=per_producer,
                  max_delay_s=2.0, delayed_share=1.0, vt_s=VT_S,
                  producer_prefix=prefixes, consumer_prefix=prefixes)
    # The skew really applied: each process's own wall clock at start, against ours.
    offsets = sorted(round((r["t"] - time.time()) / SKEW_S) for r in mix.records
                     if r.get("op") == "ready")
    early = [d for d in mix.deliveries if d["received"] < d["due"]]
    short = [d for d in mix.deliveries if abs(d["until"] - d["received"] - VT_S) > 0.001]
    late = max(d["received"] - d["due"] for d in mix.deliveries)
    print(f"\n{mix.result.line()}; clocks at {offsets} h; {len(mix.deliveries)} deliveries of "
          f"delayed messages: {len(early)} early, {len(short)} leases not {VT_S:g} s on the "
          f"database clock; max lateness {late:.2f} s")
    assert offsets == [-1] * 4 + [1] * 4, offsets
    assert not mix.errors, (mix.errors, mix.error_texts)
    assert not early, early[:3]
    assert not short, short[:3]
    assert mix.result.ok, mix.result.explain()
