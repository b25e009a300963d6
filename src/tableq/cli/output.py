"""How the CLI shows things: rich tables for people, JSON lines (--json) for scripts. Pure
formatting: no database access.

Payloads, keys, topics, headers and error texts are data, never markup or terminal control:
the consoles parse no markup and no emoji codes (a payload holding `[/]` or `:smile:` prints as
itself), and `clean()` shows control characters (ESC sequences, other C0 and C1 controls,
bidirectional overrides) as visible escapes instead of sending them to the terminal."""

from __future__ import annotations

import json
import os
import re
import sys
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from tableq.message import DeadLetter, Message

# Off a terminal rich assumes 80 columns and truncates; scripts and logs get room instead.
_WIDTH = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "200"))
stdout = Console(highlight=False, soft_wrap=False, width=_WIDTH, markup=False, emoji=False)
stderr = Console(stderr=True, highlight=False, markup=False, emoji=False)

# C0 controls and DEL, C1 controls (U+0080-U+009F: 8-bit CSI and friends), the Unicode line
# and paragraph separators (which split a JSON line for str.splitlines), and the
# bidirectional overrides and isolates that reorder what a terminal shows.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\e"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def clean(text: object) -> str:
    """`text` safe to show on a terminal: control characters as visible escapes (\\e, \\n,
    \\x9b, \\u202e); everything else unchanged."""
    s = text if isinstance(text, str) else str(text)
    return _CONTROL.sub(_escape, s)


def one_line(text: object) -> str:
    """An error text for one line of a terminal: line breaks become spaces, then clean()."""
    s = text if isinstance(text, str) else str(text)
    return clean(" ".join(s.splitlines()) if "\n" in s or "\r" in s else s)


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


def _json_escape(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}"


def json_line(row: dict[str, Any]) -> str:
    """One JSON object on one line. json.dumps escapes C0 controls itself; C1 controls and
    bidi overrides are escaped too (\\u009b), so the line is safe on a terminal and decodes
    to the same values."""
    return _CONTROL.sub(_json_escape, json.dumps(row, ensure_ascii=False, default=str))


def json_text(rows: list[dict[str, Any]]) -> str:
    return "".join(json_line(row) + "\n" for row in rows)


def json_lines(rows: list[dict[str, Any]]) -> None:
    write(json_text(rows))


def write(text: str) -> None:
    """Writes to stdout and flushes, so a closed pipe fails here (before, say, an ack)."""
    sys.stdout.write(text)
    sys.stdout.flush()


def show(renderable: Any) -> None:
    """Prints a table or a line of (already clean) text, and flushes."""
    stdout.print(renderable)
    stdout.file.flush()


def short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(_payload(value), ensure_ascii=False,
                                                            default=str)
    text = clean(text)
    return text if len(text) <= width else text[: width - 1] + "…"


def messages_table(title: str, msgs: list[Message], *, leased: bool) -> Table:
    table = Table(title=clean(title), title_justify="left")
    for col in ("id", "key", "kind", "priority", "attempts", "available at", "payload"):
        table.add_column(col, justify="right" if col in ("id", "priority", "attempts") else "left")
    if leased:
        table.add_column("lease")
    for m in msgs:
        row = [str(m.id), clean(m.key or ""), clean(m.kind or ""), str(m.priority),
               str(m.attempts), _iso(m.available_at) or "", short(m.payload)]
        if leased:
            row.append(clean(m.lease or ""))
        table.add_row(*row)
    return table


def dead_table(title: str, rows: list[DeadLetter]) -> Table:
    table = Table(title=clean(title), title_justify="left")
    for col in ("id", "key", "attempts", "dead at", "error", "payload"):
        table.add_column(col, justify="right" if col in ("id", "attempts") else "left")
    for d in rows:
        error = (d.error or "").strip().splitlines()
        table.add_row(str(d.id), clean(d.key or ""), str(d.attempts), _iso(d.dead_at) or "",
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
