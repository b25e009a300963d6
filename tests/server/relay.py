"""A TCP relay in front of a real tableq server that can lose one reply: the request reaches
the server and is done there, then the client's connection is closed before any byte of the
answer comes back (what a crash of a proxy or of the network between them looks like)."""

from __future__ import annotations

import socket
import threading


class Relay:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.requests = 0  # request lines seen going up
        self._lose = threading.Event()
        self._lock = threading.Lock()
        self._open: list[tuple[socket.socket, socket.socket]] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True, name="relay").start()

    def lose_next_reply(self) -> None:
        self._lose.set()

    def end_connections(self) -> None:
        """Closes every open connection, as a server ends kept-alive connections it finds
        idle: the clients' next request on one is written into a closed socket."""
        with self._lock:
            pairs, self._open = self._open, []
        for client, upstream in pairs:
            _close(upstream, client)

    def close(self) -> None:
        self._listener.close()
        self.end_connections()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            with self._lock:
                self._open.append((client, upstream))
            threading.Thread(target=self._up, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket) -> None:
        while chunk := _recv(client):
            with self._lock:
                self.requests += chunk.count(b" HTTP/1.1\r\n")
            upstream.sendall(chunk)
        _close(upstream, client)

    def _down(self, upstream: socket.socket, client: socket.socket) -> None:
        while chunk := _recv(upstream):
            if self._lose.is_set():
                self._lose.clear()
                break  # the server answered; the client never hears it
            client.sendall(chunk)
        _close(upstream, client)


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
