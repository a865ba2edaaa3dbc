"""What an ingestion endpoint answers cannot cost the instance more than a bounded read: an error
body of any size is read up to 1 MiB, and the rest is never fetched."""

from __future__ import annotations

import pytest

from outpost_async import AsyncOutpost
from tests.drivers._async._helpers import CONFIGURATION, eventually, holds
from tests.support import polar
from tests.support.flooding_server import FloodingServer
from tests.support.redis_server import RedisServer

BODY = 64 << 20  # 64 MiB


@pytest.mark.anyio
async def test_an_error_body_is_read_up_to_one_mebibyte(redis_server: RedisServer) -> None:
    polar.store_configuration(redis_server.client(), CONFIGURATION)
    with FloodingServer(BODY) as server:
        async with AsyncOutpost(
            access_token="tok", server_url=server.url, redis_url=redis_server.url,
            telemetry=False, linger=0.01, retry_base=0.05,
        ) as a:  # fmt: skip
            await a.track("api_call", external_customer_id="c1")
            await eventually(holds(lambda: len(server.sent) >= 1), what="an ingestion answer")
            await a.close(0.2)
        # The kernel's socket buffers take a few MiB whatever the client reads; never all 64.
        assert max(server.sent) < 16 << 20, server.sent
