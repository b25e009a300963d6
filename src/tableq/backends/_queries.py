"""Loads a backend's queries.sql (named queries) and its numbered migrations.

Every statement is a named query, run exactly as written: nothing is spliced into SQL per
call. Where dialects or calls differ in shape, they use distinct named queries (a receive
with a filter runs the *_where twin of the plain one; a batch travels as one array or JSON
parameter), never string surgery, and no query holds a block-comment marker (test_unit).

Identifiers are filled once, at load, from fixed values, because SQL cannot bind them:
the namespace placeholder ({schema} or {p}) from the validated URL, PostgreSQL's LISTEN
channel ({channel}, derived from the schema), PostgreSQL's schema name as a string literal
in migrations ({schema_name}: its wake() function keys its locks and channel by it), MySQL's
binary collation in migrations ({bin}, chosen by server flavour), and a test clock's "now"
expression (`clock`)."""

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


# Queries that keep the real clock under a test clock: the migration ledger, and the test
# clock's own table (which they create and set).
_REAL_CLOCK_PREFIXES = ("migration_", "test_clock_")


def load_queries(package: str, placeholder: str, value: str, *,
                 clock: tuple[str, str] | None = None,
                 names: dict[str, str] | None = None) -> Queries:
    """The backend's named queries with its namespace filled in. `clock` = (the production
    "now" expression, its replacement) swaps every occurrence once, at load: a backend opened
    with a test clock reads the time from its test_clock row, and the production text is
    left exactly as written."""
    text = resources.files(package).joinpath("queries.sql").read_text("utf-8")
    queries = parse_named(text)
    if clock is not None:
        real, test = clock
        queries = {k: v if k.startswith(_REAL_CLOCK_PREFIXES) else v.replace(real, test)
                   for k, v in queries.items()}
    return Queries({k: _fill(v, {**(names or {}), placeholder: value})
                    for k, v in queries.items()})


def _fill(text: str, names: dict[str, str]) -> str:
    for placeholder, value in names.items():
        text = text.replace(placeholder, value)
    return text


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


def load_migrations(package: str, placeholder: str, value: str, *,
                    names: dict[str, str] | None = None) -> list[Migration]:
    folder = resources.files(package).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        m = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if m:
            sql = _fill(entry.read_text("utf-8"), {**(names or {}), placeholder: value})
            found.append(Migration(int(m.group(1)), m.group(2), tuple(split_statements(sql))))
    found.sort(key=lambda mig: mig.version)
    return found
