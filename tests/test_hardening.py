"""What a new user found by trying odd values (issue 13, point 6), on every backend: each bad
value is a specific TableqError that says what to do, never an OverflowError,
UnicodeEncodeError, TypeError or RuntimeError from below; the databases treat the same input
the same way; names are checked in full (no trailing newline slips through); connection
errors give advice that fits the database."""

from __future__ import annotations

import dataclasses
import os
import sys

import pytest

import tableq
from tableq.bulk import Bulk
from tableq.url import parse_url

HUGE = 10**400  # float(HUGE) overflows
ENORMOUS = 10**5000  # repr(ENORMOUS) itself raises ValueError in Python 3.11+


def _unchanged(q: tableq.Queue, topic: str, live: int) -> None:
    (s,) = q.stats(topic)
    assert s.live == live


def test_huge_numbers_are_invalid_argument_not_overflow(q: tableq.Queue) -> None:
    q.send("big", {"n": 1})
    (m,) = q.receive("big")
    calls = {
        "send delay": lambda: q.send("big", 1, delay=HUGE),
        "send delay (enormous)": lambda: q.send("big", 1, delay=ENORMOUS),
        "send_many delay": lambda: q.send_many("big", [1], delay=HUGE),
        "receive visibility_timeout": lambda: q.receive("big", visibility_timeout=HUGE),
        "heartbeat extend": lambda: q.heartbeat(m, extend=HUGE),
        "heartbeat_many extend": lambda: q.heartbeat_many([m], extend=-HUGE),
        "nack delay": lambda: q.nack(m, delay=HUGE),
        "extend_lease": lambda: Bulk(q).extend_lease("big", "job", HUGE),
        "cleanup_staged": lambda: Bulk(q).cleanup_staged(HUGE),
        "get id": lambda: q.get(2**63),
        "get id (enormous)": lambda: q.get(ENORMOUS),
        "requeue_dead ids": lambda: q.requeue_dead("big", [2**70]),
        "purge_dead ids": lambda: q.purge_dead("big", [2**64]),
        "delete_history ids": lambda: Bulk(q).delete_history("dead", [2**64]),
        "history hi": lambda: Bulk(q).history("live", "big", 1, 2**70),
        "history lo": lambda: Bulk(q).history("live", "big", -(2**70), 1),
        "leased_messages ids": lambda: Bulk(q).leased_messages("big", "job", ids=(1, 2**70)),
        "leased_messages share": lambda: Bulk(q).leased_messages("big", "job", share=(0, 2**70)),
        "ack_lease ids": lambda: Bulk(q).ack_lease("big", "job", ids=(-(2**64), 1)),
        "stage_many part": lambda: Bulk(q).stage_many("job", 2**64, "big", [1]),
        "publish_staged parts": lambda: Bulk(q).publish_staged("job", [2**64]),
        "receive max_attempts": lambda: q.receive("big", max_attempts=2**40),
        "configure_topic max_attempts": lambda: q.configure_topic("big", max_attempts=HUGE),
        "ack of a forged id": lambda: q.ack(dataclasses.replace(m, id=2**70)),
        "nack of a forged id": lambda: q.nack(dataclasses.replace(m, id=ENORMOUS)),
        "ack of a forged lease": lambda: q.ack(dataclasses.replace(m, lease=5)),  # type: ignore[arg-type]
        "heartbeat of a surrogate lease": lambda: q.heartbeat(dataclasses.replace(
            m, lease="\ud800")),
    }
    for name, call in calls.items():
        with pytest.raises(tableq.InvalidArgument) as err:
            call()
        assert len(str(err.value)) < 400, name  # says what is wrong without echoing 400 digits
    _unchanged(q, "big", 1)
    q.ack(m)  # the real lease still works after all that
    with pytest.raises(tableq.InvalidArgument):
        tableq.connect(q._backend.url.raw, max_attempts=2**40)
    for bad in ({"base": HUGE}, {"max": ENORMOUS}, {"factor": float("inf")}):
        with pytest.raises(tableq.InvalidArgument):
            tableq.Backoff(**bad)


