"""The /v1 API over real HTTP against a running server, on every backend: each route, its
errors, leases, idempotency, long polling and limits."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import tableq
from tableq.server.store import Store
from tableq.testing import wait_until
from tests.server.conftest import Server


def test_send_receive_ack_round_trip(server: Server, admin: httpx.Client) -> None:
    r = admin.post("/v1/topics/orders%2Feu/messages", json={
        "payload": {"n": 1}, "key": "k1", "kind": "order", "headers": {"trace": "t1"},
        "priority": 5})
    assert r.status_code == 200, r.text
    first = r.json()
    assert first["status"] == "sent" and first["key"] == "k1"
    dup = admin.post("/v1/topics/orders%2Feu/messages", json={"payload": {"n": 2}, "key": "k1"})
    assert dup.json() == {"id": first["id"], "status": "duplicate", "key": "k1"}
    batch = admin.post("/v1/topics/orders%2Feu/messages", json={"messages": [
        {"payload": "plain"}, {"payload_base64": base64.b64encode(b"\x00\xff").decode()},
        {"payload": [1, 2], "delay": 3600}]})
    assert [x["status"] for x in batch.json()["results"]] == ["sent"] * 3
    st = admin.get("/v1/topics/orders%2Feu/stats").json()
    assert (st["ready"], st["scheduled"]) == (3, 1)
    lib = server.queue.stats("orders/eu")[0]
    assert (st["ready"], st["scheduled"], st["in_flight"], st["dead"]) == (
        lib.ready, lib.scheduled, lib.in_flight, lib.dead)
    got = admin.post("/v1/topics/orders%2Feu/receive", json={"max": 10,
                                                             "visibility_timeout": 30}).json()
    msgs = got["messages"]
    assert [m["priority"] for m in msgs][0] == 5 and len(msgs) == 3
    top = msgs[0]
    assert top["payload"] == {"n": 1} and top["headers"] == {"trace": "t1"}
    assert top["kind"] == "order" and top["attempts"] == 1 and top["lease"]
    raw = next(m for m in msgs if m["payload_base64"] is not None)
    assert base64.b64decode(raw["payload_base64"]) == b"\x00\xff" and raw["payload"] is None
    assert admin.post(f"/v1/messages/{top['id']}/ack",
                      json={"lease": top["lease"]}).json() == {"id": top["id"],
                                                              "status": "acked"}
    again = admin.post(f"/v1/messages/{top['id']}/ack", json={"lease": top["lease"]})
    assert again.status_code == 409 and again.json()["error"]["code"] == "LeaseLost"
    rest = [m for m in msgs if m["id"] != top["id"]]
    out = admin.post("/v1/messages/ack", json={"messages": [
        {"id": m["id"], "lease": m["lease"]} for m in rest] + [
        {"id": top["id"], "lease": top["lease"]}]}).json()
    assert sorted(out["acked"]) == sorted(m["id"] for m in rest) and out["lost"] == [top["id"]]
    assert server.queue.stats("orders/eu")[0].ready == 0
    admin.post("/v1/topics/orders/eu/messages", json={"payload": "twice"})
    (m,) = admin.post("/v1/topics/orders/eu/receive", json={}).json()["messages"]
    ref = {"id": m["id"], "lease": m["lease"]}
    out = admin.post("/v1/messages/ack", json={"messages": [ref, ref]}).json()
    assert out == {"acked": [m["id"]], "lost": []}, out  # was {"acked": [], "lost": [id, id]}


def test_nack_heartbeat_release_dead_letter_forward(server: Server,
                                                    admin: httpx.Client) -> None:
    for i in range(4):
        admin.post("/v1/topics/jobs/messages", json={"payload": {"i": i}})
    msgs = admin.post("/v1/topics/jobs/receive", json={"max": 4}).json()["messages"]
    a, b, c, d = msgs
    hb = admin.post(f"/v1/messages/{a['id']}/heartbeat",
                    json={"lease": a["lease"], "extend": 600, "progress": {"step": 2}})
    assert hb.status_code == 200 and hb.json()["lease_expires_at"] > a["lease_expires_at"]
    many = admin.post("/v1/messages/heartbeat", json={
        "messages": [{"id": a["id"], "lease": a["lease"]}, {"id": b["id"], "lease": "stale"}],
        "extend": 60}).json()
    assert [h["id"] for h in many["held"]] == [a["id"]] and many["lost"] == [b["id"]]
    assert admin.post(f"/v1/messages/{a['id']}/nack",
                      json={"lease": a["lease"], "delay": 0, "error": "boom"}).status_code == 200
    assert admin.post(f"/v1/messages/{b['id']}/release",
                      json={"lease": b["lease"]}).json()["status"] == "released"
    assert admin.post(f"/v1/messages/{c['id']}/dead-letter",
                      json={"lease": c["lease"], "error": "poison <b>"}).status_code == 200
    fwd = admin.post(f"/v1/messages/{d['id']}/forward",
                     json={"lease": d["lease"], "topic": "next", "payload": {"from": d["id"]}})
    assert fwd.status_code == 200 and fwd.json()["status"] == "sent"
    peeked = admin.get("/v1/topics/jobs/messages", params={"limit": 10}).json()["messages"]
    assert sorted(m["id"] for m in peeked) == sorted([a["id"], b["id"]])
    assert all(m["lease"] is None for m in peeked)
    again = next(m for m in peeked if m["id"] == a["id"])
    assert again["last_error"] == "boom" and again["attempts"] == 1
    assert next(m for m in peeked if m["id"] == b["id"])["attempts"] == 0  # refunded
    assert admin.get(f"/v1/messages/{a['id']}").json()["id"] == a["id"]
    assert admin.get("/v1/messages/999999").status_code == 404
    dead = admin.get("/v1/topics/jobs/dead").json()["dead_letters"]
    assert [(x["id"], x["error"]) for x in dead] == [(c["id"], "poison <b>")]
    assert admin.post("/v1/topics/jobs/requeue-dead", json={"ids": [c["id"]]}).json() == {
        "count": 1}
    assert admin.get("/v1/topics/jobs/stats").json()["ready"] == 3
    assert sorted(admin.get("/v1/topics").json()["topics"]) == ["jobs", "next"]
    assert {s["topic"] for s in admin.get("/v1/stats").json()["topics"]} == {"jobs", "next"}
    assert admin.post("/v1/topics/jobs/purge").json() == {"count": 3}
    m = admin.post("/v1/topics/next/receive", json={}).json()["messages"][0]
    admin.post(f"/v1/messages/{m['id']}/dead-letter", json={"lease": m["lease"], "error": "x"})
    assert admin.post("/v1/topics/next/purge-dead", json={}).json() == {"count": 1}
    assert admin.get("/v1/time").json()["now"]
    who = admin.get("/v1/whoami").json()
    assert who["role"] == "admin" and who["limits"]["max_body_bytes"] == 1 << 20


def test_stale_lease_ack_is_lease_lost_and_changes_nothing(server: Server,
                                                           admin: httpx.Client) -> None:
    admin.post("/v1/topics/t/messages", json={"payload": 1})
    first = admin.post("/v1/topics/t/receive", json={"visibility_timeout": 0}).json()[
        "messages"][0]
    second = admin.post("/v1/topics/t/receive", json={"visibility_timeout": 60}).json()[
        "messages"][0]
    assert second["id"] == first["id"] and second["lease"] != first["lease"]
    for action, body in (("ack", {}), ("nack", {}), ("heartbeat", {}), ("release", {}),
                         ("dead-letter", {"error": "x"})):
        r = admin.post(f"/v1/messages/{first['id']}/{action}", json={"lease": first["lease"],
                                                                     **body})
        assert r.status_code == 409, (action, r.text)
        err = r.json()["error"]
        assert err["code"] == "LeaseLost" and err["message_id"] == first["id"]
    held = server.queue.peek("t")
    assert len(held) == 1 and held[0].attempts == 2
    assert admin.post(f"/v1/messages/{second['id']}/ack",
                      json={"lease": second["lease"]}).status_code == 200


def test_idempotent_send_retried_returns_the_first_result(server: Server,
                                                          admin: httpx.Client) -> None:
    headers = {"Idempotency-Key": "order-77-attempt"}
    body = {"payload": {"order": 77}}
    first = admin.post("/v1/topics/pay/messages", json=body, headers=headers)
    retry = admin.post("/v1/topics/pay/messages", json=body, headers=headers)
    assert first.status_code == retry.status_code == 200
    assert retry.json() == first.json() and retry.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert server.queue.stats("pay")[0].ready == 1
    reused = admin.post("/v1/topics/pay/messages", json={"payload": {"order": 78}},
                        headers=headers)
    assert reused.status_code == 409
    assert reused.json()["error"]["code"] == "IdempotencyKeyReused"
    batch = {"messages": [{"payload": i} for i in range(3)]}
    b1 = admin.post("/v1/topics/pay/messages", json=batch, headers={"Idempotency-Key": "b"})
    b2 = admin.post("/v1/topics/pay/messages", json=batch, headers={"Idempotency-Key": "b"})
    assert b1.json() == b2.json() and server.queue.stats("pay")[0].ready == 4
    # Keys belong to a token: another token's same key is a new request.
    with server.client(server.token("producer", ["pay"])) as other:
        assert other.post("/v1/topics/pay/messages", json=body,
                          headers=headers).json()["id"] != first.json()["id"]
    bad = admin.post("/v1/topics/pay/messages", json=body, headers={"Idempotency-Key": "a b"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "InvalidIdempotencyKey"
    # A replay sends nothing, so it counts nothing.
    text = admin.get("/metrics").text
    assert 'tableq_sent_total{topic="pay"} 5.0' in text, text


def test_concurrent_idempotent_retries_send_once(server: Server, admin: httpx.Client) -> None:
    results: list[dict] = []
    lock = threading.Lock()

    def go() -> None:
        with server.client(next(iter(server.tokens))) as c:
            r = c.post("/v1/topics/race/messages", json={"payload": "x"},
                       headers={"Idempotency-Key": "same"})
        with lock:
            results.append(r.json())

    threads = [threading.Thread(target=go) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r["id"] for r in results}) == 1, results
    assert server.queue.stats("race")[0].ready == 1


def test_long_poll_wakes_on_a_send(server: Server, admin: httpx.Client) -> None:
    got: dict[str, object] = {}

    def poll() -> None:
        started = time.monotonic()
        with server.client(next(iter(server.tokens))) as c:
            got["r"] = c.post("/v1/topics/lp/receive", json={"wait_s": 15}).json()
        got["s"] = time.monotonic() - started

    t = threading.Thread(target=poll)
    t.start()
    wait_until(lambda: server.app.state.tableq.waiter._waiting.get("lp"),
                              timeout=10)
    # Sent straight into the database, not through the server: PostgreSQL's NOTIFY (or the
    # polling elsewhere) must bring it to the waiting receive.
    server.queue.send("lp", {"hello": 1})
    t.join(20)
    assert got["r"]["messages"][0]["payload"] == {"hello": 1}  # type: ignore[index]
    # On PostgreSQL the wake-up came from LISTEN/NOTIFY (one connection for the server).
    assert server.app.state.tableq.waiter.listening == (server.queue.dialect == "postgres")
    assert got["s"] < (3 if server.queue.dialect == "postgres" else 5)  # type: ignore[operator]
    empty_started = time.monotonic()
    assert admin.post("/v1/topics/lp/receive", json={"wait_s": 0.3}).json() == {"messages": []}
    assert time.monotonic() - empty_started >= 0.3


@pytest.mark.parametrize("mode", ["at_least_once", "at_most_once"])
def test_a_long_poll_whose_client_left_takes_nothing(server: Server, mode: str) -> None:
    """The client gives up while its long poll waits; a send then ends the wait. The poll
    must not lease (or, at most once, delete) the message for nobody."""
    token = server.token("consumer", ["gone"])
    waiter = server.app.state.tableq.waiter

    def poll() -> None:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"},
                          timeout=1) as c, pytest.raises(httpx.ReadTimeout):
            c.post("/v1/topics/gone/receive", json={"wait_s": 15, "mode": mode,
                                                    "visibility_timeout": 300})

    t = threading.Thread(target=poll)
    t.start()
    wait_until(lambda: waiter._waiting.get("gone"), timeout=10)
    t.join(10)
    server.queue.send("gone", {"n": 1})
    wait_until(lambda: not waiter._waiting.get("gone"), timeout=10)  # the poll has ended
    stats = server.queue.stats("gone")[0]
    assert (stats.ready, stats.in_flight) == (1, 0)
    (msg,) = server.queue.receive("gone")
    assert msg.attempts == 1


def test_an_at_most_once_receive_whose_client_leaves_during_the_take_removes_nothing(
    server: Server, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by review: the take deleted the messages, and a client that timed out while it
    ran got nothing (1,000 messages gone). Now they are claimed and removed in one
    transaction, which rolls back when the client has left by the time they are in hand."""
    from tableq.server import api
    from tableq.transaction import Transaction

    token = server.token("consumer", ["leave"])
    server.queue.send_many("leave", list(range(50)))
    claimed, ended = threading.Event(), threading.Event()
    real_receive, real_take = Transaction.receive, api.take_while_connected

    def take(*args: Any, **kwargs: Any) -> Any:
        try:
            return real_take(*args, **kwargs)
        finally:
            ended.set()

    def slow_receive(self: Transaction, *args: Any, **kwargs: Any) -> Any:
        got = real_receive(self, *args, **kwargs)
        claimed.set()
        time.sleep(1.0)  # the client times out meanwhile
        return got

    monkeypatch.setattr(Transaction, "receive", slow_receive)
    monkeypatch.setattr(api, "take_while_connected", take)
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"},
                      timeout=0.5) as c, pytest.raises(httpx.ReadTimeout):
        c.post("/v1/topics/leave/receive", json={"max": 50, "mode": "at_most_once"})
    assert claimed.wait(5) and ended.wait(10)
    assert server.queue.stats("leave")[0].ready == 50
    monkeypatch.setattr(Transaction, "receive", real_receive)
    with server.client(token) as c:  # a client that stays gets them, removed, once
        got = c.post("/v1/topics/leave/receive", json={"max": 50, "mode": "at_most_once"})
    msgs = got.json()["messages"]
    assert [x["payload"] for x in msgs] == list(range(50))
    assert all(x["lease"] is None and x["attempts"] == 1 for x in msgs)
    assert server.queue.stats("leave") == [] or server.queue.stats("leave")[0].live == 0


