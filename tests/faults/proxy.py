"""A small asyncio TCP fault proxy for PostgreSQL and MariaDB (toxiproxy is not to be had
here), run on its own thread in front of a throwaway server. Toxics:

- latency: every chunk waits `latency_s` before it is forwarded;
- stall: stop forwarding in both directions, keeping the sockets (until unstall);
- reset: reset every open connection now (RST to the client, close upstream);
- cut after commit: with probability `cut_commit`, the reply that tells the client a
  transaction committed is dropped and the client's socket is reset, so the commit happened
  but the client cannot know it. The reply is the one to an explicit COMMIT or to a write
  statement run in autocommit (then that statement's reply is the commit's reply):
  PostgreSQL: a CommandComplete tag COMMIT / INSERT / UPDATE / DELETE followed by
  ReadyForQuery with status I (idle: committed), or the SELECT tag of a send (tableq's
  INSERT wrapped as `WITH sent AS (INSERT ...) SELECT`, so that it can wake listeners; not
  a replace's, whose tag was SELECT before too), known by its statement's text; MariaDB: an
  OK packet answering a COM_QUERY COMMIT / INSERT / UPDATE / DELETE whose status flags say
  no transaction is open;
- cut before commit: with probability `cut_before_commit`, the client's COMMIT is dropped
  and both sockets reset, so the server rolls the transaction back.
PostgreSQL clients must connect with sslmode=disable (the proxy reads the plain protocol).
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
from dataclasses import dataclass, field

WRITES = (b"COMMIT", b"INSERT", b"UPDATE", b"DELETE")


@dataclass(eq=False)  # kept in a set by identity
class _Conn:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    down: bytearray = field(default_factory=bytearray)  # server -> client bytes not yet whole
    up: bytearray = field(default_factory=bytearray)  # client -> server, ditto
    last_write_tag: bool = False  # PostgreSQL: a write's CommandComplete came before RFQ
    statements: dict[bytes, bool] = field(default_factory=dict)  # PostgreSQL: name -> a send
    running_send: bool = False  # PostgreSQL: the statement running is a send
    pending_write: bool = False  # MariaDB: the client's last command was a write
    closed: bool = False


class FaultProxy:
    def __init__(self, upstream_port: int, dialect: str, *, seed: int = 6) -> None:
        if dialect not in ("postgres", "mysql"):
            raise ValueError(f"dialect must be postgres or mysql, not {dialect!r}")
        self.upstream_port, self.dialect = upstream_port, dialect
        self.latency_s = 0.0
        self.cut_commit = 0.0
        self.cut_before_commit = 0.0
        self.commits_seen = self.commits_cut = self.commits_dropped = self.resets = 0
        self._rng = random.Random(seed)
        self._conns: set[_Conn] = set()
        self._loop = asyncio.new_event_loop()
        self._flowing: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True, name="fault-proxy")
        self.port = 0

    # --- control, from the test's thread --------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stall(self) -> None:
        self._call(lambda: self._flowing.clear())  # type: ignore[union-attr]

    def unstall(self) -> None:
        self._call(lambda: self._flowing.set())  # type: ignore[union-attr]

    def reset(self) -> None:
        """Resets every open connection (RST to the client, close to the server)."""
        def run() -> None:
            for conn in list(self._conns):
                self._abort(conn)
        self._call(run)

    def stop(self) -> None:
        self.reset()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _call(self, fn: object) -> None:
        done = threading.Event()

        def run() -> None:
            try:
                fn()  # type: ignore[operator]
            finally:
                done.set()
        self._loop.call_soon_threadsafe(run)
        done.wait(10)

    # --- the proxy, on its own loop ---------------------------------------------------------

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._flowing = asyncio.Event()
        self._flowing.set()
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            self._loop.close()

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter
                      ) -> None:
        try:
            ureader, uwriter = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            cwriter.close()
            return
        conn = _Conn(cwriter, uwriter)
        self._conns.add(conn)
        try:
            await asyncio.gather(self._pipe(creader, conn, up=True),
                                 self._pipe(ureader, conn, up=False))
        finally:
            self._abort(conn, rst=False)
            self._conns.discard(conn)

    async def _pipe(self, reader: asyncio.StreamReader, conn: _Conn, *, up: bool) -> None:
        while not conn.closed:
            try:
                chunk = await reader.read(65536)
            except (ConnectionError, OSError):
                chunk = b""
            if not chunk:
                self._abort(conn, rst=False)
                return
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
            await self._flowing.wait()  # type: ignore[union-attr]
            buf = conn.up if up else conn.down
            buf += chunk
            out = bytearray()
            for message in self._messages(buf, up):
                if not self._pass(conn, message, up):
                    self._abort(conn)
                    return
                out += message
            if out and not conn.closed:
                (conn.upstream if up else conn.client).write(bytes(out))

    def _messages(self, buf: bytearray, up: bool) -> list[bytes]:
        """Whole protocol messages taken off the front of buf."""
        out = []
        while True:
            if self.dialect == "postgres":
                if up and not _typed_pg_start(buf):  # startup packet: length, no type byte
                    if len(buf) < 4:
                        break
                    n = struct.unpack("!I", buf[:4])[0]
                else:
                    if len(buf) < 5:
                        break
                    n = struct.unpack("!I", buf[1:5])[0] + 1
            else:
                if len(buf) < 4:
                    break
                n = int.from_bytes(buf[:3], "little") + 4
            if len(buf) < n:
                break
            out.append(bytes(buf[:n]))
            del buf[:n]
        return out

    def _pass(self, conn: _Conn, message: bytes, up: bool) -> bool:
        """False when a toxic cuts the connection at this message."""
        if self.dialect == "postgres":
            return self._pass_pg(conn, message, up)
        return self._pass_mysql(conn, message, up)

    def _pass_pg(self, conn: _Conn, m: bytes, up: bool) -> bool:
        if up:
            kind = m[:1]
            if kind == b"Q":
                conn.running_send = _is_send(m[5:])
                if m[5:].lstrip().upper().startswith(b"COMMIT"):
                    return self._before_commit()
            elif kind == b"P":  # Parse: statement name, then its text
                name, _, rest = m[5:].partition(b"\0")
                conn.statements[name] = _is_send(rest)
            elif kind == b"B":  # Bind: portal name, then the statement's
                statement = m[5:].split(b"\0", 2)[1]
                conn.running_send = conn.statements.get(statement, False)
            return True
        if m[:1] == b"C":
            tag = m[5:].upper()
            conn.last_write_tag = tag.startswith(WRITES) or (
                conn.running_send and tag.startswith(b"SELECT"))
        elif m[:1] == b"Z":
            committed = conn.last_write_tag and m[5:6] == b"I"
            conn.last_write_tag = False
            if committed:
                return self._after_commit()
        return True

    def _pass_mysql(self, conn: _Conn, m: bytes, up: bool) -> bool:
        payload = m[4:]
        if up:
            conn.pending_write = payload[:1] == b"\x03" and payload[1:].lstrip().upper(
            ).startswith(WRITES)
            if conn.pending_write and payload[1:].lstrip().upper().startswith(b"COMMIT"):
                return self._before_commit()
            return True
        if conn.pending_write:
            conn.pending_write = False
            if payload[:1] == b"\x00" and not _mysql_ok_in_transaction(payload):
                return self._after_commit()
        return True

    def _after_commit(self) -> bool:
        self.commits_seen += 1
        if self.cut_commit and self._rng.random() < self.cut_commit:
            self.commits_cut += 1
            return False
        return True

    def _before_commit(self) -> bool:
        if self.cut_before_commit and self._rng.random() < self.cut_before_commit:
            self.commits_dropped += 1
            return False
        return True

    def _abort(self, conn: _Conn, *, rst: bool = True) -> None:
        if conn.closed:
            return
        conn.closed = True
        if rst:
            self.resets += 1
            sock = conn.client.get_extra_info("socket")
            if sock is not None:  # linger 0: close() sends RST, as a crashed peer would
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.client.transport.abort()
        conn.upstream.transport.abort()


def _is_send(text: bytes) -> bool:
    """A tableq send that is not a replace: `WITH sent AS (INSERT ...) SELECT ...`."""
    head = text.lstrip()[:4000].upper()
    return head.startswith(b"WITH SENT AS") and b"DO UPDATE" not in head


def _typed_pg_start(buf: bytearray) -> bool:
    """Client bytes start with a type byte once the startup packet went through; the startup
    packet itself begins with its int32 length, whose first byte is 0 for any sane size."""
    return bool(buf) and buf[0] != 0


def _lenenc(payload: bytes, at: int) -> int:
    """The position after a length-encoded integer starting at `at`."""
    first = payload[at]
    return at + {0xFC: 3, 0xFD: 4, 0xFE: 9}.get(first, 1)


def _mysql_ok_in_transaction(payload: bytes) -> bool:
    """An OK packet's SERVER_STATUS_IN_TRANS flag."""
    at = _lenenc(payload, _lenenc(payload, 1))  # skip affected rows and last insert id
    status = int.from_bytes(payload[at : at + 2], "little")
    return bool(status & 0x0001)
