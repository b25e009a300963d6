"""U1's setup, run by the OLD tableq (the last version whose schema was v1 on every backend):
creates schema v1 and fills it with live, leased, dead and acked (retained) messages. The
leases it takes are written to a file for the test to settle after the upgrade.

argv: url n_live leases_json"""

from __future__ import annotations

import json
import sys

import tableq


def main(url: str, n_live: str, leases_path: str) -> None:
    q = tableq.connect(url, migrate=True, retention=True)
    assert q.backend.schema_version() == 1, "the old tableq should create schema v1"
    q.send_many("poison", [{"v": f"dead{i}"} for i in range(10)])
    for m in q.receive("poison", max=10):
        m.dead_letter("poison pill")
    q.send_many("finished", [{"v": f"done{i}"} for i in range(20)])
    q.ack_many(q.receive("finished", max=20))
    q.send_many("work", [{"v": f"held{i}"} for i in range(10)])
    held = q.receive("work", max=10, visibility_timeout=600)  # leases the test holds
    q.send_many("work", [{"v": f"old{i}"} for i in range(int(n_live))])
    with open(leases_path, "w") as f:
        json.dump([[m.id, m.lease, m.payload["v"]] for m in held], f)
    q.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
