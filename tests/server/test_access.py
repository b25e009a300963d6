"""H2/H3: the role x route x topic-scope matrix over HTTP, and message ids that belong to
another topic (BOLA): every cell gets exactly the status the roles define, and a refused call
changes nothing."""

from __future__ import annotations

import httpx
import pytest

from tableq.server.auth import ROLE_ACTIONS, secret_hash
from tableq.server.store import Store
from tableq.testing import wait_until
from tests.server.conftest import Server

IN, OUT = "a.x", "other.topic"  # tokens are scoped to "a.*"
TOPIC_ROUTES = [  # (method, path suffix, body, action)
    ("POST", "messages", {"payload": 1}, "send"),
    ("POST", "receive", {"max": 1}, "consume"),
    ("GET", "messages", None, "view"),
    ("GET", "stats", None, "stats"),
    ("GET", "dead", None, "view"),
    ("POST", "requeue-dead", {}, "manage"),
    ("POST", "purge-dead", {}, "manage"),
    ("POST", "purge", None, "manage"),
]
ID_ROUTES = [("ack", {}), ("nack", {}), ("release", {}), ("heartbeat", {}),
             ("dead-letter", {"error": "x"}), ("forward", {"topic": IN, "payload": 1})]
GLOBAL_ROUTES = ["/v1/topics", "/v1/stats", "/v1/time", "/v1/whoami"]
ROLES = ["producer", "consumer", "reader", "admin"]


def _credentials(server: Server) -> dict[str, str | None]:
    creds: dict[str, str | None] = {"none": None, "bad": "tq_" + "x" * 43}
    for role in ROLES:
        creds[role] = server.token(role, ["a.*"])
    revoked = server.issue("admin", ["*"])
    Store(server.queue).revoke_token(revoked.record.id)
    creds["revoked"] = revoked.secret
    creds["expired"] = server.token("admin", ["*"], expires_in_s=0.05)
    expired_hash = secret_hash(creds["expired"])
    wait_until(lambda: Store(server.queue).find_token(secret_sha256=expired_hash).expired,  # type: ignore[union-attr]
               timeout=10)
    return creds


def _expected(role: str, action: str, topic: str) -> int:
    if role not in ROLES:
        return 401
    return 200 if action in ROLE_ACTIONS[role] and topic.startswith("a.") else 403


def test_role_route_scope_matrix(server: Server, admin: httpx.Client) -> None:
    creds = _credentials(server)
    cells = wrong = 0
    for name, secret in creds.items():
        with server.client(secret) as c:
            for topic in (IN, OUT):
                for method, suffix, body, action in TOPIC_ROUTES:
                    r = c.request(method, f"/v1/topics/{topic}/{suffix}", json=body)
                    cells += 1
                    if r.status_code != _expected(name, action, topic):
                        wrong += 1
                        print("WRONG", name, method, topic, suffix, r.status_code, r.text)
            for path in GLOBAL_ROUTES:
                cells += 1
                if c.get(path).status_code != (401 if name not in ROLES else 200):
                    wrong += 1
                    print("WRONG", name, path)
            cells += 1
            metrics = c.get("/metrics").status_code
            if metrics != (401 if name not in ROLES else
                           200 if name in ("reader", "admin") else 403):
                wrong += 1
                print("WRONG", name, "/metrics", metrics)
    assert wrong == 0, f"{wrong} of {cells} cells wrong"
    assert cells == len(creds) * (2 * len(TOPIC_ROUTES) + len(GLOBAL_ROUTES) + 1)


@pytest.mark.parametrize("action,body", ID_ROUTES)
def test_id_routes_check_the_row_topic(server: Server, admin: httpx.Client, action: str,
                                       body: dict) -> None:
    creds = _credentials(server)
    for name, secret in creds.items():
        for topic in (IN, OUT):
            admin.post(f"/v1/topics/{topic}/messages", json={"payload": {"for": name}})
            msg = admin.post(f"/v1/topics/{topic}/receive", json={}).json()["messages"][0]
            before = server.queue.get(msg["id"])
            with server.client(secret) as c:
                # The URL names no topic: only the row decides. Any id can be guessed.
                r = c.post(f"/v1/messages/{msg['id']}/{action}",
                           json={"lease": msg["lease"], **body})
            allowed = topic == IN and (name == "admin" or (name == "consumer"
                                                           and action != "forward"))
            expected = 200 if allowed else (401 if name not in ROLES else 403)
            assert r.status_code == expected, (name, topic, action, r.text)
            if not allowed:
                after = server.queue.get(msg["id"])
                assert after == before  # nothing changed: same lease expiry, attempts, error
            admin.post(f"/v1/topics/{topic}/purge")


def test_guessed_ids_reveal_nothing(server: Server, admin: httpx.Client) -> None:
    admin.post(f"/v1/topics/{OUT}/messages", json={"payload": "secret"})
    theirs = server.queue.peek(OUT)[0]
    with server.client(server.token("consumer", ["a.*"])) as c:
        assert c.get(f"/v1/messages/{theirs.id}").status_code == 404
        assert c.get("/v1/messages/987654").status_code == 404
        r = c.post(f"/v1/messages/{theirs.id}/ack", json={"lease": "guess"})
        assert r.status_code == 403 and OUT not in r.text and "secret" not in r.text
        assert c.get("/v1/topics").json()["topics"] == []
        assert c.get("/v1/stats").json()["topics"] == []
    assert server.queue.peek(OUT)[0] == theirs


def test_every_api_route_is_documented_with_security(server: Server) -> None:
    spec = httpx.get(server.url + "/openapi.json").json()
    documented = {(method.upper(), path) for path, ops in spec["paths"].items()
                  for method in ops}
    app_routes = {(method, route.path.replace(":path", ""))
                  for route in server.app.routes if hasattr(route, "methods")
                  for method in route.methods
                  if route.path.startswith(("/v1", "/metrics", "/healthz", "/readyz"))}
    assert app_routes <= documented, app_routes - documented
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            public = path in ("/healthz", "/readyz")
            assert ("security" in op and op["security"] == []) == public, (method, path)
            if not public:
                assert op.get("security"), (method, path)