def test_a_long_poll_stops_once_its_token_is_revoked(server: Server) -> None:
    """Found by review: a poll that began before `tableq token revoke` went on waiting and
    delivered a message sent 3 s later (revocation takes effect at once, the docs say)."""
    issued = server.issue("consumer", ["rv"])
    got: dict[str, Any] = {}

    def poll() -> None:
        with server.client(issued.secret) as c:
            got["r"] = c.post("/v1/topics/rv/receive", json={"wait_s": 10})

    t = threading.Thread(target=poll)
    t.start()
    wait_until(lambda: server.app.state.tableq.waiter._waiting.get("rv"), timeout=10)
    Store(server.queue).revoke_token(issued.record.id)
    time.sleep(1.5)  # past the poll's next check
    server.queue.send("rv", 1)
    t.join(15)
    assert got["r"].status_code == 401 and "revoked" in got["r"].text, got["r"].text
    assert server.queue.stats("rv")[0].ready == 1


def test_errors_are_json_with_codes_and_no_tracebacks(server: Server,
                                                      admin: httpx.Client) -> None:
    server.queue.max_payload_bytes = 100_000  # under the body cap, so the library's check shows
    cases = [
        (admin.post("/v1/topics/t/messages", json={"payload": 1, "attempts": 9}), 422,
         "ValidationError"),
        (admin.post("/v1/topics/t/messages", json={"payload": 1, "priority": "high"}), 422,
         "ValidationError"),
        (admin.post("/v1/topics/%20bad/messages", json={"payload": 1}), 422, "ValidationError"),
        (admin.post("/v1/topics/t/messages", content=b"{not json",
                    headers={"Content-Type": "application/json"}), 400, "BadRequest"),
        (admin.post("/v1/topics/t/messages", json={"payload": 1, "key": "k",
                                                   "on_duplicate": "error"}), 200, None),
        (admin.post("/v1/topics/t/messages", json={"payload": 2, "key": "k",
                                                   "on_duplicate": "error"}), 409,
         "DuplicateMessage"),
        (admin.post("/v1/topics/t/receive", json={"max": 0}), 422, "ValidationError"),
        (admin.post("/v1/topics/t/receive", json={"max": 10_001}), 422, "InvalidArgument"),
        (admin.post("/v1/topics/t/receive", json={"wait_s": 21}), 422, "ValidationError"),
        (admin.get("/v1/messages/abc"), 404, "NotFound"),
        (admin.get("/v1/nowhere"), 404, "NotFound"),
        (admin.post("/v1/topics/t/messages", json={"payload": "x" * 200_000}), 413,
         "PayloadTooLarge"),
        (admin.post("/v1/topics/t/messages", content=b"[" * 200_000 + b"]" * 200_000,
                    headers={"Content-Type": "application/json"}), None, None),
        # JSON without its content type (curl -d sends a form's): 415 with advice, not a
        # 422 about the body's fields (found by review).
        (admin.post("/v1/topics/t/messages", content=b'{"payload": 3}',
                    headers={"Content-Type": "application/x-www-form-urlencoded"}), 415,
         "UnsupportedMediaType"),
        (admin.post("/v1/topics/t/receive", content=b'{"max": 1}'), 415,
         "UnsupportedMediaType"),
        (admin.post("/v1/topics/t/messages", content=b'{"payload": 4}',
                    headers={"Content-Type": "application/vnd.api+json"}), 200, None),
    ]
    wrong = admin.put("/v1/topics/t/messages", json={"payload": 1})
    assert wrong.status_code == 405
    assert {"GET", "POST"} <= set(wrong.headers["Allow"].split(", ")), wrong.headers
    for r, status, code in cases:
        if status is None:
            assert 400 <= r.status_code < 500, r.text
        else:
            assert r.status_code == status, r.text
        if code is not None:
            err = r.json()["error"]
            assert err["code"] == code and err["message"]
        assert "Traceback" not in r.text
    assert server.queue.stats("t")[0].ready == 2


