"""The throwaway servers themselves: they crash, come back with their committed data, and a
Queue pointed at them reconnects by itself."""

from __future__ import annotations

import uuid

import pytest

import tableq

pytestmark = pytest.mark.slow


def test_crash_and_restart_keeps_committed_messages(server):
    url = server.url("tq_" + uuid.uuid4().hex[:8])
    q = tableq.connect(url, migrate=True)
    try:
        q.send_many("t", [{"n": i} for i in range(50)])
        server.crash()
        with pytest.raises(tableq.DatabaseUnavailable):
            q.stats("t")
        server.restart()
        assert q.stats("t")[0].ready == 50  # committed before the crash, and a new connection
    finally:
        q.close()
