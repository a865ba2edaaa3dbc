"""A port that takes connections and closes each at once, counting them: Redis gone dark.

A stopped redis-server refuses connections, which cannot be counted; this stands where it was
(same port), so a test can bound how often a client tries to reconnect while Redis is down.
"""

from __future__ import annotations

import socket
import threading
from types import TracebackType


class RefusingPort:
    def __init__(self, port: int) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(128)
        self._listener.settimeout(0.05)
        self._stop = threading.Event()
        self.connections = 0
        self._thread = threading.Thread(target=self._serve, name="refusing-port", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            connection.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()

    def __enter__(self) -> RefusingPort:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
