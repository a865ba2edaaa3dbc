"""A tiny webhook endpoint on loopback for the public-mode tests: Polar's webhooks land here."""

from __future__ import annotations

import json
from typing import Any

from outpost_sync.cli._webhook_endpoint import WebhookEndpoint


class Receiver:
    """A tiny webhook endpoint on loopback: records every request, answers `status`."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.status = 204
        self.endpoint = WebhookEndpoint(self._record, "/hook")
        self.url = self.endpoint.url

    def _record(self, body: bytes, headers: dict[str, str]) -> int:
        self.requests.append(({k.lower(): v for k, v in headers.items()}, body))
        return self.status

    def close(self) -> None:
        self.endpoint.close()

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in list(self.requests)]
