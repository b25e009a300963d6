"""Who may do what: access-token secrets (made, hashed, checked), roles, topic scopes, the
CSRF token of a dashboard session. Pure functions and frozen values: no I/O, no web framework,
so the CLI can make tokens without the server's dependencies."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field
from functools import lru_cache

from tableq.errors import InvalidArgument
from tableq.names import check_topic
from tableq.queue import seconds
from tableq.tokens import NewToken, TokenRecord

SECRET_PREFIX = "tq_"
SECRET_BYTES = 32  # 256 bits
ROLES = ("producer", "consumer", "reader", "admin")

# What each role may do on the topics in its scope. "consume" covers receive and settling
# (ack, nack, heartbeat, release, dead-letter) of messages whose row is on such a topic.
ROLE_ACTIONS: dict[str, frozenset[str]] = {
    "producer": frozenset({"send", "stats"}),
    "consumer": frozenset({"consume", "view", "stats"}),
    "reader": frozenset({"view", "stats"}),
    "admin": frozenset({"send", "consume", "view", "stats", "manage"}),
}
# Actions not tied to one topic.
GLOBAL_ACTIONS: dict[str, frozenset[str]] = {
    "producer": frozenset(),
    "consumer": frozenset(),
    "reader": frozenset({"metrics"}),
    "admin": frozenset({"metrics"}),
}
SCOPE_MAX = 100
ACCESS_KEY_PREFIX = "TQ"


@dataclass(frozen=True, slots=True)
class Principal:
    """The token a request was made with, once checked: its id, role and topic scopes."""

    token_id: str
    role: str
    topics: tuple[str, ...]
    name: str | None = None

    def may(self, action: str, topic: str | None = None) -> bool:
        """True when this token may do `action` on `topic` (or globally, without a topic)."""
        if topic is None:
            return action in GLOBAL_ACTIONS.get(self.role, frozenset())
        return action in ROLE_ACTIONS.get(self.role, frozenset()) and in_scope(self.topics,
                                                                               topic)

    def sees(self, topic: str) -> bool:
        """True when the topic is in this token's scope (whatever the role)."""
        return in_scope(self.topics, topic)

    @classmethod
    def of(cls, record: TokenRecord) -> Principal:
        return cls(record.id, record.role, record.topics, record.name)


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def secret_hash(secret: str) -> str:
    """What is stored for a secret: its SHA-256, hex. A random 256-bit secret needs no salt
    or slow hash: nobody can search its space."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def secret_matches(secret: str, record: TokenRecord) -> bool:
    """Constant-time comparison of a presented secret with the stored hash."""
    return hmac.compare_digest(secret_hash(secret), record.secret_sha256)


def looks_like_secret(value: str) -> bool:
    return value.startswith(SECRET_PREFIX) and 20 <= len(value) <= 200 and value.isascii()


def new_key_pair() -> tuple[str, str]:
    """An AWS-style access key id (public, 20 characters) and secret access key."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
    key_id = ACCESS_KEY_PREFIX + "".join(secrets.choice(alphabet) for _ in range(18))
    return key_id, secrets.token_urlsafe(SECRET_BYTES)


def check_role(role: str) -> str:
    if role not in ROLES:
        raise InvalidArgument(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    return role


def check_scopes(topics: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Topic scopes: exact topic names or globs where '*' matches any run of characters."""
    if not topics:
        raise InvalidArgument("a token needs at least one topic scope, e.g. --topics 'orders.*' "
                              "or --topics '*' for every topic")
    if len(topics) > SCOPE_MAX:
        raise InvalidArgument(f"a token takes at most {SCOPE_MAX} topic scopes")
    return tuple(dict.fromkeys(check_topic(t) for t in topics))


@lru_cache(maxsize=4096)
def _pattern(scope: str) -> re.Pattern[str]:
    return re.compile("".join(".*" if part == "*" else re.escape(part)
                              for part in re.split(r"(\*)", scope)), re.DOTALL)


def scope_matches(scope: str, topic: str) -> bool:
    """'orders.*' matches 'orders.eu'; a scope without '*' matches only itself."""
    if "*" not in scope:
        return scope == topic
    return _pattern(scope).fullmatch(topic) is not None


def in_scope(scopes: tuple[str, ...], topic: str) -> bool:
    return any(scope_matches(s, topic) for s in scopes)


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """What `tableq token create` shows once: the secret and, with --sqs, the key pair."""

    record: NewToken
    secret: str = field(repr=False)
    sqs_secret: str | None = field(repr=False)


def issue(role: str, topics: list[str] | tuple[str, ...], *, name: str | None = None,
          expires_in_s: float | None = None, sqs: bool = False) -> IssuedToken:
    """A new token, ready to store (only the secret's hash is in `record`)."""
    if expires_in_s is not None and not seconds("a token's expiry", expires_in_s, 0.0) > 0:
        raise InvalidArgument(f"a token's expiry must be > 0 seconds, not {expires_in_s!r}")
    if name is not None and (not name.isprintable() or not 1 <= len(name) <= 200):
        raise InvalidArgument("a token name must be 1-200 printable characters")
    secret = new_secret()
    access_key = sqs_secret = None
    if sqs:
        access_key, sqs_secret = new_key_pair()
    record = NewToken(id="tqt_" + secrets.token_hex(8), secret_sha256=secret_hash(secret),
                      role=check_role(role), topics=check_scopes(topics), name=name,
                      access_key=access_key, sqs_secret=sqs_secret, expires_in_s=expires_in_s)
    return IssuedToken(record, secret, sqs_secret)


def csrf_token(secret: str) -> str:
    """The dashboard session's synchronizer token: derived from the session's secret, so
    another site, which cannot read the HttpOnly cookie, cannot compute it."""
    digest = hmac.new(secret.encode("utf-8"), b"tableq-dashboard-csrf", hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def csrf_matches(secret: str, presented: str) -> bool:
    return hmac.compare_digest(csrf_token(secret).encode(), presented.encode("utf-8", "replace"))
