"""F12: a silent network cut. The server stops answering without a reset (packets dropped,
as behind a failed switch or a host that vanished), while a call waits for its reply. A
connection with tcp_keepalive_s gives up within seconds with DatabaseUnavailable, the
outage the worker reconnects from; one left to the operating system's keepalive (libpq's
and PyMySQL's default, two hours on Linux) is still waiting then. When the network is back
the queue works again and no message is lost or left leased.

The cut is made in a network namespace of the test's own (`unshare -n`, as root): the
throwaway server and the clients share its loopback, which the scenario takes down and up
(tests/faults/_silent_cut.py). The shared servers are not involved."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
KEEPALIVE_S = 6


def _can_cut() -> str | None:
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs Linux and root for a network namespace of its own"
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            return f"needs {tool} (util-linux, iproute2)"
    return None


@pytest.mark.parametrize("dialect", ["postgres", "mysql"])
def test_f12_a_silent_cut_is_an_outage_within_tcp_keepalive_s(dialect: str) -> None:
    why = _can_cut()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HERE), str(HERE.parent.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(["unshare", "-n", sys.executable, str(HERE / "_silent_cut.py"),
                           dialect], capture_output=True, text=True, timeout=300, env=env,
                          cwd=HERE)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"F12 {dialect}: {result}")
    assert result["waiting_before_cut"] == []  # both acks were waiting for their reply
    status, took_s = result["outcome"]["watched"]
    assert status == "DatabaseUnavailable", result
    assert KEEPALIVE_S - 1 <= took_s <= KEEPALIVE_S * 3, result
    assert result["plain_waiting_at_that_time"], result  # the cut was silent
    assert result["outcome"]["plain"][0] == "acked", result  # and it healed
    assert result["left"] == {"ready": 0, "in_flight": 0}, result
