"""A server whose every answer to ``POST /v1/events/ingest`` is a 422 with a body of ``size``
bytes, sent until the client stops reading: how much it got out is what the client read."""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.support.loopback import LoopbackServer

CHUNK = b"x" * 65_536


class FloodingServer(LoopbackServer):
    def __init__(self, size: int) -> None:
        self.size = size
        self.answered = 0
        self.sent: list[int] = []  # bytes of body each ingestion answer got out
        super().__init__("test-flooding")

    def serve(self, client: socket.socket) -> None:
        self.keep(client)
        threading.Thread(target=self._answer, args=(client,), daemon=True).start()

    def _answer(self, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            head = b""
            while b"\r\n\r\n" not in head:
                data = client.recv(65_536)
                if not data:
                    return
                head += data
            if not head.startswith(b"POST /v1/events/ingest"):
                client.sendall(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
                return
            client.sendall(
                b"HTTP/1.1 422 Unprocessable Entity\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {self.size}\r\nConnection: close\r\n\r\n".encode()
            )
            sent = 0
            try:
                while sent < self.size:
                    sent += client.send(CHUNK[: self.size - sent])
            finally:
                self.sent.append(sent)
                self.answered += 1
