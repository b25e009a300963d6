"""One Queue per (process, URL), opened lazily where it is used. Spark forks and reuses Python
workers and pickles data-source objects, so nothing here may travel inside a pickled object or
survive a fork: the cache is keyed by pid."""

from __future__ import annotations

import os
import threading

from tableq.bulk import Bulk
from tableq.connect import connect
from tableq.queue import Queue

_LOCK = threading.Lock()
_QUEUES: dict[tuple[int, str, bool], Queue] = {}


def queue_for(url: str, *, retention: bool = False) -> Queue:
    key = (os.getpid(), url, retention)
    with _LOCK:
        q = _QUEUES.get(key)
        if q is None:
            q = connect(url, retention=retention)
            _QUEUES[key] = q
        return q


def bulk_for(url: str, *, retention: bool = False) -> Bulk:
    """The bulk plumbing (tableq.bulk) on queue_for(url)."""
    return Bulk(queue_for(url, retention=retention))


def ensure_kinds(q: Bulk, kinds: set[str]) -> None:
    """The sink passes payloads through unchanged, so any kind is accepted as-is (a worker
    has no user codecs); Queue refuses kinds it has not seen registered."""
    q.accept_kinds(kinds)
