"""`tableq doctor`: judges a queue database's health from the plain facts its backend reads
(durability settings, old transactions, dead rows or undo history, free space a drained burst
left, pending migrations) and the clock offset between this host and the database. The
judgement is pure functions of those facts; the only I/O is in diagnose(), which asks the
backend and reads the two clocks.

Levels: "ok"; "warn" (worth fixing, nothing is lost by it today: recent commits may vanish in
a power loss, cleanup lags, clocks drift); "risk" (acknowledged messages can be lost or the
database corrupted by a crash, cleanup is blocked, or the schema does not match this
tableq)."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from tableq.queue import Queue

Level = Literal["ok", "warn", "risk"]
LEVELS: tuple[Level, ...] = ("ok", "warn", "risk")

MAX_TRANSACTION_AGE_S = 300.0  # a snapshot held longer keeps five minutes of churn alive
MAX_CLOCK_OFFSET_S = 1.0
DEAD_ROWS_WARN = 100_000  # and more dead than live rows: autovacuum is not keeping up
HISTORY_WARN, HISTORY_RISK = 100_000, 1_000_000  # InnoDB undo records purge has not removed
SPARE_BYTES_WARN = 64 * 1024 * 1024  # free space left by a past burst, and at least...
SPARE_SHARE_WARN = 0.75  # ...this share of the table's file: worth giving back by hand
WAL_BYTES_WARN = 64 * 1024 * 1024  # SQLite: the WAL should be reset by checkpoints well before


@dataclass(frozen=True, slots=True)
class Finding:
    """One judged fact. `check` is a stable dotted name ("durability.fsync"), `summary` says
    what was found, `advice` what to do (None when nothing is needed), `facts` the values the
    judgement used."""

    check: str
    level: Level
    summary: str
    advice: str | None = None
    facts: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Limits:
    max_transaction_age_s: float = MAX_TRANSACTION_AGE_S
    max_clock_offset_s: float = MAX_CLOCK_OFFSET_S


def worst(findings: list[Finding]) -> Level:
    return max((f.level for f in findings), key=LEVELS.index, default="ok")


def exit_code(findings: list[Finding], *, strict: bool = False) -> int:
    """0 when fine; 1 when something is risky (or, with strict, merely worth a warning)."""
    level = worst(findings)
    return 1 if level == "risk" or (strict and level == "warn") else 0


def _unreadable(check: str, section: Mapping[str, Any], what: str, grant: str) -> Finding:
    return Finding(check, "warn", f"could not read {what}: {section['error']}", grant,
                   {"error": section["error"]})


# --- durability ------------------------------------------------------------------------------


def judge_postgres_durability(s: Mapping[str, Any]) -> list[Finding]:
    out = []
    fsync = str(s["fsync"])
    if fsync == "off":
        out.append(Finding(
            "durability.fsync", "risk",
            "fsync is off: PostgreSQL never forces its writes to disk, so an operating system "
            "crash or power loss can corrupt the whole database, not only lose recent messages",
            "set fsync = on in postgresql.conf, then SELECT pg_reload_conf() (or ALTER SYSTEM "
            "SET fsync = on; SELECT pg_reload_conf();)", {"fsync": fsync}))
    else:
        out.append(Finding("durability.fsync", "ok", "fsync is on", None, {"fsync": fsync}))
    sc = str(s["synchronous_commit"])
    if sc == "off":
        out.append(Finding(
            "durability.synchronous_commit", "risk",
            "synchronous_commit is off: a send or ack reported as done can vanish if the "
            "server crashes within the next few hundred milliseconds",
            "ALTER SYSTEM SET synchronous_commit = on; SELECT pg_reload_conf(); (and check "
            "ALTER ROLE/DATABASE ... SET synchronous_commit overrides for tableq's role)",
            {"synchronous_commit": sc}))
    else:
        out.append(Finding("durability.synchronous_commit", "ok", f"synchronous_commit is {sc}",
                           None, {"synchronous_commit": sc}))
    fpw = str(s["full_page_writes"])
    if fpw == "off":
        out.append(Finding(
            "durability.full_page_writes", "risk",
            "full_page_writes is off: a power loss in the middle of a page write can leave "
            "torn pages that crash recovery cannot repair",
            "ALTER SYSTEM SET full_page_writes = on; SELECT pg_reload_conf(); (off is only safe "
            "on a filesystem that writes pages atomically, such as ZFS)",
            {"full_page_writes": fpw}))
    else:
        out.append(Finding("durability.full_page_writes", "ok", "full_page_writes is on", None,
                           {"full_page_writes": fpw}))
    return out


def judge_mysql_durability(s: Mapping[str, Any]) -> list[Finding]:
    out = []
    flush = int(s["innodb_flush_log_at_trx_commit"])
    facts = {"innodb_flush_log_at_trx_commit": flush}
    if flush == 1:
        out.append(Finding("durability.innodb_flush_log_at_trx_commit", "ok",
                           "innodb_flush_log_at_trx_commit is 1: every commit is on disk",
                           None, facts))
    elif flush == 2:
        out.append(Finding(
            "durability.innodb_flush_log_at_trx_commit", "warn",
            "innodb_flush_log_at_trx_commit is 2: the redo log is flushed about once a "
            "second, so an operating system crash or power loss can lose the last second of "
            "sends and acks (a server crash alone loses nothing)",
            "SET GLOBAL innodb_flush_log_at_trx_commit = 1; and put "
            "innodb_flush_log_at_trx_commit = 1 under [mysqld] in the server's config", facts))
    else:
        out.append(Finding(
            "durability.innodb_flush_log_at_trx_commit", "risk",
            f"innodb_flush_log_at_trx_commit is {flush}: the redo log is written about once a "
            "second, so even a crash of the server process loses recent sends and acks",
            "SET GLOBAL innodb_flush_log_at_trx_commit = 1; and put "
            "innodb_flush_log_at_trx_commit = 1 under [mysqld] in the server's config", facts))
    log_bin = bool(int(s["log_bin"]))
    sync_binlog = int(s["sync_binlog"])
    fmt = str(s["binlog_format"]).upper()
    if not log_bin:
        out.append(Finding("durability.binlog", "ok",
                           "the binary log is off (no replicas or point-in-time recovery "
                           "to keep in step)", None, {"log_bin": 0}))
        return out
    if sync_binlog != 1:
        out.append(Finding(
            "durability.sync_binlog", "warn",
            f"sync_binlog is {sync_binlog}: after an operating system crash the binary log can "
            "miss commits InnoDB kept, so replicas and point-in-time recovery disagree with "
            "the primary", "SET GLOBAL sync_binlog = 1; and sync_binlog = 1 in the config",
            {"sync_binlog": sync_binlog}))
    else:
        out.append(Finding("durability.sync_binlog", "ok", "sync_binlog is 1", None,
                           {"sync_binlog": sync_binlog}))
    if fmt == "ROW":
        out.append(Finding("durability.binlog_format", "ok", "binlog_format is ROW", None,
                           {"binlog_format": fmt}))
    else:
        out.append(Finding(
            "durability.binlog_format", "risk" if fmt == "STATEMENT" else "warn",
            f"binlog_format is {fmt} with the binary log on: statements that claim with "
            "SKIP LOCKED are not safe to replay as statements, so a replica can take other "
            "rows than the primary did",
            "SET GLOBAL binlog_format = 'ROW'; and binlog_format = ROW in the config",
            {"binlog_format": fmt}))
    return out


SQLITE_SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def judge_sqlite_durability(s: Mapping[str, Any]) -> list[Finding]:
    out = []
    level_no = int(s["synchronous"])
    name = SQLITE_SYNCHRONOUS.get(level_no, str(level_no))
    facts = {"synchronous": name}
    advice = ("open the queue with tableq.connect(url, synchronous='FULL') (the default); "
              "SQLite's synchronous is set per connection")
    if level_no >= 2:
        out.append(Finding("durability.synchronous", "ok",
                           f"synchronous is {name}: every commit is on disk", None, facts))
    elif level_no == 1:
        out.append(Finding(
            "durability.synchronous", "warn",
            "synchronous is NORMAL: an operating system crash or power loss can lose the last "
            "sends and acks (a crash of this process loses nothing)", advice, facts))
    else:
        out.append(Finding(
            "durability.synchronous", "risk",
            "synchronous is OFF: an operating system crash or power loss can corrupt the "
            "database file", advice, facts))
    mode = str(s["journal_mode"]).lower()
    if mode == "wal":
        out.append(Finding("durability.journal_mode", "ok", "journal_mode is WAL", None,
                           {"journal_mode": mode}))
    else:
        bad = mode in ("off", "memory")
        out.append(Finding(
            "durability.journal_mode", "risk" if bad else "warn",
            f"journal_mode is {mode.upper()}: " + (
                "a crash in the middle of a transaction can corrupt the database file" if bad
                else "readers and the writer block each other, and tableq expects WAL"),
            "PRAGMA journal_mode = WAL; on the database file (tableq sets it when it connects; "
            "a filesystem without shared memory, such as a network share, refuses it)",
            {"journal_mode": mode}))
    wal = int(s.get("wal_bytes") or 0)
    if wal > WAL_BYTES_WARN:
        out.append(Finding(
            "durability.wal_size", "warn",
            f"the WAL file is {wal / 2**20:.0f} MiB: checkpoints cannot reset it, usually "
            "because some connection keeps a read transaction open",
            "end long read transactions (and idle connections that hold one), then run "
            "PRAGMA wal_checkpoint(TRUNCATE);", {"wal_bytes": wal}))
    else:
        out.append(Finding("durability.wal_size", "ok",
                           f"the WAL file is {wal / 2**20:.1f} MiB", None, {"wal_bytes": wal}))
    return out


# --- old transactions ------------------------------------------------------------------------


def _who(t: Mapping[str, Any]) -> str:
    parts = [f"pid {t.get('pid')}"]
    for key, label in (("user_name", "user"), ("application_name", "application"),
                       ("client", "from"), ("state", "state")):
        if t.get(key):
            parts.append(f"{label} {t[key]}")
    return ", ".join(parts)


def judge_transactions(dialect: str, s: Mapping[str, Any], limits: Limits) -> list[Finding]:
    out = []
    oldest = s.get("oldest") or []
    limit = limits.max_transaction_age_s
    old = [t for t in oldest if (t.get("age_s") or 0) > limit]
    if dialect == "postgres":
        end = ("end it (SELECT pg_terminate_backend(PID);) and find why it stays open; "
               "idle_in_transaction_session_timeout ends forgotten ones by itself")
    else:
        end = ("end it (KILL PID;) and find why it stays open; idle_transaction_timeout "
               "(MariaDB) ends forgotten ones by itself")
    if old:
        t = old[0]
        out.append(Finding(
            "transactions.oldest", "risk",
            f"a transaction has been open for {t['age_s']:.0f} s ({_who(t)}), over the "
            f"{limit:g} s limit: while it lasts, the database keeps every message row deleted "
            "since it began, so the queue table bloats and receives slow down",
            end.replace("PID", str(t.get("pid"))),
            {"age_s": t["age_s"], "pid": t.get("pid"), "count_over_limit": len(old)}))
    else:
        age = max((t.get("age_s") or 0 for t in oldest), default=0.0)
        note = "" if s.get("sees_all_sessions", True) else (
            " (only this user's sessions are visible: grant pg_read_all_stats to see all)")
        found = (f"no transaction older than {limit:g} s (the oldest: {age:.0f} s)" if oldest
                 else "no other transaction is open")
        out.append(Finding("transactions.oldest", "ok", found + note, None, {"age_s": age}))
    prepared = s.get("prepared") or {}
    if prepared.get("n"):
        over = (prepared.get("oldest_s") or 0) > limit
        out.append(Finding(
            "transactions.prepared", "risk" if over else "warn",
            f"{prepared['n']} prepared transaction(s), the oldest "
            f"{prepared.get('oldest_s') or 0:.0f} s old: they hold back cleanup until committed "
            "or rolled back",
            f"COMMIT PREPARED '{prepared.get('gid')}'; or ROLLBACK PREPARED "
            f"'{prepared.get('gid')}'; (see pg_prepared_xacts)", dict(prepared)))
    for slot in s.get("slots") or []:
        if not slot.get("active"):
            out.append(Finding(
                "transactions.replication_slots", "risk",
                f"replication slot {slot['slot_name']!r} is inactive and pins xmin (age "
                f"{slot.get('xmin_age')} transactions): cleanup is held back until it is used "
                "or dropped",
                f"SELECT pg_drop_replication_slot('{slot['slot_name']}'); if its standby is "
                "gone", dict(slot)))
    return out


# --- cleanup ---------------------------------------------------------------------------------


def judge_postgres_cleanup(s: Mapping[str, Any], schema: str) -> list[Finding]:
    tables = s.get("tables") or []
    if not tables:
        return [Finding("cleanup.dead_rows", "ok", "no statistics for tableq's tables yet")]
    # The table with the most dead rows; on a tie, the hot table of live messages.
    t = max(tables, key=lambda r: (r.get("dead_rows") or 0, r["table_name"] == "message"))
    dead, live = int(t.get("dead_rows") or 0), int(t.get("live_rows") or 0)
    facts = {"table": t["table_name"], "dead_rows": dead, "live_rows": live,
             "vacuumed_s_ago": t.get("vacuumed_s_ago")}
    if dead >= DEAD_ROWS_WARN and dead > live:
        ago = t.get("vacuumed_s_ago")
        when = "never vacuumed" if ago is None else f"last vacuumed {ago:.0f} s ago"
        return [Finding(
            "cleanup.dead_rows", "warn",
            f"{t['table_name']} holds {dead:,} dead rows and {live:,} live ones ({when}): "
            "claims scan past dead rows, so receives slow down",
            f"VACUUM {schema}.{t['table_name']}; and look for old transactions; if it "
            f"recurs, ALTER TABLE {schema}.{t['table_name']} SET "
            "(autovacuum_vacuum_scale_factor = 0.01);", facts)]
    return [Finding("cleanup.dead_rows", "ok",
                    f"{dead:,} dead rows at most ({t['table_name']}, {live:,} live)", None,
                    facts)]


def judge_mysql_cleanup(s: Mapping[str, Any]) -> list[Finding]:
    length = s.get("history_length")
    if length is None:
        return [Finding("cleanup.history_length", "warn",
                        "InnoDB's history list length is not available",
                        "SET GLOBAL innodb_monitor_enable = 'trx_rseg_history_len';")]
    length = int(length)
    facts = {"history_length": length}
    if length >= HISTORY_WARN:
        return [Finding(
            "cleanup.history_length", "risk" if length >= HISTORY_RISK else "warn",
            f"InnoDB's history list holds {length:,} undo records purge could not remove yet: "
            "old row versions pile up and claims slow down",
            "look for old transactions (information_schema.INNODB_TRX) and end them; raise "
            "innodb_purge_threads if none is old", facts)]
    return [Finding("cleanup.history_length", "ok",
                    f"InnoDB's history list holds {length:,} undo records", None, facts)]


# --- space left by a past burst ------------------------------------------------------------


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n / 2**10:,.0f} KiB"


@dataclass(frozen=True, slots=True)
class Space:
    """The message table's file as doctor judges it: `what` says its size, `spare` of its
    `total` bytes are free, and `advice` gives them back."""

    what: str
    total: int
    spare: int
    advice: str


def _postgres_space(s: Mapping[str, Any], table: str) -> Space | str:
    heap, index, rows = int(s["heap_bytes"]), int(s["index_bytes"]), int(s["live_rows"])
    what = f"{table} takes {_mib(heap)} (its indexes {_mib(index)})"
    if rows < 0 or (rows and s.get("row_bytes") is None):
        return (f"{what}; its rows' {'number' if rows < 0 else 'width'} is not known until "
                "an ANALYZE")
    return Space(what, heap, max(0, heap - rows * int(s.get("row_bytes") or 0)), (
        f"at a quiet time, VACUUM (TRUNCATE true) {table}; gives back the empty pages at the "
        "file's end (tableq's own vacuums keep them for reuse); if doctor still warns (live "
        f"rows near the end), VACUUM FULL {table}; rewrites the table and its indexes to "
        "their live size, but sends and receives wait while it runs"))


def _mysql_space(s: Mapping[str, Any], table: str) -> Space | str:
    data, index, spare = (int(s[k] or 0) for k in ("data_bytes", "index_bytes", "free_bytes"))
    if not s.get("file_per_table"):
        return (f"{table} takes {_mib(data + index)}, in the shared tablespace "
                "(innodb_file_per_table is off): its free space is not this table's")
    total = data + index + spare
    return Space(f"{table} takes {_mib(total)}", total, spare, (
        f"at a quiet time, SET SESSION lock_wait_timeout = 10; OPTIMIZE TABLE {table}; writes "
        "a new copy of the table (it needs free disk for the live rows) and gives the old "
        "file's space back; its metadata lock waits for open transactions on the table, and "
        "sends and receives queue behind it"))


def _sqlite_space(s: Mapping[str, Any], path: str) -> Space | str:
    size = int(s["page_size"])
    total = int(s["page_count"]) * size
    return Space(f"the database file holds {_mib(total)} of pages", total,
                 int(s["free_pages"]) * size, (
                     f"at a quiet time, sqlite3 -cmd '.timeout 10000' {shlex.quote(path)} "
                     "'VACUUM' rewrites the file: it holds the write lock while it runs and "
                     "needs as much free disk as the file takes"))


def judge_size(dialect: str, s: Mapping[str, Any]) -> list[Finding]:
    """Free space a drained burst left in the message table's file (the whole file on SQLite).
    Later sends reuse it, so it costs disk, not speed; giving it back is a manual step, so a
    table sized by a daily peak warns in the quiet hours. `s["table"]` names the message table
    (the database file on SQLite) for the advice; {} while there is no table."""
    if not s:
        return [Finding("cleanup.free_space", "ok", "there is no message table yet")]
    measure = {"postgres": _postgres_space, "mysql": _mysql_space,
               "sqlite": _sqlite_space}[dialect]
    space = measure(s, str(s["table"]))
    if isinstance(space, str):  # not judged: why
        return [Finding("cleanup.free_space", "ok", space, None, dict(s))]
    facts = {**s, "spare_bytes": space.spare, "total_bytes": space.total}
    if space.spare >= SPARE_BYTES_WARN and space.spare >= SPARE_SHARE_WARN * space.total:
        return [Finding(
            "cleanup.free_space", "warn",
            f"{space.what}, about {_mib(space.spare)} of it free space a past burst left: "
            "later sends reuse it, but the disk does not get it back", space.advice, facts)]
    return [Finding("cleanup.free_space", "ok",
                    f"{space.what}, about {_mib(space.spare)} of it free", None, facts)]


# --- schema and clock ------------------------------------------------------------------------


def judge_schema(s: Mapping[str, Any]) -> list[Finding]:
    """`applied`: the versions recorded in the database; `known`: the versions this tableq
    ships for the database (not always contiguous: a backend ships only what it needs)."""
    applied = sorted(int(v) for v in s.get("applied") or [])
    known = sorted(int(v) for v in s["known"])
    latest = known[-1]
    missing = [v for v in known if v not in applied]
    facts = {"applied": applied, "known": known}
    if not applied:
        return [Finding("schema.migrations", "risk",
                        f"tableq's tables are not there (0 of {len(known)} migrations applied)",
                        "tableq migrate --url URL (or queue.migrate())", facts)]
    if missing:
        return [Finding(
            "schema.migrations", "risk",
            f"{len(missing)} migration(s) pending: the database has "
            f"{', '.join(map(str, applied))}, this tableq needs {', '.join(map(str, known))}",
            "tableq migrate --url URL (safe to run while workers run, and from several "
            "hosts)", {**facts, "pending": missing})]
    if applied[-1] > latest:
        return [Finding(
            "schema.migrations", "warn",
            f"the database has schema version {applied[-1]}, newer than this tableq knows "
            f"({latest})", "upgrade tableq here to the version that migrated the database",
            facts)]
    return [Finding("schema.migrations", "ok", f"schema is up to date (version {latest})",
                    None, facts)]


def judge_clock(offset_s: float, uncertainty_s: float, limits: Limits) -> list[Finding]:
    facts = {"offset_s": round(offset_s, 4), "uncertainty_s": round(uncertainty_s, 4)}
    shown = f"{offset_s:+.3f} s (± {uncertainty_s:.3f} s)"
    if abs(offset_s) - uncertainty_s > limits.max_clock_offset_s:
        return [Finding(
            "clock.offset", "warn",
            f"this host's clock is {shown} off the database's: leases, delays and schedules "
            "follow the database, but at= times and log timestamps from this host do not",
            "synchronise both machines' clocks with NTP (chrony, systemd-timesyncd)", facts)]
    return [Finding("clock.offset", "ok", f"clock offset to the database {shown}", None,
                    facts)]


def judge(dialect: str, facts: Mapping[str, Any], clock: tuple[float, float],
          limits: Limits, *, schema: str = "tableq") -> list[Finding]:
    """Every finding for one database, from its backend's facts and the clock reading
    (offset, uncertainty)."""
    out: list[Finding] = []
    sections: list[tuple[str, str, Callable[[Mapping[str, Any]], list[Finding]], str]] = []
    durability = {"postgres": judge_postgres_durability, "mysql": judge_mysql_durability,
                  "sqlite": judge_sqlite_durability}[dialect]
    sections.append(("durability", "the durability settings", durability,
                     "connect as a user that may read server settings"))
    if dialect != "sqlite":
        sections.append(("transactions", "open transactions",
                         lambda s: judge_transactions(dialect, s, limits),
                         "GRANT pg_read_all_stats TO the user" if dialect == "postgres"
                         else "GRANT PROCESS ON *.* TO the user"))
        sections.append(("cleanup", "cleanup statistics",
                         (lambda s: judge_postgres_cleanup(s, schema)) if dialect == "postgres"
                         else judge_mysql_cleanup,
                         "GRANT pg_read_all_stats TO the user" if dialect == "postgres"
                         else "GRANT PROCESS ON *.* TO the user"))
    sections.append(("size", "the message table's size",
                     lambda s: judge_size(dialect, s),
                     "connect as tableq's own user"))
    sections.append(("schema", "the schema version", judge_schema,
                     "connect as tableq's own user"))
    for name, what, fn, grant in sections:
        section = facts.get(name) or {}
        if "error" in section:
            out.append(_unreadable(name, section, what, grant))
        else:
            out.extend(fn(section))
    out.extend(judge_clock(*clock, limits))
    return out


def read_clock(queue: Queue, host_time: Callable[[], float] = time.time) -> tuple[float, float]:
    """(offset, uncertainty) of the database clock against this host's, in seconds: the
    database's time minus the host's at the middle of the round trip, and half the trip."""
    t0 = host_time()
    db = queue.now().timestamp()
    t1 = host_time()
    return db - (t0 + t1) / 2, (t1 - t0) / 2


def diagnose(queue: Queue, *, max_transaction_age: float = MAX_TRANSACTION_AGE_S,
             max_clock_offset: float = MAX_CLOCK_OFFSET_S) -> list[Finding]:
    """The findings for the database behind `queue`. Reads only: nothing is created, locked
    or changed. An unreachable database raises DatabaseUnavailable; a fact that cannot be
    read (a missing privilege) becomes a "warn" finding saying which grant is missing."""
    from tableq.queue import backend_of, seconds

    limits = Limits(seconds("max_transaction_age", max_transaction_age, MAX_TRANSACTION_AGE_S),
                    seconds("max_clock_offset", max_clock_offset, MAX_CLOCK_OFFSET_S))
    facts = backend_of(queue).health_facts()
    return judge(queue.dialect, facts, read_clock(queue), limits,
                 schema=getattr(backend_of(queue), "schema", "tableq"))