def test_ids_at_the_64_bit_edges_are_accepted(q: tableq.Queue) -> None:
    assert q.get(2**63 - 1) is None
    assert q.requeue_dead("edge", [2**63 - 1]) == 0
    assert Bulk(q).history("live", "edge", -(2**63), 2**63 - 1) == []


def test_error_texts_with_nul_and_lone_surrogates_are_stored_escaped(q: tableq.Queue) -> None:
    q.send("errs", 1)
    q.send("errs", 2)
    first, second = q.receive("errs", max=2)
    q.nack(first, error="bad \ud800 and \x00 here \U0001f389")  # a lone surrogate, a NUL
    again = [m for m in q.receive("errs", max=2) if m.id == first.id][0]
    assert again.last_error == "bad \\ud800 and \\x00 here \U0001f389"
    q.dead_letter(second, "decoded with surrogateescape: \udcff\x00")
    (dead,) = q.dead_letters("errs")
    assert dead.error == "decoded with surrogateescape: \\udcff\\x00"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 2**63, -(2**63) - 1,
                                   "\ud800", "a\x00b"])
def test_where_values_follow_one_rule_on_every_database(q: tableq.Queue, value: object) -> None:
    q.send("w", {"n": 1, "s": "x"})
    with pytest.raises(tableq.InvalidArgument, match="filter value"):
        q.receive("w", where={"n": value})
    with pytest.raises(tableq.InvalidArgument, match="filter value"):
        q.receive("w", where={"payload": {"s": value}})
    with q.transaction() as tx, pytest.raises(tableq.InvalidArgument):
        tx.receive("w", where={"n": value})
    _unchanged(q, "w", 1)
    assert q.peek("w")[0].attempts == 0


def test_where_numbers_at_the_64_bit_edges_match_alike(q: tableq.Queue) -> None:
    top, bottom = 2**63 - 1, -(2**63)
    q.send_many("edge", [{"n": top, "t": "top"}, {"n": top - 1, "t": "below"},
                         {"n": bottom, "t": "bottom"}, {"n": 1.5, "t": "half"}])
    for value, tag in ((top, "top"), (top - 1, "below"), (bottom, "bottom"), (1.5, "half")):
        assert [m.payload["t"] for m in q.receive("edge", where={"n": value}, max=5)] == [tag]
    assert q.receive("edge", where={"n": 1e308}) == []


def test_where_numbers_written_with_an_exponent_match_by_value(q: tableq.Queue) -> None:
    """Found by review: on MariaDB, whose JSON_TYPE calls 1e+16 and 1e-07 INTEGER, a filter on
    1e16 or 1e-7 was read as the integer 1 (CAST stops at the 'e'), so it delivered {"f": 1}
    and {"f": 1.0} and missed the message it asked for."""
    values: list[object] = [1, 1.0, 1e16, 10**16, 1e-7, 2.5e-5, -4e20]
    q.send_many("exp", [{"f": v, "i": i} for i, v in enumerate(values)])
    want = [(1, [0, 1]), (1.0, [0, 1]), (1e16, [2, 3]), (10**16, [2, 3]), (1e-7, [4]),
            (2.5e-5, [5]), (-4e20, [6])]
    for value, ids in want:
        got = q.receive("exp", where={"f": value}, max=10)
        assert sorted(m.payload["i"] for m in got) == ids, value
        for m in got:
            q.release(m)  # back, unread: each value sees every message


@pytest.mark.parametrize("field", ["a\n", "kind\n", "a\r\n", "\na"])
def test_filter_fields_with_a_newline_are_refused(q: tableq.Queue, field: str) -> None:
    q.send("f", {"a": 1, "kind": 2})
    with pytest.raises(tableq.InvalidName, match="filter field"):
        q.receive("f", where={field: 1})
    with pytest.raises(tableq.InvalidName, match="filter field"):
        q.receive("f", where={"payload": {field: 1}})
    assert q.receive("f", where={"a": 1})[0].payload == {"a": 1, "kind": 2}


@pytest.mark.parametrize("url", [
    "postgresql://nobody@127.0.0.1:1/db?schema=tq%0A",
    "mysql://nobody@127.0.0.1:1/db?prefix=tq_%0A",
    "sqlite:///never-created.db?prefix=tq_%0A",
    "postgresql://nobody@127.0.0.1:1/db?schema=%0Atq",
])
def test_namespaces_with_a_newline_never_reach_the_database(url: str, tmp_path) -> None:
    with pytest.raises(tableq.InvalidName, match="trailing newline"):
        tableq.connect(url)
    with pytest.raises(tableq.InvalidName):
        parse_url(url)


