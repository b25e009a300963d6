"""The thin HTTP server: the native JSON API under /v1, an SQS-compatible endpoint under /sqs,
scoped access tokens, the dashboard and Prometheus metrics, all on the public Queue API.
`create_app` is imported lazily so that tableq.server.auth (used by the CLI to make tokens)
needs none of the web framework."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tableq.queue import Queue


def create_app(queue: Queue, **options: Any) -> Any:
    """The ASGI application serving `queue`; see tableq.server.app.create_app."""
    from tableq.server.app import create_app as build

    return build(queue, **options)


__all__ = ["create_app"]
