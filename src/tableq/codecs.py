"""Payload encoding and the registry of kinds (validated payload types). Pure: no I/O.

A payload is stored either as JSON text (the default, queryable in SQL) or as raw bytes.
A registered kind validates the payload on send (encode) and on receive (decode). A kind
registered with a model class also names the payloads of that class: sending an instance
without kind= sends it as that kind."""

from __future__ import annotations

import itertools
import json
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from tableq.errors import InvalidArgument, PayloadInvalid, PayloadTooLarge, UnknownKind
from tableq.names import check_kind

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024


class Encoded(NamedTuple):
    """A payload ready for the database: exactly one of json_text / data is set."""

    json_text: str | None
    data: bytes | None


@dataclass(frozen=True, slots=True)
class Codec:
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


def _is_model(value: object) -> bool:
    """A pydantic v2 model or msgspec Struct class (duck-typed, as codec_for_model takes)."""
    return isinstance(value, type) and (hasattr(value, "__struct_fields__")
                                        or hasattr(value, "model_validate"))


def codec_for_model(model: Any) -> Codec:
    """A codec from a pydantic v2 model class (model_validate / model_dump) or a msgspec
    Struct class (msgspec.convert / to_builtins), both duck-typed."""
    if hasattr(model, "__struct_fields__"):
        import msgspec  # only reached when the user passes a msgspec Struct

        def encode_struct(value: Any) -> Any:
            obj = value if isinstance(value, model) else msgspec.convert(value, model)
            return msgspec.to_builtins(obj)

        return Codec(encode=encode_struct, decode=lambda v: msgspec.convert(v, model))
    if not hasattr(model, "model_validate"):
        raise InvalidArgument(f"model= takes a pydantic model class (with model_validate) or a "
                              f"msgspec Struct class, not {model!r}; for other validators pass "
                              "encode= and decode= functions")

    def encode(value: Any) -> Any:
        obj = value if isinstance(value, model) else model.model_validate(value)
        return obj.model_dump(mode="json")

    return Codec(encode=encode, decode=model.model_validate)


class KindRegistry:
    """Kinds known to one Queue. With strict=True (the default) unregistered kinds are refused
    on send; with strict=False they pass unvalidated."""

    def __init__(self, *, strict: bool = True) -> None:
        self._codecs: dict[str, Codec] = {}
        self._model_kinds: dict[type, str] = {}  # model class -> the kind it was registered as
        self.strict = strict

    def register(
        self,
        kind: str | type[Any],
        encode: Callable[[Any], Any] | None = None,
        decode: Callable[[Any], Any] | None = None,
        *,
        model: type[Any] | None = None,
    ) -> str:
        """Registers a kind and returns its name. `register(Email)` is
        `register("Email", model=Email)`: the kind is named after the model class."""
        if isinstance(kind, type):
            if not _is_model(kind):
                raise InvalidArgument(
                    f"register_kind takes a kind name, or a pydantic model class or msgspec "
                    f"Struct class alone, not the class {kind.__name__}; for other "
                    "validators pass a name with encode= and decode= functions")
            if model is not None or encode is not None or decode is not None:
                raise InvalidArgument(
                    f"register_kind({kind.__name__}) takes the model alone; to give the kind "
                    f"another name, call register_kind('name', model={kind.__name__})")
            model = kind
            kind = kind.__name__
        check_kind(kind)
        for name, fn in (("encode", encode), ("decode", decode)):
            if fn is not None and not callable(fn):
                raise InvalidArgument(f"register_kind({kind!r}): {name}= must be a function "
                                      f"taking the payload, not {type(fn).__name__}")
        if model is not None and (encode is not None or decode is not None):
            raise InvalidArgument(f"register_kind({kind!r}): pass model= or encode=/decode=, "
                                  "not both")
        if model is not None:
            codec = codec_for_model(model)
        else:
            identity: Callable[[Any], Any] = lambda v: v
            codec = Codec(encode or identity, decode or identity)
        # A kind registered again forgets the model it was registered with before.
        self._model_kinds = {m: k for m, k in self._model_kinds.items() if k != kind}
        self._codecs[kind] = codec
        if model is not None:
            self._model_kinds[model] = kind
        return kind

    def kind_of(self, payload: object) -> str | None:
        """The kind whose model `payload` is an instance of (the most derived registered
        class), or None."""
        if not self._model_kinds:
            return None
        for cls in type(payload).__mro__:
            kind = self._model_kinds.get(cls)
            if kind is not None:
                return kind
        return None

    def names(self) -> list[str]:
        return list(self._codecs)

    def check_known(self, kind: str) -> None:
        if self.strict and kind not in self._codecs:
            raise UnknownKind(kind, self.names())

    def encode(self, kind: str | None, payload: Any, limit: int) -> Encoded:
        if kind is not None:
            codec = self._codecs.get(kind)
            if codec is None and self.strict:
                raise UnknownKind(kind, self.names())
            if codec is not None:
                if isinstance(payload, (JsonText, EncodedJson)):  # kinds check values
                    payload = json.loads(payload)
                try:
                    payload = codec.encode(payload)
                except Exception as exc:  # a user's validator may raise anything
                    raise PayloadInvalid(f"{type(exc).__name__}: {exc}", kind) from exc
        return encode_payload(payload, limit, kind)

    def encode_many(self, kind: str | None, payloads: list[Any],
                    limit: int) -> list[tuple[str | None, bytes | None]]:
        """encode() for a batch of payloads of one kind, in one tight loop when the kind has
        no codec (what bulk loads send)."""
        if kind is not None:
            self.check_known(kind)
            if kind in self._codecs:
                return [self.encode(kind, p, limit) for p in payloads]
        return encode_payloads(payloads, limit, kind)

    def decode(self, kind: str | None, payload: Any) -> Any:
        """Raises PayloadInvalid when a registered kind's decoder rejects the payload."""
        codec = self._codecs.get(kind) if kind is not None else None
        if codec is None:
            return payload
        try:
            return codec.decode(payload)
        except Exception as exc:
            raise PayloadInvalid(f"{type(exc).__name__}: {exc}", kind) from exc


