"""The HTTP server's own tables, reached through the queue's backend: access tokens (used by
the server and by `tableq token`) and idempotency records. Internal: not part of the public
Queue API. Needs none of the web framework, so the CLI imports it freely."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from tableq.errors import InvalidArgument
from tableq.queue import Queue, backend_of, seconds
from tableq.tokens import IdempotencyRecord, NewToken, TokenRecord
from tableq.transaction import Transaction


class Store:
    """Tokens and idempotency records in the database of `queue`."""

    __slots__ = ("_queue",)

    def __init__(self, queue: Queue) -> None:
        self._queue = queue

    def save_token(self, token: NewToken) -> None:
        """Stores an access token of the HTTP server (its secret's hash, never the secret)."""
        backend_of(self._queue).token_insert(token)

    def find_token(self, *, secret_sha256: str | None = None,
                   access_key: str | None = None) -> TokenRecord | None:
        """The stored token with this secret hash or SQS access key, or None. Revoked and
        expired tokens are returned too: the caller decides (TokenRecord.active)."""
        if (secret_sha256 is None) == (access_key is None):
            raise InvalidArgument("find_token takes exactly one of secret_sha256= or access_key=")
        return backend_of(self._queue).token_find(secret_sha256=secret_sha256,
                                                  access_key=access_key)

    def list_tokens(self) -> list[TokenRecord]:
        return backend_of(self._queue).token_list()

    def revoke_token(self, token_id: str) -> bool:
        """Revokes the token at once (its next request is refused). False when no active
        token has this id."""
        return backend_of(self._queue).token_revoke(token_id)

    @contextmanager
    def idempotent(self, scope: str, key: str, fingerprint: str) -> Iterator[Idempotent]:
        """One transaction that records the outcome of a request made with an idempotency
        key: inside it, `call.earlier` is the record a previous request with this key left
        (then do nothing), or None, and then do the work on `call.tx` and `call.finish(status,
        response)`. The work and its record commit together, so a retry either finds the
        record or does the work itself; a concurrent retry waits for the first to end."""
        with self._queue.transaction() as tx:
            earlier = backend_of(self._queue).idempotency_claim(scope, key, fingerprint,
                                                                tx.connection)
            yield Idempotent(self._queue, tx, scope, key, earlier)

    def expire_idempotency(self, older_than: float | timedelta = 86400.0) -> int:
        """Forgets idempotency records older than `older_than` seconds. Returns how many."""
        return backend_of(self._queue).idempotency_expire(
            seconds("older_than", older_than, 86400.0))


class Idempotent:
    """Handed out by Store.idempotent(): the open transaction and what an earlier request
    with the same key recorded, if any."""

    def __init__(self, queue: Queue, tx: Transaction, scope: str, key: str,
                 earlier: IdempotencyRecord | None) -> None:
        self.tx, self.earlier = tx, earlier
        self._queue, self._scope, self._key = queue, scope, key

    def finish(self, status: int, response: str) -> None:
        if self.earlier is not None:
            raise InvalidArgument("this idempotency key was used before; return its record")
        backend_of(self._queue).idempotency_finish(self._scope, self._key, status, response,
                                                   self.tx.connection)
