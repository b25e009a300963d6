"""Stored access tokens of the HTTP server and its idempotency records, as frozen values.
No I/O and no policy: what a role may do, and how secrets are made and checked, belong to
tableq.server.auth."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """One access token as stored: never its secret, only the SHA-256 of it. `topics` are
    exact topic names or globs ('orders.*'). `access_key` and `sqs_secret` are the token's
    AWS-style key pair for the SQS endpoint, when it has one. `checked_at` is the database
    clock when the record was read, so expiry is judged by database time."""

    id: str
    secret_sha256: str = field(repr=False)
    role: str
    topics: tuple[str, ...]
    name: str | None
    access_key: str | None
    sqs_secret: str | None = field(repr=False)
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    checked_at: datetime

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= self.checked_at

    @property
    def active(self) -> bool:
        return self.revoked_at is None and not self.expired


@dataclass(frozen=True, slots=True)
class NewToken:
    """A token to store: the hash of its secret, never the secret."""

    id: str
    secret_sha256: str = field(repr=False)
    role: str
    topics: tuple[str, ...]
    name: str | None = None
    access_key: str | None = None
    sqs_secret: str | None = field(default=None, repr=False)
    expires_in_s: float | None = None


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    """The first response to a request made with an Idempotency-Key."""

    fingerprint: str
    status: int
    response: str | None