_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _one_shot_encoder() -> Callable[[Any], str]:
    """_JSON.encode without its per-call set-up: json.dumps builds a new C encoder for every
    value, which was most of a bulk load's Python time. The same C encoder, made once (no
    circular-reference markers: a cycle ends in RecursionError instead of ValueError)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator (e.g. PyPy): the plain path
        return _JSON.encode
    try:
        c_encode = make(None, _JSON.default, json.encoder.encode_basestring, None, ":", ",",
                        False, False, False)
    except TypeError:  # a Python whose C encoder takes other arguments
        return _JSON.encode
    join = "".join

    def encode(value: Any) -> str:
        if isinstance(value, str):
            return json.encoder.encode_basestring(value)
        return join(c_encode(value, 0))
    return encode


_encode_json = _one_shot_encoder()


class JsonText(str):
    """A payload that is already JSON text (from Spark's to_json, another service, a file):
    stored as it is after a syntax check, instead of being parsed and encoded again.
    q.send("t", JsonText('{"id": 1}')) delivers the payload {"id": 1}."""

    __slots__ = ()


class EncodedJson(str):
    """JSON text made by tableq's own encoders (the Spark sink's column-wise encoder, tested
    against the general path): valid by construction, so only its size and NUL are checked.
    Not for text from outside; that is JsonText, which is parsed once."""

    __slots__ = ()


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:40]} is beyond the range of a double, so it would "
                         "come back as infinity")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are all different: with a key twice, PostgreSQL keeps the last
    value and filters on it, MariaDB and SQLite keep both and filter on the first, and
    Python reads the last, so a filtered receive could deliver what its filter excluded."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        twice = next(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
        raise ValueError(f"the key {twice[:40]!r} appears twice in one object; keep one")
    return obj


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
_STRICT_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float,
                                   object_pairs_hook=_unique_keys)
# Cheap screens before the slower exact checks: a number that may overflow a double (an
# exponent of 3 or more digits, or 300 digits in a row), an escaped surrogate (\udXXX).
_MAYBE_HUGE = re.compile(r"[eE][+]?0*[1-9][0-9]{2}|[0-9]{300}")
_MAYBE_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
# A real \u0000 escape: the backslash before u0000 is itself unescaped, i.e. an odd run of
# backslashes ("\\u0000" is a backslash followed by the text u0000, which is fine).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _has_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return not value.isascii() and any("\ud800" <= c <= "\udfff" for c in value)
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    return False


def _checked_json_text(text: str, kind: str | None) -> str:
    """The text itself when it is one JSON value (surrounding whitespace allowed) that every
    database stores and gives back alike: no number beyond a double's range (one database
    would keep it, Python reads it back as infinity) and no lone surrogate escape (PostgreSQL
    refuses it, the others store it)."""
    try:
        strict = bool(_MAYBE_HUGE.search(text) or _MAYBE_SURROGATE.search(text))
        decoder = _STRICT_DECODER if strict else _DECODER
        try:
            value, end = decoder.raw_decode(text)  # the C scanner, without json.loads' wrapping
        except ValueError:
            # leading whitespace is fine; any other error is reported
            value, end = decoder.decode(text), len(text)
        if end != len(text) and not text[end:].isspace():
            raise ValueError(f"extra data after the JSON value at character {end}")
        if strict and _has_surrogate(value):
            raise ValueError("a \\u escape makes a lone surrogate, which is not Unicode text")
    except (ValueError, RecursionError) as exc:
        raise PayloadInvalid(f"not JSON text ({exc}): {text[:80]!r}", kind) from None
    return str(text)


def encode_payload(payload: Any, limit: int, kind: str | None = None) -> Encoded:
    if type(payload) is JsonText:
        return _sized(_checked_json_text(payload, kind), limit, kind)
    if type(payload) is EncodedJson:
        return _sized(str(payload), limit, kind)
    if isinstance(payload, (bytes, bytearray, memoryview)):
        data = bytes(payload)
        if len(data) > limit:
            raise PayloadTooLarge(len(data), limit)
        return Encoded(None, data)
    try:
        text = _encode_json(payload)
    except (TypeError, ValueError, RecursionError) as exc:
        if _is_model(type(payload)):
            raise PayloadInvalid(
                f"{type(payload).__name__} is a model class no kind was registered with; call "
                f"queue.register_kind({type(payload).__name__}) once, then send its instances",
                kind) from None
        raise PayloadInvalid(
            f"{exc}; send JSON-serialisable values (dict, list, str, int, float, bool, None) "
            "or bytes, or register a kind whose encoder converts it",
            kind,
        ) from None
    return _sized(text, limit, kind)


def encode_payloads(payloads: list[Any], limit: int,
                    kind: str | None = None) -> list[tuple[str | None, bytes | None]]:
    """encode_payload for many payloads: the same results and errors, with the common cases
    (dicts, lists, JsonText and EncodedJson of ASCII within the limit) handled inline."""
    out: list[tuple[str | None, bytes | None]] = []
    append = out.append
    for p in payloads:
        t = type(p)
        try:
            if t is dict or t is list:
                text = _encode_json(p)
            elif t is EncodedJson:
                text = str(p)
            elif t is JsonText:
                text = _checked_json_text(p, kind)  # raises PayloadInvalid itself
            else:
                append(encode_payload(p, limit, kind))
                continue
        except (TypeError, ValueError, RecursionError):
            append(encode_payload(p, limit, kind))  # raises the precise error, or accepts
            continue
        if len(text) <= limit and text.isascii() and "\\u0000" not in text:
            append((text, None))
        else:
            append(_sized(text, limit, kind))
    return out


def encode_texts(texts: list[str], limit: int) -> list[tuple[str | None, bytes | None]]:
    """encode_payloads for JSON texts made by tableq's own encoders (what EncodedJson marks
    one by one): the same results and errors, checked in one pass over the whole batch when
    it is ASCII, within the limit and free of NUL (a bulk load's common case), else text by
    text."""
    block = "".join(texts)
    if (block.isascii() and "\\u0000" not in block
            and (not texts or max(map(len, texts)) <= limit)):
        return list(zip(texts, itertools.repeat(None)))
    return [_sized(t, limit, None) for t in texts]


def _sized(text: str, limit: int, kind: str | None) -> Encoded:
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        # PostgreSQL jsonb cannot store NUL; refuse it everywhere so backends agree.
        raise PayloadInvalid("JSON strings must not contain NUL (\\u0000); send bytes", kind)
    if text.isascii():  # the common case: its UTF-8 size is its length
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise PayloadInvalid("strings must be valid Unicode (no lone surrogates)",
                                 kind) from None
    if size > limit:
        raise PayloadTooLarge(size, limit)
    return Encoded(text, None)
