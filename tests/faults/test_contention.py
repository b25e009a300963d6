"""L1 and M1: contention that must stay inside the library.

- L1: SQLite with 4 producer and 4 consumer processes on one file (WAL): no "database is
  locked" / SQLITE_BUSY reaches user code, nothing is lost, and no message is handed out
  while another consumer still holds its lease.
- M1: MariaDB under a mixed load (producers and consumers, priorities, delays, dedup keys
  shared between producers, nacks) for up to a minute: no deadlock or lock-wait timeout reaches user
  code, and the retry path really ran (the processes' internal retry counts add up to > 0).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mix import run_mix
from sizes import size

pytestmark = pytest.mark.slow


# Leases of 30 s: these tests count errors that reach user code, and a consumer starved of
# CPU for longer than its lease on a busy machine would rightly get LeaseLost.
VT_S = 30.0


def test_l1_sqlite_several_processes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/l1.db"
    mix = run_mix(url, tmp_path, "L1", producers=4, consumers=4,
                  count=size("l1_per_producer", 1000), max_delay_s=0.5, shared_keys=50,
                  vt_s=VT_S, nack_share=0.05)
    print("\n" + mix.result.line())
    assert not mix.errors, (mix.errors, mix.error_texts)
    assert mix.result.ok, mix.result.explain()


@pytest.mark.parametrize("fresh_url", ["mysql"], indirect=True)
def test_m1_mariadb_under_contention(fresh_url: str, tmp_path: Path) -> None:
    # Load for up to a minute, at most 10,000 messages per producer (so the drain after it
    # stays short): the contention is in the mix, not in the backlog.
    seconds = size("m1_seconds", 60)
    mix = run_mix(fresh_url, tmp_path, "M1", producers=4, consumers=4,
                  count=size("m1_per_producer", 10000),
                  seconds=seconds, max_delay_s=1.0, shared_keys=20, vt_s=VT_S, nack_share=0.05)
    print(f"\n{mix.result.line()}; {mix.load_s:.0f} s of load")
    assert not mix.errors, (mix.errors, mix.error_texts)
    assert mix.retries > 0, "no conflict was retried: the retry path did not run"
    assert mix.result.ok, mix.result.explain()
