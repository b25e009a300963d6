"""Pure checks on names users choose: topics, keys, kinds, header names, filters, SQL
identifiers. No I/O."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from tableq.errors import InvalidArgument, InvalidName

TOPIC_MAX_BYTES = 200
# What a wake-up listener answers when it knows that something changed but not where (SQLite's
# data_version): "" can never be a topic's name, so it cannot be mistaken for one.
ANY_TOPIC = ""
KEY_MAX_CHARS = 255
KIND_MAX_CHARS = 100
HEADER_NAME_MAX_CHARS = 100
HEADERS_MAX_BYTES = 16_384  # headers are a small map (trace ids, source), not a payload
# Matched with fullmatch: `$` would also accept a trailing newline ("tq\n"), which then reached
# the DDL as a prefix, or matched a filter field on PostgreSQL only.
IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,40}")
# A filter field is a top-level JSON key; the MySQL/SQLite path language must not see '$', '.',
# '*', quotes or brackets in it, so the grammar is deliberately narrow.
FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,63}")
# Filter numbers every database compares alike: whole numbers a 64-bit integer holds, finite
# floats.
FILTER_INT_MIN, FILTER_INT_MAX = -(2**63), 2**63 - 1


def _printable(what: str, value: object, max_chars: int | None, max_bytes: int | None) -> str:
    if not isinstance(value, str):
        raise InvalidName(what, value, "must be a string")
    if not value:
        raise InvalidName(what, value, "must not be empty")
    if max_chars is not None and len(value) > max_chars:
        raise InvalidName(what, value, f"must be at most {max_chars} characters")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidName(what, value, "must be valid Unicode (no lone surrogates)") from None
    if max_bytes is not None and size > max_bytes:
        raise InvalidName(what, value, f"must be at most {max_bytes} bytes in UTF-8")
    if not value.isprintable():
        raise InvalidName(what, value, "must contain only printable characters")
    if value != value.strip():
        raise InvalidName(what, value, "must not start or end with whitespace")
    return value


def check_topic(topic: object) -> str:
    return _printable("topic", topic, None, TOPIC_MAX_BYTES)


def check_key(key: object) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str):
        raise InvalidName("key", key, "must be a string or None")
    if not key:
        raise InvalidName("key", key, "must not be empty (use None for no key)")
    if len(key) > KEY_MAX_CHARS:
        raise InvalidName("key", key, f"must be at most {KEY_MAX_CHARS} characters")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidName("key", key, "must be valid Unicode (no lone surrogates)") from None
    if "\x00" in key:
        raise InvalidName("key", key, "must not contain NUL characters")
    return key


def check_kind(kind: object) -> str | None:
    if kind is None:
        return None
    return _printable("kind", kind, KIND_MAX_CHARS, None)


def check_headers(headers: object) -> dict[str, str] | None:
    if headers is None:
        return None
    if not isinstance(headers, Mapping):
        raise InvalidArgument(f"headers must be a dict of strings, not {type(headers).__name__}")
    out: dict[str, str] = {}
    for name, value in headers.items():
        _printable("header name", name, HEADER_NAME_MAX_CHARS, None)
        if not isinstance(value, str):
            raise InvalidArgument(
                f"header {name!r} must be a string, not {type(value).__name__}; "
                "convert numbers and ids with str()"
            )
        if "\x00" in value or not _encodable(value):
            raise InvalidArgument(f"header {name!r} must be valid Unicode without NUL")
        out[name] = value
    size = sum(len(k.encode("utf-8", "replace")) + len(v.encode("utf-8", "replace"))
               for k, v in out.items())
    if size > HEADERS_MAX_BYTES:
        raise InvalidArgument(f"headers are {size} bytes, over the limit of "
                              f"{HEADERS_MAX_BYTES}; put large data in the payload")
    return out or None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_identifier(what: str, value: object) -> str:
    if not isinstance(value, str) or not IDENTIFIER.fullmatch(value):
        raise InvalidName(what, value, "must be 1-41 characters of a-z, 0-9 and _, not "
                          "starting with a digit (nothing else, not even a trailing newline)")
    return value


def check_reason(error: object) -> None:
    """A dead letter's reason: refused when missing, as it is all that says why later."""
    if error is None or (isinstance(error, str) and not error.strip()):
        raise InvalidArgument(
            "dead_letter() needs the reason, which stays with the dead letter for whoever "
            "looks at it later: pass text such as str(exc); the message was not changed")


def check_where(where: object) -> dict[str, Any] | None:
    """A receive filter: {"kind": ..., "key": ..., "payload": {field: value}} or the short form
    {field: value, ...} for payload fields, plus optional "kind"/"key"."""
    if where is None:
        return None
    if not isinstance(where, Mapping):
        raise InvalidArgument("where must be a dict such as {'kind': 'email'} or {'user': 7}")
    kind = key = None
    fields: dict[str, Any] = {}
    for name, value in where.items():
        if name in ("kind", "key") and value is None:
            # None is how a message says it has no kind or key, but as a filter it would
            # select nothing in particular: every message would match, which is surely not
            # what was meant.
            raise InvalidArgument(
                f"where[{name!r}] is None, which would match every message: give the {name} "
                f"to select (a string), or leave {name!r} out of where")
        if name == "kind":
            kind = check_kind(value)
        elif name == "key":
            key = check_key(value)
        elif name == "payload":
            if not isinstance(value, Mapping):
                raise InvalidArgument("where['payload'] must be a dict of field: value")
            for f, v in value.items():
                _add_field(fields, _check_field(f), v)
        else:
            _add_field(fields, _check_field(name), value)
    return {"kind": kind, "key": key, "fields": fields}


def _add_field(fields: dict[str, Any], name: str, value: object) -> None:
    checked = _check_value(name, value)
    if name in fields and (type(fields[name]), fields[name]) != (type(checked), checked):
        # {"n": 1, "payload": {"n": 2}}: one of the two would be dropped without a word
        raise InvalidArgument(f"where gives the field {name!r} twice, as {fields[name]!r} and "
                              f"{checked!r}; give it once")
    fields[name] = checked


def _check_field(name: object) -> str:
    if not isinstance(name, str) or not FIELD.fullmatch(name):
        raise InvalidName(
            "filter field", name, "must be a top-level JSON key of letters, digits, _ or -"
        )
    return name


def _check_value(name: str, value: object) -> object:
    """One rule for every database: a value a database would refuse (NaN, a lone surrogate)
    or compare differently (an integer beyond 64 bits) is refused here, before any SQL."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not FILTER_INT_MIN <= value <= FILTER_INT_MAX:
            raise InvalidArgument(f"filter value for {name!r} must be a whole number within "
                                  "64 bits (-2**63 .. 2**63-1); compare larger numbers as "
                                  "strings in the payload")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgument(f"filter value for {name!r} must be a finite number, not "
                                  f"{value!r}: JSON payloads hold no NaN or infinity")
        return value
    if isinstance(value, str):
        if "\x00" in value or not _encodable(value):
            raise InvalidArgument(f"filter value for {name!r} must be valid Unicode without NUL "
                                  "(no lone surrogates): payloads cannot hold such strings")
        return value
    raise InvalidArgument(
        f"filter value for {name!r} must be a string, number, boolean or None, "
        f"not {type(value).__name__}"
    )
