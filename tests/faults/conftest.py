"""Fixtures for fault tests: throwaway PostgreSQL and MariaDB servers owned by the test
module (never the shared servers on 5432/3306), crashed and restarted at will."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from servers import ThrowawayMariaDB, ThrowawayPostgres
from workerfaults import fault_db, server_db, shared_servers  # noqa: F401 - worker fault fixtures


@pytest.fixture(scope="module")
def pg_server() -> Iterator[ThrowawayPostgres]:
    server = ThrowawayPostgres()
    server.start()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="module")
def maria_server() -> Iterator[ThrowawayMariaDB]:
    server = ThrowawayMariaDB()
    server.start()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="module", params=["postgres", "mysql"])
def server(request: pytest.FixtureRequest) -> Iterator[ThrowawayPostgres | ThrowawayMariaDB]:
    """One throwaway server per database that has one (PostgreSQL, MariaDB)."""
    server = ThrowawayPostgres() if request.param == "postgres" else ThrowawayMariaDB()
    server.start()
    try:
        yield server
    finally:
        server.destroy()
