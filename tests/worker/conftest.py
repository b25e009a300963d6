"""Fixtures for worker tests: Apps on the per-test database with short timeouts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tableq.worker import App


@pytest.fixture
def make_app(db_url: str) -> Iterator[Callable[..., App]]:
    """App factory on this test's database: migrated, fast polling."""
    made: list[App] = []

    def make(**options: Any) -> App:
        options.setdefault("poll_interval_max", 0.2)
        options.setdefault("migrate", True)
        app = App(db_url, **options)
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()
