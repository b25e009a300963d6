"""The database clock is one expression per dialect: every "now" in a backend's queries.sql is
that expression (so a test clock can replace all of them at load), no query spells the time
another way, and the production query text is untouched by the test clock's existence."""

from __future__ import annotations

import re

import pytest

from tableq.backends._queries import load_queries

# (package, namespace placeholder, the one "now", other spellings of the time that must not occur)
DIALECTS = {
    "postgres": ("tableq.backends.postgres", "{schema}", "statement_timestamp()",
                 r"\bnow\s*\(|clock_timestamp|transaction_timestamp|current_timestamp|"
                 r"localtimestamp|current_date|timeofday"),
    "mysql": ("tableq.backends.mysql", "{p}", "UTC_TIMESTAMP(6)",
              r"\bnow\s*\(|sysdate|current_timestamp|utc_timestamp\s*\(\s*\)|unix_timestamp|"
              r"curdate|curtime|localtime"),
    "sqlite": ("tableq.backends.sqlite", "{p}", "(julianday('now') - 2440587.5) * 86400.0",
               r"current_timestamp|unixepoch|strftime|datetime\s*\(|date\s*\(|time\s*\("),
}
# Queries that must read the server's real clock: migrations and the test clock itself, and
# tableq doctor's facts, which measure ages against the server's own bookkeeping
# (pg_stat_activity, INNODB_TRX, the statistics collector) in real time.
REAL_CLOCK = ("migration_", "test_clock_", "doctor_")


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_every_now_is_the_one_clock_expression(dialect: str) -> None:
    package, placeholder, now, others = DIALECTS[dialect]
    production = load_queries(package, placeholder, "ns_")
    test = load_queries(package, placeholder, "ns_", clock=(now, "TEST_NOW"))
    uses = 0
    for name in sorted(production.names()):
        text = getattr(production, name)
        if name.startswith("doctor_"):
            continue
        assert not re.search(others, text, re.IGNORECASE), f"{name} reads the time another way"
        if dialect == "sqlite":  # 'now' only inside the one expression
            assert text.count("'now'") == text.count(now), name
        if name.startswith(REAL_CLOCK):
            continue
        swapped = getattr(test, name)
        assert now not in swapped, name
        assert swapped.count("TEST_NOW") == text.count(now), name
        uses += text.count(now)
    assert uses > 20  # the queue's times really come from this expression


def test_production_text_is_unchanged_without_a_test_clock() -> None:
    for package, placeholder, _now, _ in DIALECTS.values():
        plain = load_queries(package, placeholder, "ns_")
        assert all("test_clock" not in getattr(plain, n) for n in plain.names()
                   if not n.startswith("test_clock_"))
