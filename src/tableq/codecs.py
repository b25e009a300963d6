"""Payload encoding and the registry of kinds (validated payload types). Pure: no I/O.

A payload is stored either as JSON text (the default, queryable in SQL) or as raw bytes.
A registered kind validates the payload on send (encode) and on receive (decode)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from tableq.errors import PayloadInvalid, PayloadTooLarge, UnknownKind
from tableq.names import check_kind

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024


class Encoded(NamedTuple):
    """A payload ready for the database: exactly one of json_text / data is set."""

    json_text: str | None
    data: bytes | None

    @property
    def size(self) -> int:
        return len(self.data) if self.data is not None else len(self.json_text or "")


@dataclass(frozen=True, slots=True)
class Codec:
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


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
        raise TypeError(f"{model!r} is neither a pydantic model class (model_validate) nor a "
                        "msgspec Struct class")

    def encode(value: Any) -> Any:
        obj = value if isinstance(value, model) else model.model_validate(value)
        return obj.model_dump(mode="json")

    return Codec(encode=encode, decode=model.model_validate)


class KindRegistry:
    """Kinds known to one Queue. With strict=True (the default) unregistered kinds are refused
    on send; with strict=False they pass unvalidated."""

    def __init__(self, *, strict: bool = True) -> None:
        self._codecs: dict[str, Codec] = {}
        self.strict = strict

    def register(
        self,
        kind: str,
        encode: Callable[[Any], Any] | None = None,
        decode: Callable[[Any], Any] | None = None,
        *,
        model: Any = None,
    ) -> None:
        check_kind(kind)
        if model is not None:
            self._codecs[kind] = codec_for_model(model)
        else:
            identity: Callable[[Any], Any] = lambda v: v
            self._codecs[kind] = Codec(encode or identity, decode or identity)

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
                try:
                    payload = codec.encode(payload)
                except Exception as exc:  # a user's validator may raise anything
                    raise PayloadInvalid(f"{type(exc).__name__}: {exc}", kind) from exc
        return encode_payload(payload, limit, kind)

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


def encode_payload(payload: Any, limit: int, kind: str | None = None) -> Encoded:
    if isinstance(payload, (bytes, bytearray, memoryview)):
        data = bytes(payload)
        if len(data) > limit:
            raise PayloadTooLarge(len(data), limit)
        return Encoded(None, data)
    try:
        text = _encode_json(payload)
    except (TypeError, ValueError, RecursionError) as exc:
        raise PayloadInvalid(
            f"{exc}; send JSON-serialisable values (dict, list, str, int, float, bool, None) "
            "or bytes, or register a kind whose encoder converts it",
            kind,
        ) from None
    if "\\u0000" in text:
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