def test_request_limits_before_parsing(server: Server, admin: httpx.Client) -> None:
    big = b'{"payload": "' + b"x" * (1 << 20) + b'"}'
    r = admin.post("/v1/topics/t/messages", content=big,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "RequestTooLarge"

    def chunks():  # no Content-Length: the running count must stop it
        for _ in range(40):
            yield b"x" * 65536

    r = admin.post("/v1/topics/t/messages", content=chunks(),
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    r = admin.post("/v1/topics/t/messages",
                   json={"messages": [{"payload": i} for i in range(1001)]})
    assert r.status_code == 422 and r.json()["error"]["code"] == "BatchTooLarge"
    assert server.queue.stats("t")[0].ready == 0


def test_oversized_requests_cost_no_memory(server: Server, admin: httpx.Client) -> None:
    """H5: 50 concurrent oversized bodies are refused (413) without the server's memory
    growing by more than a few MiB (it runs in this process)."""
    import socket
    from urllib.parse import urlsplit

    def rss_mib() -> float:
        with open("/proc/self/status") as f:
            line = next(x for x in f if x.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024

    def big() -> Iterator[bytes]:
        for _ in range(64):  # 4 MiB each, in chunks, no Content-Length
            yield b"x" * 65536

    statuses: list[int] = []
    before = rss_mib()

    token = next(iter(server.tokens))
    where = urlsplit(server.url)

    def one(i: int) -> None:
        if i % 2:
            with server.client(token) as c:
                r = c.post("/v1/topics/t/messages", content=big(),
                           headers={"Content-Type": "application/json"})
            statuses.append(r.status_code)
            return
        # Announced as 100 MB and never sent: refused before a byte of body is read.
        with socket.create_connection((where.hostname, where.port), timeout=30) as sock:
            sock.sendall(f"POST /v1/topics/t/messages HTTP/1.1\r\nHost: {where.netloc}\r\n"
                         f"Authorization: Bearer {token}\r\nContent-Type: application/json"
                         f"\r\nContent-Length: {100 << 20}\r\n\r\n".encode())
            statuses.append(int(sock.recv(4096).split()[1]))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(set(statuses)) == [413], statuses
    assert rss_mib() - before < 64


def test_authentication(server: Server) -> None:
    admin_token = server.token("admin")
    with server.client() as anon:
        for r in (anon.get("/v1/stats"), anon.post("/v1/topics/t/messages", json={"payload": 1}),
                  anon.get("/v1/stats", params={"access_token": admin_token}),
                  anon.get("/v1/stats", headers={"Authorization": f"Bearer {admin_token}x"}),
                  anon.get("/v1/stats", headers={"Authorization": "Bearer tq_" + "A" * 43}),
                  anon.get("/v1/stats", headers={"Authorization": f"Basic {admin_token}"})):
            assert r.status_code == 401, r.text
            assert r.json()["error"]["code"] == "AuthenticationFailed"
            assert r.headers["WWW-Authenticate"] == 'Bearer realm="tableq"'
        # A valid header plus a token in the URL is refused too: URLs leak into logs.
        r = anon.get("/v1/stats", params={"token": admin_token},
                     headers={"Authorization": f"Bearer {admin_token}"})
        assert r.status_code == 401 and "URL" in r.json()["error"]["message"]
    with server.client(admin_token) as c:
        assert c.get("/v1/stats").status_code == 200
        Store(server.queue).revoke_token(server.tokens[admin_token])
        r = c.get("/v1/stats")  # the very next request
        assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]
    short = server.token("admin", expires_in_s=0.5)
    with server.client(short) as c:
        wait_until(lambda: c.get("/v1/stats").status_code == 401, timeout=10)
        assert "expired" in c.get("/v1/stats").json()["error"]["message"]


def test_health_and_metrics(server: Server, admin: httpx.Client) -> None:
    with server.client() as anon:
        assert anon.get("/healthz").json() == {"status": "ok", "detail": None}
        assert anon.get("/readyz").status_code == 200
        assert anon.get("/metrics").status_code == 401
    admin.post("/v1/topics/m1/messages", json={"messages": [{"payload": 1}] * 3})
    admin.post("/v1/topics/m2/messages", json={"payload": 1})
    msg = admin.post("/v1/topics/m1/receive", json={}).json()["messages"][0]
    admin.post(f"/v1/messages/{msg['id']}/ack", json={"lease": msg["lease"]})
    # Stats are cached for a second so that many scrapers cost one query.
    def scraped() -> str | None:
        text = admin.get("/metrics").text
        return text if 'tableq_ready_messages{topic="m1"} 2.0' in text else None

    text = wait_until(scraped, timeout=5)
    assert 'tableq_sent_total{topic="m1"} 3.0' in text
    assert 'tableq_acked_total{topic="m1"} 1.0' in text
    assert "tableq_http_request_duration_seconds_bucket" in text
    assert 'route="/v1/topics/{topic:path}/messages"' in text
    with server.client(server.token("reader", ["m2"])) as reader:
        scoped = reader.get("/metrics").text
        assert 'topic="m2"' in scoped and 'topic="m1"' not in scoped
    with server.client(server.token("producer", ["*"])) as producer:
        assert producer.get("/metrics").status_code == 403


def test_readyz_reports_a_database_without_migrations(db_url: str) -> None:
    from tests.server.conftest import start

    queue = tableq.connect(db_url, strict_kinds=False)
    try:
        for srv in start(queue, sample_interval_s=60):
            with srv.client() as c:
                r = c.get("/readyz")
                assert r.status_code == 503 and r.json()["status"] == "unavailable"
                assert "migrate" in r.json()["detail"]
    finally:
        queue.close()


def test_health_of_an_unreachable_database_names_no_host() -> None:
    """/healthz needs no token: it says the database failed, never where it is."""
    from tableq.server.serve import free_port
    from tests.server.conftest import start

    queue = tableq.connect(f"postgresql://app:pw@127.0.0.1:{free_port()}/secretdb",
                           strict_kinds=False)
    try:
        for srv in start(queue, sample_interval_s=60):
            with srv.client() as c:
                r = c.get("/healthz")
        assert r.status_code == 503 and r.json()["detail"].startswith("DatabaseUnavailable")
        assert "127.0.0.1" not in r.text and "secretdb" not in r.text and "app" not in r.text
    finally:
        queue.close()


@pytest.mark.parametrize("path", ["/", "/v1/stats", "/healthz", "/openapi.json"])
def test_security_headers_on_every_response(server: Server, path: str) -> None:
    with server.client() as c:
        r = c.get(path)
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["x-frame-options"] == "DENY"


def test_a_bug_answers_500_with_the_security_headers_and_is_counted(
    server: Server, admin: httpx.Client, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by review: a 500 came from Starlette's outer error middleware, past the layer
    that adds the security headers and times requests, so it had neither and never showed
    in /metrics. (A dashboard form of 1,001 fields was one: now a 400.)"""
    from tableq.server import api

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(api, "message_out", broken)
    server.queue.send("bug", 1)
    r = admin.post("/v1/topics/bug/receive", json={})
    assert r.status_code == 500 and r.json()["error"]["code"] == "InternalError", r.text
    assert "a bug" not in r.text and r.headers["x-frame-options"] == "DENY"
    metrics = admin.get("/metrics").text
    assert 'route="/v1/topics/{topic:path}/receive",status="500"' in metrics, metrics
    with server.client() as c:
        form = "&".join(f"f{i}=1" for i in range(1001))
        r = c.post("/ui/login", content=form,
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400 and "more than 1000 fields" in r.text, r.text


def test_at_with_any_utc_offset(server: Server, admin: httpx.Client) -> None:
    """RFC 3339 allows offsets up to 23:59; PostgreSQL only +-15:59: the time is kept in UTC
    (as asked for: a time in the past is due at the send)."""
    r = admin.post("/v1/topics/t/messages",
                   json={"payload": 1, "at": "2022-07-20T14:47:02-20:13"})
    assert r.status_code == 200, r.text
    m = server.queue.get(r.json()["id"])
    assert m is not None and m.first_available_at.isoformat() == "2022-07-21T11:00:02+00:00"


def test_give_back_releases_what_no_client_will_see(server: Server) -> None:
    """What a long poll leased for a client that left goes back at once, its attempt
    given back (the poll's last check, between the receive and the answer)."""
    from tableq.server.api import give_back

    q = server.queue
    q.send_many("gb", [1, 2])
    give_back(q, q.receive("gb", max=2, visibility_timeout=300))
    assert q.stats("gb")[0].ready == 2
    assert [m.attempts for m in q.receive("gb", max=2)] == [1, 1]