@pytest.mark.parametrize("text", ['{"a": 1e400}', "[-1e999]", "1" + "0" * 400 + ".5",
                                  '"\\ud800"', '{"\\udc80": 1}', '["ok", "\\udbff"]'])
def test_json_text_a_database_would_treat_differently_is_refused(q: tableq.Queue,
                                                                  text: str) -> None:
    with pytest.raises(tableq.PayloadInvalid, match="not JSON text"):
        q.send("jt", tableq.JsonText(text))
    with pytest.raises(tableq.PayloadInvalid, match="not JSON text"):
        q.send_many("jt", [1, tableq.JsonText(text)])
    with pytest.raises(tableq.PayloadInvalid, match="not JSON text"):
        Bulk(q).stage_many("job-jt", 0, "jt", [tableq.JsonText(text)])
    assert q.stats("jt")[0].live == 0


def test_json_text_with_escapes_that_are_fine_round_trips(q: tableq.Queue) -> None:
    # (Floats in exponent form are left out: PostgreSQL's jsonb gives 1e308 back as 309 digits,
    # an int in Python; that is not what this test is about.)
    texts = ['"\\ud83d\\ude00"', '"\\\\ud800"', "[2.5, -1e-400]", "12345678901234567890123"]
    want = ["\U0001f600", "\\ud800", [2.5, -0.0], 12345678901234567890123]
    q.send_many("jt-ok", [tableq.JsonText(t) for t in texts])
    assert [m.payload for m in q.receive("jt-ok", max=10)] == want


def test_a_literal_backslash_before_u0000_round_trips(q: tableq.Queue) -> None:
    payloads = [{"a": "\\u0000"}, "\\u0000", ["x\\\\u0000", {"k\\u0000": "\\\\\\u0000"}],
                {"a": "C:\\new\\u0000dir"}]
    for p in payloads:
        q.send("bs", p)
    q.send_many("bs-many", payloads)
    Bulk(q).stage_many("job-bs", 0, "bs-staged", payloads)
    Bulk(q).publish_staged("job-bs", [0])
    q.send("bs-text", tableq.JsonText('{"a": "\\\\u0000"}'))
    for topic in ("bs", "bs-many", "bs-staged"):
        assert [m.payload for m in q.receive(topic, max=10)] == payloads, topic
    assert q.receive("bs-text")[0].payload == {"a": "\\u0000"}
    for nul in ({"a": "\x00"}, "\\\x00", tableq.JsonText('"\\u0000"'),
                tableq.JsonText('"\\\\\\u0000"')):
        with pytest.raises(tableq.PayloadInvalid, match="NUL"):
            q.send("bs", nul)


def test_a_message_made_by_hand_cannot_settle_itself(q: tableq.Queue) -> None:
    q.send("hand", 1)
    (m,) = q.receive("hand")
    forged = tableq.Message(m.id, "hand", None, None, 1, {}, 0, 1, m.created_at,
                            m.available_at, m.first_available_at, m.lease)
    for action in (forged.ack, forged.nack, forged.heartbeat,
                   lambda: forged.dead_letter("x"), lambda: forged.forward("next", 1)):
        with pytest.raises(tableq.InvalidArgument, match="on the Queue that received it"):
            action()
    q.ack(forged)  # through the Queue it is fine: the id and lease are what count
    assert q.stats("hand")[0].live == 0


def test_register_kind_refuses_what_it_cannot_use() -> None:
    with tableq.connect("sqlite:///unused-never-opened.db") as q:
        with pytest.raises(tableq.InvalidArgument, match="pydantic model class"):
            q.register_kind("k", model=object)
        with pytest.raises(tableq.InvalidArgument, match="must be a function"):
            q.register_kind("k", encode=5)
        with pytest.raises(tableq.InvalidArgument, match="must be a function"):
            q.register_kind("k", decode="json.loads")
        with pytest.raises(tableq.InvalidArgument, match="not both"):
            q.register_kind("k", encode=str, model=dict)
        assert q._kinds.names() == []


