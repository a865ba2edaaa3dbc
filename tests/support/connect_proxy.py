"""A forward proxy for the tests: it answers HTTP ``CONNECT`` on loopback and relays the tunnel's
bytes both ways (TLS passes through it unread), recording each tunnel asked for. ``refuse`` makes
it answer every CONNECT with that status line instead."""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.support.loopback import LoopbackServer


class ConnectProxy(LoopbackServer):
    def __init__(self) -> None:
        self.tunnels: list[str] = []
        self.authorizations: list[str | None] = []
        self.refuse: str | None = None
        super().__init__("test-proxy")

    def serve(self, client: socket.socket) -> None:
        self.keep(client)
        threading.Thread(target=self._tunnel, args=(client,), daemon=True).start()

    def _tunnel(self, client: socket.socket) -> None:
        head = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in head:
                chunk = client.recv(4096)
                if not chunk:
                    return
                head += chunk
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
            with self._lock:
                self.tunnels.append(target)
                self.authorizations.append(headers.get("Proxy-Authorization"))
            if self.refuse is not None or method != "CONNECT":
                client.sendall(f"HTTP/1.1 {self.refuse or '405 Not Allowed'}\r\n\r\n".encode())
                client.close()
                return
            host, port = target.rsplit(":", 1)
            upstream = socket.create_connection((host, int(port)), timeout=5)
            upstream.settimeout(None)
            self.keep(upstream)
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()
            _pump(client, upstream)


def _pump(source: socket.socket, target: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while chunk := source.recv(65536):
            target.sendall(chunk)
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)
