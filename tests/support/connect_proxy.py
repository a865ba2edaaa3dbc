"""A forward proxy for the tests: it answers HTTP ``CONNECT`` on loopback and relays the tunnel's
bytes both ways (TLS passes through it unread), recording each tunnel asked for. ``refuse`` makes
it answer every CONNECT with that status line instead."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class ConnectProxy:
    def __init__(self) -> None:
        self.tunnels: list[str] = []
        self.authorizations: list[str | None] = []
        self.refuse: str | None = None
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="test-proxy", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ConnectProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def _keep(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            self._keep(client)
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
            self._keep(upstream)
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()
            _pump(client, upstream)


def _pump(source: socket.socket, target: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while chunk := source.recv(65536):
            target.sendall(chunk)
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)
