"""How long a PostgreSQL or MariaDB connection waits on a server that stopped answering
without a word (a network cut, a host that vanished, a failover that left the old address
silent) before it is given up, so that the worker's outage handling reconnects instead of a
call waiting on its socket for hours (libpq and PyMySQL turn keepalive on with the operating
system's timing, which on Linux starts probing after two hours). TCP keepalive probes an
idle connection, a statement waiting for its reply included (a long statement is not cut:
the server's kernel answers the probes while it runs), and TCP_USER_TIMEOUT bounds data sent
and never acknowledged."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

PROBES = 3
DEFAULT_S = 60.0
MIN_S = 3  # one second each for the idle wait's first probe and the probes between
MAX_S = 32_767  # Linux's limit for TCP_KEEPIDLE


@dataclass(frozen=True, slots=True)
class KeepAlive:
    """Probe after `idle_s` of silence, then every `interval_s`, `PROBES` times."""

    idle_s: int
    interval_s: int
    timeout_ms: int

    @classmethod
    def within(cls, timeout_s: float) -> KeepAlive | None:
        """Gives up on a silent server after about `timeout_s`; 0 leaves it to the OS."""
        if not timeout_s:
            return None
        interval = max(1, round(timeout_s / (2 * PROBES)))
        return cls(max(1, round(timeout_s) - PROBES * interval), interval,
                   round(timeout_s * 1000))

    def libpq(self) -> dict[str, Any]:
        """As libpq's connection parameters."""
        return {"keepalives": 1, "keepalives_idle": self.idle_s,
                "keepalives_interval": self.interval_s, "keepalives_count": PROBES,
                "tcp_user_timeout": self.timeout_ms}

    def apply(self, sock: socket.socket) -> None:
        """On a connected socket (PyMySQL has no keepalive settings of its own)."""
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", self.idle_s), ("TCP_KEEPINTVL", self.interval_s),
                            ("TCP_KEEPCNT", PROBES), ("TCP_USER_TIMEOUT", self.timeout_ms)):
            option = getattr(socket, name, None)  # Linux's names; others keep OS defaults
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
