"""A real tableq server on a free port, over a fresh queue database per test (SQLite,
PostgreSQL and MariaDB through `db_url`), and tokens to call it with."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

import tableq
from tableq.server import auth, create_app
from tableq.server.serve import background
from tableq.server.store import Store


@dataclass
class Server:
    url: str
    queue: tableq.Queue
    app: Any
    tokens: dict[str, str] = field(default_factory=dict)

    def token(self, role: str, topics: list[str] | None = None, **options: Any) -> str:
        issued = auth.issue(role, topics or ["*"], **options)
        Store(self.queue).save_token(issued.record)
        self.tokens[issued.secret] = issued.record.id
        return issued.secret

    def issue(self, role: str, topics: list[str] | None = None,
              **options: Any) -> auth.IssuedToken:
        issued = auth.issue(role, topics or ["*"], **options)
        Store(self.queue).save_token(issued.record)
        return issued

    def client(self, token: str | None = None, **options: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **options)


def start(queue: tableq.Queue, **settings: Any) -> Iterator[Server]:
    settings.setdefault("sample_interval_s", 0.5)
    app = create_app(queue, **settings)
    with background(app) as url:
        yield Server(url, queue, app)


@pytest.fixture
def sq(db_url: str) -> Iterator[tableq.Queue]:
    """The queue behind the server: kinds relayed unvalidated, as `tableq serve` opens it."""
    queue = tableq.connect(db_url, migrate=True, strict_kinds=False)
    try:
        yield queue
    finally:
        queue.close()


@pytest.fixture
def server(sq: tableq.Queue) -> Iterator[Server]:
    yield from start(sq)


@pytest.fixture
def admin(server: Server) -> httpx.Client:
    with server.client(server.token("admin")) as c:
        yield c  # type: ignore[misc]
