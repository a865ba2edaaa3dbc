"""A merchant's webhook endpoint on loopback, where the emulator delivers Polar's webhooks."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable
from typing import Any


class WebhookEndpoint:
    """Serves ``path`` on a free loopback port: each POST's body and headers go to ``answer``,
    whose return is the response's status."""

    def __init__(self, answer: Callable[[bytes, dict[str, str]], int], path: str) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                self.send_response(answer(body, dict(self.headers.items())))
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
