"""The history checker's own rules, on hand-made histories (pure: no database)."""

from __future__ import annotations

from checker import Effect, SendOp, check


def _sent(*values: str) -> list[SendOp]:
    return [SendOp(v, "ok", 0.0) for v in values]


def test_lost_duplicated_and_unexpected_are_counted() -> None:
    r = check("T", "sqlite", sends=_sent("a", "b", "c") + [SendOp("d", "fail", 0.0)],
              effects=[Effect("a"), Effect("a"), Effect("d")], dead=["c"])
    assert r.lost == ["b"] and r.duplicated == {"a": 2} and r.unexpected == ["d"]
    assert not r.ok
    assert r.line().startswith("T/sqlite: 1 lost / 1 dup of N=3")


def test_an_unknown_send_that_never_ran_is_not_lost() -> None:
    r = check("T", "postgres", sends=[SendOp("a", "info", 0.0)], effects=[])
    assert r.ok and r.lost == [] and r.unknown == 1


def test_at_least_once_duplicates_pass_unless_their_leases_overlap() -> None:
    after_expiry = [Effect("a", "l1", at=1.0, until=5.0, since=0.0),
                    Effect("a", "l2", at=6.0, until=11.0, since=5.5)]
    r = check("T", "mysql", sends=_sent("a"), effects=after_expiry, mode="at_least_once")
    assert r.ok and r.dup == 1 and r.dup_live == []
    while_leased = [Effect("a", "l1", at=1.0, until=5.0, since=0.0),
                    Effect("a", "l2", at=4.0, until=9.0, since=3.0)]
    r = check("T", "mysql", sends=_sent("a"), effects=while_leased, mode="at_least_once")
    assert not r.ok and r.dup_live == ["a"]


def test_a_starved_handler_committing_after_its_lease_is_not_an_overlap() -> None:
    """Handler 1 was leased at 0 until 5 but only committed at 7 (starved of CPU); handler 2
    was leased at 5.5, after the expiry, and committed at 6. Judged by commit times these
    would overlap; judged by lease times (what the queue promises) they do not."""
    effects = [Effect("a", "l1", at=7.0, until=5.0, since=0.0),
               Effect("a", "l2", at=6.0, until=10.5, since=5.5)]
    r = check("T", "sqlite", sends=_sent("a"), effects=effects, mode="at_least_once")
    assert r.dup_live == [] and r.ok
    effects = [Effect("a", "l1", at=7.0, until=5.0, since=0.0),
               Effect("a", "l2", at=6.0, until=10.5, since=4.0)]  # handed out at 4: a bug
    r = check("T", "sqlite", sends=_sent("a"), effects=effects, mode="at_least_once")
    assert r.dup_live == ["a"]
