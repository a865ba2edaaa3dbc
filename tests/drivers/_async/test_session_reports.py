"""The session never logs: the driver logs what it reports, on the instance's logger, as soon as
the read or the input that made it was handed over."""

from __future__ import annotations

import logging
import uuid

import pytest

from outpost_core import Customer
from outpost_core import _keys as keys
from tests.drivers._async._helpers import COUNT, eventually, holds, make
from tests.drivers._async.test_fresh_reads import barrier
from tests.drivers._async.test_local_state import prepare
from tests.support.redis_server import RedisServer

LOGGER = "tests.session_reports"


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


@pytest.mark.anyio
async def test_a_reads_load_and_a_rejected_change_are_logged_on_the_instances_logger(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    customer = Customer("external", f"c-{uuid.uuid4().hex[:8]}")
    prepare(redis_server, customer)
    key = keys.state_key(customer, "r-count")
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        async with make(redis_server, logger=logging.getLogger(LOGGER)) as b:
            await b.balance(COUNT, external_customer_id=customer.id)
            # The read asked for the load and waited for it: both lines are out when it answers.
            lines = said(caplog)
            assert f"outpost loads {key} (copy at revision -1)" in lines, lines
            assert any(line.startswith(f"outpost loaded {key} at revision ") for line in lines)
            await barrier(redis_server, b, customer)  # an unreadable change, heard and rejected
            await eventually(
                holds(
                    lambda: any(line.startswith("outpost rejected change") for line in said(caplog))
                ),
                what="the rejection logged",
            )
    rejected = [r for r in caplog.records if r.getMessage().startswith("outpost rejected change")]
    assert rejected and all(r.levelno == logging.WARNING for r in rejected)
