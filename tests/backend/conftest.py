"""The backend conformance suite runs against the Backend seam itself, not through Queue:
`backend` is a migrated backend under a test clock, once per dialect in tests/conftest.py's
BACKENDS (each on a fresh database, file or schema). A new dialect passes by joining that
list and passing every test here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tableq.backends.base import Backend
from tableq.connect import open_backend
from tableq.url import parse_url


@pytest.fixture
def backend(db_url: str) -> Iterator[Backend]:
    b = open_backend(parse_url(db_url), test_clock=True)
    try:
        b.migrate()
        yield b
    finally:
        b.close()
