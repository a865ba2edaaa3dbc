"""The skeleton of the tests' stand-in servers: a listener on loopback, a daemon thread that hands
each connection to ``serve``, and a ``close`` (also on leaving ``with``) that stops the thread,
frees the port and closes every socket the server kept."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Self


class LoopbackServer:
    def __init__(self, name: str, port: int = 0) -> None:
        """Listen on ``port`` (0: any free one) and start serving; a subclass sets its own
        attributes before calling this, since ``serve`` may run at once."""
        self._listener = socket.create_server(("127.0.0.1", port), backlog=128)
        # Closing a listener does not wake a thread blocked in accept(): poll, so that close()
        # can join the thread and the port is free when it returns.
        self._listener.settimeout(0.05)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._kept: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name=name, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def serve(self, client: socket.socket) -> None:
        """Handle one accepted connection, on the accepting thread (start another to block)."""
        raise NotImplementedError

    def keep(self, sock: socket.socket) -> None:
        """Close ``sock`` with the server."""
        with self._lock:
            self._kept.append(sock)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()
        with self._lock:
            for sock in self._kept:
                with contextlib.suppress(OSError):
                    sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            self.serve(client)
