"""Helpers for tests that need the backend's own driver, as an application would."""

from __future__ import annotations

import tableq.url


def _conninfo_pg(url: str) -> str:
    return url.split("?", 1)[0].replace("postgresql+psycopg://", "postgresql://")


def driver_connection(url: str, **options):  # type: ignore[no-untyped-def]
    """A plain DB-API connection of the backend's own driver to the same database, as an
    application would hold one (for outbox tests). Not autocommit. `options` go to PyMySQL's
    connect (use_unicode=False, client_flag=...)."""
    u = tableq.url.parse_url(url)
    if u.dialect == "sqlite":
        import sqlite3

        return sqlite3.connect(u.database, timeout=30)
    if u.dialect == "postgres":
        import psycopg

        return psycopg.connect(_conninfo_pg(url))
    import pymysql

    return pymysql.connect(host=u.host, port=u.port or 3306, user=u.user or "root",
                           password=u.password or "", database=u.database, autocommit=False,
                           **options)


def root_conftest():  # type: ignore[no-untyped-def]
    """tests/conftest.py as a module (PG_URL, require, make_url). Loaded by path: other
    conftest.py files (tests/faults, tests/spark) may hold the name `conftest` first."""
    import importlib.util
    import sys
    from pathlib import Path

    name = "tableq_tests_root_conftest"  # the name tests/spark/conftest.py loads it under
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(
            "conftest.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