@pytest.mark.parametrize("db_url", ["mysql"], indirect=True)
def test_mysql_migration_lock_timeout_is_a_database_timeout(db_url: str) -> None:
    from dbhelpers import driver_connection

    q = tableq.connect(db_url)
    holder = driver_connection(db_url)
    try:
        cur = holder.cursor()
        cur.execute("SELECT GET_LOCK(CONCAT('tableq.migrate.', DATABASE(), '.', %s), 0)",
                    (q._backend.prefix,))
        assert cur.fetchone()[0] == 1
        q._backend.migration_lock_wait_s = 1  # the default is 60 s
        with pytest.raises(tableq.DatabaseTimeout, match="migration lock") as err:
            q.migrate()
        assert "IS_USED_LOCK" in str(err.value)
    finally:
        holder.close()
        q.close()
    with tableq.connect(db_url, migrate=True) as again:  # the holder is gone: it works
        assert again._backend.schema_version() >= 1


@pytest.mark.parametrize("db_url", ["mysql"], indirect=True)
def test_mysql_access_denied_says_check_user_and_password(db_url: str) -> None:
    u = parse_url(db_url)
    bad = f"mysql://no_such_user_tq:Sekr3tPw@{u.host}:{u.port or 3306}/{u.database}"
    with tableq.connect(bad) as q, pytest.raises(tableq.DatabaseUnavailable) as err:
        q.stats()
    text = str(err.value)
    assert "Access denied" in text and "check the user and password" in text
    assert "Sekr3tPw" not in text and "no_such_user_tq" in text


