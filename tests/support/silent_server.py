"""A server that accepts connections and never answers: Polar hanging behind a load balancer."""

from __future__ import annotations

import socket

from tests.support.loopback import LoopbackServer


class SilentServer(LoopbackServer):
    def __init__(self) -> None:
        self.accepted: list[socket.socket] = []
        super().__init__("test-silent")

    def serve(self, client: socket.socket) -> None:
        self.keep(client)
        self.accepted.append(client)  # held open, never read from or written to
