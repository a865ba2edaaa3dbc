"""A server that accepts connections and never answers: Polar hanging behind a load balancer."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class SilentServer:
    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, name="test-silent", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            self.accepted.append(client)  # held open, never read from or written to

    def __enter__(self) -> SilentServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._listener.close()
        for client in self.accepted:
            with contextlib.suppress(OSError):
                client.close()