def test_sqlite_cannot_open_advice_speaks_of_files(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/no/such/dir/q.db"
    with tableq.connect(url) as q, pytest.raises(tableq.DatabaseUnavailable) as err:
        q.stats()
    text = str(err.value)
    assert "directory exists" in text and "read and write" in text
    assert "server" not in text and "password" not in text


def test_spark_before_option_out_of_range_is_an_option_error() -> None:
    from tableq.spark.options import OptionError, ReadOptions

    for before in ("inf", "-inf", "nan", "1e20", "99999999999999999999"):
        with pytest.raises(OptionError, match="before"):
            ReadOptions.parse({"url": "sqlite:///x.db", "topic": "t", "before": before})
    ok = ReadOptions.parse({"url": "sqlite:///x.db", "topic": "t", "before": "1700000000"})
    assert ok.before is not None and ok.before.year == 2023


@pytest.mark.parametrize("db_url", ["mysql"], indirect=True)
def test_mysql_charging_one_message_reads_it_by_primary_key(db_url: str) -> None:
    # MariaDB updates through a one-tuple (id, lease, attempts) IN ((...)) by scanning the
    # whole primary key: a worker charging one message at a time then spent ~16 ms a charge
    # at 20k rows and stayed there (its pace, slowed by the charges, kept the window at one).
    with tableq.connect(db_url, migrate=True) as q:
        q.send_many("t", [{"n": i} for i in range(200)])
        backend = q._backend
        for charges in ([(5, "a", 0)], [(5, "a", 0), (6, "b", 0)]):
            params = {**backend._charges(charges), **backend._span("extend", 30)}
            [plan] = backend.run(
                lambda cur, p=params: backend._all(cur, "EXPLAIN " + backend.Q.message_charge, p))
            assert (plan["type"], plan["key"]) == ("range", "PRIMARY"), plan


def test_an_option_of_another_database_is_invalid_argument(db_url: str) -> None:
    """Backend options differ by database (SQLite's synchronous, the servers' pool_size,
    PostgreSQL's vacuum): one the database does not have is refused by name, with the ones
    it has, never a TypeError from a constructor."""
    wrong = {"sqlite": "vacuum", "postgres": "synchronous", "mysql": "vacuum"}
    dialect = parse_url(db_url).dialect
    with pytest.raises(tableq.InvalidArgument, match=f"{wrong[dialect]} is not an option of a "
                                                     f"{dialect} queue; its options are: "):
        tableq.connect(db_url, **{wrong[dialect]: False})


@pytest.mark.parametrize("options", [
    {"pool_size": 0}, {"pool_size": -1}, {"pool_size": "5"}, {"pool_size": 10**6},
    {"connect_timeout_s": 0}, {"connect_timeout_s": -1}, {"connect_timeout_s": float("nan")},
    {"transaction_idle_timeout_s": -5}, {"transaction_idle_timeout_s": 1e12},
    {"transaction_idle_timeout_s": float("nan")}, {"transaction_idle_timeout_s": "300"},
    {"busy_timeout_s": -1}, {"busy_timeout_s": float("nan")}, {"busy_timeout_s": "x"},
    {"synchronous": ""}, {"synchronous": 2},
    {"tcp_keepalive_s": 1}, {"tcp_keepalive_s": -1}, {"tcp_keepalive_s": 10**6},
])
def test_backend_options_no_database_takes_are_refused_by_connect(db_url: str,
                                                                 options: dict) -> None:
    """Found by review: these were accepted by connect() and then leaked ValueError or
    TypeError, failed on first use with the driver's wording, or silently meant another
    setting (a pool of 0, synchronous='' as FULL). An option the dialect does not have is
    refused as before; a bad value of one it has is an InvalidArgument naming it."""
    (name,) = options
    with pytest.raises(tableq.InvalidArgument, match=name):
        tableq.connect(db_url, **options)


@pytest.mark.parametrize("db_url", ["postgres", "mysql"], indirect=True)  # SQLite: no server
def test_a_zero_transaction_idle_timeout_is_no_limit_on_every_server(db_url: str) -> None:
    """0 turns the limit off (it was 1 second on MariaDB and off on PostgreSQL)."""
    import time

    with tableq.connect(db_url, migrate=True, transaction_idle_timeout_s=0) as q:
        with q.transaction() as tx:
            tx.send("idle0", 1)
            time.sleep(1.6)  # past the 1 second MariaDB made of 0
            tx.send("idle0", 2)
        assert q.stats("idle0")[0].ready == 2


def _keepalive_of(fd: int) -> tuple[int, ...]:
    import socket

    sock = socket.socket(fileno=os.dup(fd))
    try:
        return (sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                *(sock.getsockopt(socket.IPPROTO_TCP, option) for option in (
                    socket.TCP_KEEPIDLE, socket.TCP_KEEPINTVL, socket.TCP_KEEPCNT,
                    socket.TCP_USER_TIMEOUT)))
    finally:
        sock.close()


@pytest.mark.skipif(sys.platform != "linux", reason="reads Linux's TCP socket options")
@pytest.mark.parametrize("db_url", ["postgres", "mysql"], indirect=True)  # SQLite: no server
def test_connections_give_up_on_a_silent_server_after_tcp_keepalive_s(db_url: str) -> None:
    """Every connection to a server probes it when silent (TCP keepalive, 60 s by default)
    and gives up on unacknowledged data as long after, so a network cut that leaves no reset
    behind is an outage the worker reconnects from, not a call waiting for hours (Linux's
    keepalive, which both drivers turn on, starts after two hours). Read from the sockets
    themselves: the pool's and, on PostgreSQL, the LISTEN connection's."""
    with tableq.connect(db_url, migrate=True) as q, q._backend.pool.connection() as conn:
        fd = conn.fileno() if hasattr(conn, "fileno") else conn._sock.fileno()
        assert _keepalive_of(fd) == (1, 30, 10, 3, 60_000)
    with tableq.connect(db_url, tcp_keepalive_s=12) as q:
        with q._backend.pool.connection() as conn:
            fd = conn.fileno() if hasattr(conn, "fileno") else conn._sock.fileno()
            assert _keepalive_of(fd) == (1, 6, 2, 3, 12_000)
        if parse_url(db_url).dialect == "postgres":
            listener = q.listener(["ka"])
            try:
                assert _keepalive_of(listener._conn.fileno()) == (1, 6, 2, 3, 12_000)  # type: ignore[union-attr]
            finally:
                listener.close()  # type: ignore[union-attr]
    with tableq.connect(db_url, tcp_keepalive_s=0) as q, q._backend.pool.connection() as conn:
        fd = conn.fileno() if hasattr(conn, "fileno") else conn._sock.fileno()
        with open("/proc/sys/net/ipv4/tcp_keepalive_time") as os_default:
            assert _keepalive_of(fd)[:2] == (1, int(os_default.read()))  # the drivers' own


def test_many_calls_take_lists_or_iterables_of_messages(q: tableq.Queue) -> None:
    for bad in (None, 5, "ab", {"a": 1}):
        with pytest.raises(tableq.InvalidArgument, match="send_many takes a list"):
            q.send_many("lists", bad)  # type: ignore[arg-type]
        with pytest.raises(tableq.InvalidArgument, match="ack_many takes a list"):
            q.ack_many(bad)  # type: ignore[arg-type]
        with pytest.raises(tableq.InvalidArgument, match="heartbeat_many takes a list"):
            q.heartbeat_many(bad)  # type: ignore[arg-type]
    q.send_many("lists", [1, 2, 3])
    got = q.receive("lists", max=3)
    q.release(got[1])
    with pytest.raises(tableq.LeaseLost):  # a generator is read once, and the lost one found
        q.ack_many(m for m in got)
    assert [m.payload for m in q.receive("lists", max=3)] == [2]


def test_a_due_time_whose_zone_has_no_offset_is_refused_like_a_naive_one(
    q: tableq.Queue,
) -> None:
    from datetime import datetime, tzinfo

    class NoOffset(tzinfo):
        def utcoffset(self, dt):  # type: ignore[no-untyped-def]
            return None

    with pytest.raises(tableq.InvalidArgument, match="timezone-aware"):
        q.send("zone", 1, at=datetime(2030, 1, 1, tzinfo=NoOffset()))


def test_bulk_calls_refuse_arguments_of_the_wrong_shape(q: tableq.Queue) -> None:
    """Found by review: these leaked ValueError or TypeError, publish_staged's expected_rows
    of "1" or -1 came back as LoadIncomplete, and accept_kinds("abc") registered the kinds
    a, b and c."""
    bulk = Bulk(q)
    cases = {
        "share": lambda: bulk.leased_messages("t", "job", share=None),  # type: ignore[arg-type]
        "share ": lambda: bulk.leased_messages("t", "job", share=(1,)),  # type: ignore[arg-type]
        "ids": lambda: bulk.leased_messages("t", "job", ids=(1,)),  # type: ignore[arg-type]
        "part numbers": lambda: bulk.publish_staged("job", 5),  # type: ignore[arg-type]
        "expected_rows": lambda: bulk.publish_staged("job", [0], expected_rows="1"),  # type: ignore[arg-type]
        "expected_rows ": lambda: bulk.publish_staged("job", [0], expected_rows=-1),
        "kind names": lambda: bulk.accept_kinds("abc"),
        "kind names ": lambda: bulk.accept_kinds(None),  # type: ignore[arg-type]
    }
    for what, call in cases.items():
        with pytest.raises(tableq.InvalidArgument, match=what.strip()):
            call()
    assert "a" not in q._kinds.names()


@pytest.mark.parametrize("options", [{"retention": "no"}, {"strict_kinds": "false"},
                                     {"retention": 1}, {"strict_kinds": None}])
def test_yes_no_options_take_true_or_false_only(db_url: str, options: dict) -> None:
    """retention="no" meant True (bool("no")), and strict_kinds="false" was kept as a string."""
    (name,) = options
    with pytest.raises(tableq.InvalidArgument, match=f"{name} must be True or False"):
        tableq.connect(db_url, **options)


def test_a_where_field_given_twice_with_two_values_is_refused(q: tableq.Queue) -> None:
    """{"f": 1, "payload": {"f": 2}} kept the second value without a word."""
    q.send_many("twice", [{"f": 1}, {"f": 2}])
    with pytest.raises(tableq.InvalidArgument, match="'f' twice"):
        q.receive("twice", where={"f": 1, "payload": {"f": 2}})
    with pytest.raises(tableq.InvalidArgument, match="'f' twice"):
        q.receive("twice", where={"f": 1, "payload": {"f": True}})  # True == 1 in Python
    assert [m.payload for m in q.receive("twice", where={"f": 2, "payload": {"f": 2}})] == [
        {"f": 2}]  # the same value twice is only redundant
