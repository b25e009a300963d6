"""Loads a backend's queries.sql (named queries) and its numbered migrations. The namespace
placeholder ({schema} or {p}) is filled once at load from a validated identifier."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*(:\w+)?\s*$", re.MULTILINE)


class Queries:
    """Attribute access to the named queries of one backend: Q.message_claim."""

    def __init__(self, queries: dict[str, str]) -> None:
        self._queries = queries
        self.__dict__.update(queries)

    def names(self) -> set[str]:
        return set(self._queries)

    def __getattr__(self, name: str) -> str:  # only reached for unknown names
        raise AttributeError(f"no query named {name!r} in this backend's queries.sql")


def parse_named(text: str) -> dict[str, str]:
    queries: dict[str, str] = {}
    matches = list(_NAME.finditer(text))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = "\n".join(
            line for line in text[m.end() : end].strip().splitlines() if not line.startswith("--")
        ).strip()
        if body.endswith(";"):
            body = body[:-1].rstrip()
        if m.group(1) in queries:
            raise ValueError(f"query {m.group(1)!r} is defined twice")
        queries[m.group(1)] = body
    return queries


def load_queries(package: str, placeholder: str, value: str) -> Queries:
    text = resources.files(package).joinpath("queries.sql").read_text("utf-8")
    return Queries({k: v.replace(placeholder, value) for k, v in parse_named(text).items()})


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


def apply_pending(migrations: list[Migration], done: set[int], execute: Any,
                  record_query: str) -> list[int]:
    """Runs every migration not in `done`, in order, each followed by its record row, through
    `execute(sql, params=None)` (a cursor's or connection's execute). Returns the versions
    applied. The caller holds the migration lock and owns the transaction."""
    applied = []
    for mig in migrations:
        if mig.version in done:
            continue
        for statement in mig.statements:
            execute(statement)
        execute(record_query, {"version": mig.version, "name": mig.name})
        applied.append(mig.version)
    return applied


def split_statements(sql: str) -> list[str]:
    """Splits on ';' at the end of a line, except inside $$ ... $$ bodies."""
    out, current, in_body = [], [], False
    for line in sql.splitlines():
        if line.strip().startswith("--") and not in_body:
            continue
        current.append(line)
        if line.count("$$") % 2 == 1:
            in_body = not in_body
        if not in_body and line.rstrip().endswith(";"):
            stmt = "\n".join(current).strip().rstrip(";").strip()
            if stmt:
                out.append(stmt)
            current = []
    tail = "\n".join(current).strip()
    if tail:
        out.append(tail)
    return out


def load_migrations(package: str, placeholder: str, value: str) -> list[Migration]:
    folder = resources.files(package).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        m = re.match(r"^(\d{4})_(\w+)\.sql$", entry.name)
        if m:
            sql = entry.read_text("utf-8").replace(placeholder, value)
            found.append(Migration(int(m.group(1)), m.group(2), tuple(split_statements(sql))))
    found.sort(key=lambda mig: mig.version)
    return found
