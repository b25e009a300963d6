"""How the CLI shows things: rich tables for people, JSON lines (--json) for scripts. Pure
formatting: no database access."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from tableq.message import DeadLetter, Message

# Off a terminal rich assumes 80 columns and truncates; scripts and logs get room instead.
_WIDTH = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "200"))
stdout = Console(highlight=False, soft_wrap=False, width=_WIDTH)
stderr = Console(stderr=True, highlight=False)


def _iso(t: datetime | None) -> str | None:
    return t.isoformat(timespec="milliseconds") if t is not None else None


def _payload(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$bytes_hex": value.hex()}
    return value


def message_dict(m: Message) -> dict[str, Any]:
    return {
        "id": m.id, "topic": m.topic, "key": m.key, "kind": m.kind,
        "payload": _payload(m.payload), "headers": m.headers, "priority": m.priority,
        "attempts": m.attempts, "created_at": _iso(m.created_at),
        "available_at": _iso(m.available_at), "lease": m.lease, "last_error": m.last_error,
    }


def dead_dict(d: DeadLetter) -> dict[str, Any]:
    return {
        "id": d.id, "topic": d.topic, "key": d.key, "kind": d.kind,
        "payload": _payload(d.payload), "headers": d.headers, "priority": d.priority,
        "attempts": d.attempts, "created_at": _iso(d.created_at), "dead_at": _iso(d.dead_at),
        "error": d.error,
    }


def json_lines(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        print(json.dumps(row, ensure_ascii=False, default=str))


def short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(_payload(value), ensure_ascii=False,
                                                            default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def messages_table(title: str, msgs: list[Message], *, leased: bool) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("id", "key", "kind", "priority", "attempts", "available at", "payload"):
        table.add_column(col, justify="right" if col in ("id", "priority", "attempts") else "left")
    if leased:
        table.add_column("lease")
    for m in msgs:
        row = [str(m.id), m.key or "", m.kind or "", str(m.priority), str(m.attempts),
               _iso(m.available_at) or "", short(m.payload)]
        if leased:
            row.append(m.lease or "")
        table.add_row(*row)
    return table


def dead_table(title: str, rows: list[DeadLetter]) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("id", "key", "attempts", "dead at", "error", "payload"):
        table.add_column(col, justify="right" if col in ("id", "attempts") else "left")
    for d in rows:
        error = (d.error or "").strip().splitlines()
        table.add_row(str(d.id), d.key or "", str(d.attempts), _iso(d.dead_at) or "",
                      short(error[-1] if error else "", 50), short(d.payload, 40))
    return table


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = float(seconds)
    if s < 1:
        return f"{s * 1000:.0f}ms"
    if s < 120:
        return f"{s:.1f}s"
    if s < 7200:
        return f"{s / 60:.1f}m"
    if s < 172800:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"
