"""A number no loop could use is refused at construction, with the option's name: NaN passes
every comparison, and a fraction or an infinity would reach Redis or Polar as a command or a
header they refuse, again and again, from a loop the caller never sees."""

from __future__ import annotations

from typing import Any

import pytest

from outpost_async import UsageError
from tests.drivers._async._helpers import make
from tests.support.redis_server import RedisServer

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_size": NAN}, "batch_size must be an integer, at least 1, got nan"),
        ({"batch_size": 2.5}, "batch_size must be an integer"),
        ({"max_attempts": INF}, "max_attempts must be an integer"),
        ({"batch_bytes": 1_000.0}, "batch_bytes must be an integer"),
        ({"max_in_flight": 1.5}, "max_in_flight must be an integer, at least 1, got 1.5"),
        ({"max_in_flight": NAN}, "max_in_flight must be an integer"),
        ({"linger": NAN}, "linger must be a finite number, not negative, got nan"),
        ({"claim_idle": INF}, "claim_idle must be a finite number"),
        ({"heartbeat": INF}, "heartbeat must be a positive, finite number, got inf"),
        ({"requests_per_minute": NAN}, "requests_per_minute must be a finite number"),
        ({"telemetry_interval": 0}, "telemetry_interval must be a positive, finite number"),
        ({"telemetry_interval": NAN}, "telemetry_interval must be a positive, finite number"),
    ],
)
def test_a_number_no_loop_could_use_is_refused_at_construction(
    redis_server: RedisServer, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        make(redis_server, access_token="polar_oat_local", **options)
