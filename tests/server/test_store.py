"""The token and idempotency stores through the Queue API, on every backend."""

from __future__ import annotations

import dataclasses
import threading

import pytest

import tableq
from tableq.server import auth
from tableq.server.store import Store
from tableq.testing import wait_until


def test_migrations_are_current_after_migrate(q: tableq.Queue) -> None:
    assert q.pending_migrations() == []
    assert 3 in q._backend.migrations_applied()


def test_pending_migrations_on_an_empty_database(db_url: str) -> None:
    with tableq.connect(db_url) as fresh, pytest.raises(tableq.SchemaNotMigrated):
        fresh.pending_migrations()


def test_token_round_trip_hash_only(q: tableq.Queue) -> None:
    issued = auth.issue("consumer", ["orders.*", "emails"], name="svc", sqs=True)
    Store(q).save_token(issued.record)
    found = Store(q).find_token(secret_sha256=auth.secret_hash(issued.secret))
    assert found is not None and found.active
    assert found.id == issued.record.id and found.role == "consumer"
    assert found.topics == ("orders.*", "emails") and found.name == "svc"
    assert auth.secret_matches(issued.secret, found)
    assert not auth.secret_matches(issued.secret + "x", found)
    # The secret itself is stored nowhere.
    assert issued.secret not in repr(Store(q).list_tokens())
    by_key = Store(q).find_token(access_key=issued.record.access_key)
    assert by_key is not None and by_key.sqs_secret == issued.sqs_secret
    assert Store(q).find_token(secret_sha256=auth.secret_hash("tq_nope")) is None


def test_token_secrets_stay_out_of_reprs(q: tableq.Queue) -> None:
    issued = auth.issue("admin", ["*"], sqs=True)
    Store(q).save_token(issued.record)
    found = Store(q).find_token(secret_sha256=auth.secret_hash(issued.secret))
    assert found is not None
    for shown in (repr(issued), repr(issued.record), repr(found)):
        assert issued.secret not in shown and str(issued.sqs_secret) not in shown
        assert auth.secret_hash(issued.secret) not in shown


@pytest.mark.parametrize("expiry", [100 * 366 * 86400.0, float("inf"), float("nan"), 0, -1])
def test_token_expiry_is_bounded(expiry: float) -> None:
    """An expiry past year 9999 was stored and then broke `tableq token list` for every
    token; infinity raised OverflowError on MariaDB."""
    with pytest.raises(tableq.InvalidArgument, match="expiry"):
        auth.issue("admin", ["*"], expires_in_s=expiry)


def test_revoke_and_expiry(q: tableq.Queue) -> None:
    a = auth.issue("admin", ["*"])
    b = auth.issue("producer", ["x"], expires_in_s=0.2)
    Store(q).save_token(a.record)
    Store(q).save_token(b.record)
    assert Store(q).revoke_token(a.record.id) is True
    assert Store(q).revoke_token(a.record.id) is False
    assert Store(q).revoke_token("tqt_missing") is False
    found = Store(q).find_token(secret_sha256=a.record.secret_sha256)
    assert found is not None and found.revoked_at is not None and not found.active
    wait_until(lambda: Store(q).find_token(secret_sha256=b.record.secret_sha256).expired,  # type: ignore[union-attr]
               timeout=10)
    assert {t.id for t in Store(q).list_tokens()} == {a.record.id, b.record.id}


def test_idempotent_send_commits_with_its_record(q: tableq.Queue) -> None:
    with Store(q).idempotent("tok", "k1", "fp") as call:
        assert call.earlier is None
        sent = call.tx.send("t", {"n": 1})
        call.finish(201, f'{{"id": {sent.id}}}')
    with Store(q).idempotent("tok", "k1", "fp") as call:
        assert call.earlier is not None
        assert (call.earlier.status, call.earlier.response) == (201, f'{{"id": {sent.id}}}')
    assert q.stats("t")[0].ready == 1
    # Another token's key is its own.
    with Store(q).idempotent("other", "k1", "fp") as call:
        assert call.earlier is None


def test_idempotent_rollback_forgets_the_key(q: tableq.Queue) -> None:
    with pytest.raises(RuntimeError), Store(q).idempotent("tok", "k2", "fp") as call:
        call.tx.send("t", {"n": 1})
        raise RuntimeError("the send failed after all")
    assert q.stats("t")[0].ready == 0
    with Store(q).idempotent("tok", "k2", "fp") as call:
        assert call.earlier is None


def test_concurrent_retry_waits_for_the_first(q: tableq.Queue) -> None:
    """The retry blocks until the first request's transaction ends, then gets its result
    (on SQLite it waits for the write lock, before the key is even looked at)."""
    inside, release = threading.Event(), threading.Event()
    seen: list[object] = []

    def first() -> None:
        with Store(q).idempotent("tok", "k3", "fp") as call:
            call.tx.send("t", {"n": 1})
            call.finish(201, "first")
            inside.set()
            release.wait(10)

    def second() -> None:
        with Store(q).idempotent("tok", "k3", "fp") as call:
            seen.append(call.earlier)

    t1 = threading.Thread(target=first)
    t1.start()
    inside.wait(10)
    t2 = threading.Thread(target=second)
    t2.start()
    t2.join(0.3)
    assert t2.is_alive()  # blocked on the first transaction's key
    release.set()
    t1.join(10)
    t2.join(10)
    assert len(seen) == 1 and dataclasses.asdict(seen[0])["response"] == "first"  # type: ignore[call-overload]
    assert q.stats("t")[0].ready == 1


def test_expire_idempotency(q: tableq.Queue) -> None:
    with Store(q).idempotent("tok", "k4", "fp") as call:
        call.finish(200, "x")
    assert Store(q).expire_idempotency(3600) == 0
    # "Older than 0 s" needs the clock to move past the record's own instant.
    assert wait_until(lambda: Store(q).expire_idempotency(0), timeout=5) == 1
