"""A port that takes connections and closes each at once, counting them: Redis gone dark.

A stopped redis-server refuses connections, which cannot be counted; this stands where it was
(same port), so a test can bound how often a client tries to reconnect while Redis is down.
"""

from __future__ import annotations

import socket

from tests.support.loopback import LoopbackServer


class RefusingPort(LoopbackServer):
    def __init__(self, port: int) -> None:
        self.connections = 0
        super().__init__("refusing-port", port)

    def serve(self, client: socket.socket) -> None:
        self.connections += 1
        client.close()
