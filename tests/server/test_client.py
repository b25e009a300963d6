"""tableq.client.Client against a running server, the worker over --api, and the CLI's
serve and token commands, on every backend."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import tableq
from tableq.client import Client
from tableq.server.serve import free_port
from tableq.testing import wait_until
from tests.server.conftest import Server
from tests.server.relay import Relay

APPS = Path(__file__).parent / "apps"


def test_release_takes_a_delay_over_http_too(server: Server) -> None:
    """The worker gives a message back for later (redelivered_while_held) through whichever
    queue it runs on, this client included."""
    with Client(server.url, server.token("admin")) as c:
        c.send_many("rel", [1, 2])
        first, second = c.receive("rel", max=2)
        c.release(first, delay=3600)
        c.release(second)
        (s,) = c.stats("rel", exact=True)
        assert (s.ready, s.scheduled, s.in_flight) == (1, 1, 0)
        assert [(m.payload, m.attempts) for m in c.receive("rel", max=2)] == [(2, 1)]


def test_client_has_the_queue_methods(server: Server) -> None:
    with Client(server.url, server.token("admin")) as c:
        first = c.send("c/t", {"a": 1}, key="k", headers={"h": "v"}, priority=3)
        assert c.send("c/t", {"a": 2}, key="k") == tableq.SendResult(first.id, "duplicate", "k")
        c.send_many("c/t", [b"\x01raw", {"payload": {"b": 1}, "delay": 3600}, [1, 2]])
        assert c.stats("c/t")[0].ready == 3 and c.stats("c/t")[0].scheduled == 1
        assert [s.topic for s in c.stats()] == ["c/t"] and c.topics() == ["c/t"]
        (exact,) = c.stats("c/t", exact=True)
        assert (exact.ready, exact.estimated) == (3, False)
        assert [(s.topic, s.ready) for s in c.stats(exact=True)] == [("c/t", 3)]
        msgs = c.receive("c/t", max=10, visibility_timeout=60)
        assert [m.payload for m in msgs][0] == {"a": 1} and msgs[0].headers == {"h": "v"}
        assert any(m.payload == b"\x01raw" for m in msgs)
        a, b, d = msgs
        held = c.heartbeat_many([a, b], extend=120)
        assert {m.id for m in held} == {a.id, b.id}
        a2 = c.heartbeat(a, extend=300, progress={"p": 1})
        assert a2.lease_expires_at > a.lease_expires_at  # type: ignore[operator]
        c.nack(b, delay=0, error="retry me")
        with pytest.raises(tableq.InvalidArgument, match="needs the reason"):
            c.dead_letter(d, "")  # refused as Queue refuses it, before any request
        c.dead_letter(d, "bad <data>")
        with pytest.raises(tableq.LeaseLost) as lost:
            c.ack_many([a, b])  # b was nacked: its lease is gone; a is acked
        assert lost.value.message_ids == [b.id]
        assert c.get(a.id) is None and c.get(b.id).last_error == "retry me"  # type: ignore[union-attr]
        assert [x.error for x in c.dead_letters("c/t")] == ["bad <data>"]
        assert c.requeue_dead("c/t") == 1 and c.purge_dead("c/t") == 0
        assert len(c.peek("c/t", 10)) == 3 and c.purge("c/t") == 3
        assert abs((c.now() - server.queue.now()).total_seconds()) < 5
        with pytest.raises(tableq.LeaseLost):
            c.ack(a)
        with pytest.raises(tableq.InvalidArgument):
            c.send("c/t", 1, priority=2**40)
        c.send("c/t", 1, key="one")
        with pytest.raises(tableq.InvalidArgument, match="would match every message"):
            c.receive("c/t", where={"key": None})  # as Queue.receive refuses it
        assert c.peek("c/t", 10)[0].attempts == 0  # nothing was leased
    with Client(server.url, server.token("producer", ["x"])) as p:
        with pytest.raises(tableq.PermissionDenied):
            p.send("c/t", 1)
        with pytest.raises(tableq.PermissionDenied):
            p.receive("x")
    with Client(server.url, "tq_" + "n" * 43) as bad, pytest.raises(tableq.AuthenticationFailed):
        bad.topics()
    with Client(f"http://127.0.0.1:{free_port()}", "tq_x") as gone, \
            pytest.raises(tableq.ServerUnavailable):
        gone.send("t", 1)


def test_worker_runs_handlers_over_the_api(server: Server) -> None:
    sys.path.insert(0, str(APPS))
    try:
        import api_jobs  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(APPS))
    server.queue.send_many("in", [{"n": i} for i in range(20)] + ["poison"])
    app = tableq.App(max_attempts=2)
    app.handler("in", retry=tableq.Backoff(base=0.01, max=0.01))(api_jobs.double)
    app.use_queue(Client(server.url, server.token("admin", ["in", "out"])))
    assert app.run_worker(burst=True, install_signals=False) == 0
    done = sorted(m.payload["n"] for m in server.queue.receive("out", max=100))
    assert done == [2 * i for i in range(20)]
    assert [d.error for d in server.queue.dead_letters("in")][0].endswith(
        "ValueError: poison payload")
    assert server.queue.stats("in")[0].live == 0


def _tableq(url: str, *args: str, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tableq.cli", "--url", url, *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_cli_serve_tokens_and_worker_api(db_url: str) -> None:
    assert _tableq(db_url, "migrate").returncode == 0
    made = _tableq(db_url, "token", "create", "--role", "admin", "--topics", "in",
                   "--topics", "out", "--name", "ci", "--sqs")
    assert made.returncode == 0, made.stderr
    lines = made.stdout.strip().splitlines()
    token = lines[-1]
    assert token.startswith("tq_") and lines[-3].startswith("AWS_ACCESS_KEY_ID=TQ")
    assert lines[-2].startswith("AWS_SECRET_ACCESS_KEY=")
    port = free_port()
    serve = subprocess.Popen([sys.executable, "-m", "tableq.cli", "--url", db_url, "serve",
                              "--port", str(port), "--log-level", "WARNING"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            try:
                return httpx.get(base + "/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, timeout=30, interval=0.1)
        auth = {"Authorization": f"Bearer {token}"}
        r = httpx.post(base + "/v1/topics/in/messages", headers=auth,
                       json={"messages": [{"payload": {"n": 1}}, {"payload": {"n": 2}}]})
        assert r.status_code == 200, r.text
        work = _tableq(db_url, "worker", "api_jobs:app", "--api", base, "--burst",
                       env={"TABLEQ_TOKEN": token, "PYTHONPATH": str(APPS)})
        assert work.returncode == 0, work.stderr
        out = httpx.post(base + "/v1/topics/out/receive", headers=auth,
                         json={"max": 10}).json()["messages"]
        assert sorted(m["payload"]["n"] for m in out) == [2, 4]
        token_id = lines[0].split()[2].rstrip(":")
        listed = _tableq(db_url, "token", "list", "--json")
        assert token_id in listed.stdout and token not in listed.stdout
        assert _tableq(db_url, "token", "revoke", token_id).returncode == 0
        assert httpx.get(base + "/v1/stats", headers=auth).status_code == 401
        assert _tableq(db_url, "token", "revoke", token_id).returncode != 0
    finally:
        serve.terminate()
        serve.wait(timeout=30)


def test_exactly_once_handlers_are_refused_over_the_api(server: Server) -> None:
    """Refused before any message is taken (at run time each attempt would fail and the
    message would be dead-lettered for a setup mistake)."""
    server.queue.send("in", {"n": 1})
    app = tableq.App()

    @app.handler("in", mode="exactly_once")
    def double(message: tableq.Message) -> None:
        raise AssertionError("must not run")

    app.use_queue(Client(server.url, server.token("admin")))
    with pytest.raises(tableq.ConfigurationError, match="exactly_once handlers of in"):
        app.run_worker(burst=True, install_signals=False)
    stats = server.queue.stats("in")[0]
    assert (stats.ready, stats.in_flight, stats.dead) == (1, 0, 0)


def test_a_gateway_error_is_an_outage_for_the_worker() -> None:
    """A proxy in front of a restarting server answers 502/503/504 with an HTML page: the
    client says ServerUnavailable, which the worker treats as an outage (it keeps its acks
    and retries them) rather than an error of the call (which would drop them)."""
    import http.server
    import threading

    from tableq.worker.health import is_outage

    class Gateway(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b"<html><body>502 Bad Gateway</body></html>"
            self.send_response(502)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        with Client(f"http://127.0.0.1:{httpd.server_address[1]}", "tq_x") as c, \
                pytest.raises(tableq.ServerUnavailable) as down:
            c.send("t", 1)
        assert is_outage(down.value)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_lost_reply_is_sent_again_only_when_that_is_harmless(server: Server) -> None:
    """The request reached the server and was done; its reply was lost on the way back. A
    read, a send (Idempotency-Key) or a heartbeat is sent again; an at-most-once receive or
    an ack is not (a second receive would take and lose a second batch; a second ack would
    call the acked message lost): ServerUnavailable says it may have taken effect."""
    relay = Relay(int(server.url.rsplit(":", 1)[1]))
    try:
        with Client(relay.url, server.token("admin")) as c:
            c.send_many("lost", list(range(6)))

            relay.lose_next_reply()
            before = relay.requests
            with pytest.raises(tableq.ServerUnavailable, match="may have taken effect"):
                c.receive("lost", max=2, mode="at_most_once")
            assert relay.requests == before + 1  # sent once: one batch of two gone, not two
            assert server.queue.stats("lost", exact=True)[0].ready == 4

            (msg,) = c.receive("lost", max=1)
            relay.lose_next_reply()
            with pytest.raises(tableq.ServerUnavailable, match="may have taken effect"):
                c.ack(msg)
            (s,) = server.queue.stats("lost", exact=True)
            assert (s.ready, s.in_flight) == (3, 0)  # acked once, and no LeaseLost for it

            (msg,) = c.receive("lost", max=1)
            relay.lose_next_reply()
            before = relay.requests
            assert c.heartbeat(msg, extend=300).lease_expires_at is not None
            assert relay.requests == before + 2

            relay.lose_next_reply()
            sent = c.send("lost", "once")
            assert sent.status == "sent"
            assert [m.payload for m in server.queue.peek("lost", limit=10)].count("once") == 1
            relay.lose_next_reply()
            assert c.topics() == ["lost"]

            c.send("gone", 1)
            relay.end_connections()
            time.sleep(0.1)
            before = relay.requests
            # A POST with no body goes out in one write, so a closed connection would fail
            # only when its reply is read: it is seen before it is used and not used.
            assert c.purge("gone") == 1
            assert relay.requests == before + 1
    finally:
        relay.close()


def test_a_connection_the_server_closed_while_idle_is_replaced(sq: tableq.Queue) -> None:
    """A server that ends kept-alive connections after a second: the next call, an ack that is
    never sent twice, goes out on a fresh connection and succeeds."""
    from tableq.server import create_app
    from tableq.server.serve import background

    app = create_app(sq)
    with background(app, timeout_keep_alive=1) as url:
        token = Server(url, sq, app).token("admin")
        with Client(url, token) as c:
            c.send("idle", 1)
            (msg,) = c.receive("idle")
            time.sleep(2.0)  # past the server's keep-alive: it closes the connection
            c.ack(msg)
    assert sq.stats("idle", exact=True)[0].in_flight == 0


def test_a_kept_alive_socket_is_checked_whatever_its_descriptor() -> None:
    """select() refuses descriptors from 1024 on, so every call opened a new connection in a
    process holding many files (found by review); poll() has no such limit."""
    import resource
    import socket

    from tableq.client import _closed_by_peer

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        pytest.skip("the file limit stays under 1100 descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100), hard))
    a, b = socket.socketpair()
    high = os.dup2(a.fileno(), 1090)
    sock = socket.socket(fileno=high)
    try:
        assert not _closed_by_peer(sock)
        b.close()
        assert _closed_by_peer(sock)
    finally:
        sock.close()
        a.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
