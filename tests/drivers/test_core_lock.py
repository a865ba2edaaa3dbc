"""The sync driver's threads share one core, which is not thread-safe: every call into it is made
holding the instance's lock. Checked call by call, so a missed lock shows at once, not only when
two threads happen to race (a dict changing size under another thread's loop). One question is
asked without it, by design: whether a message is this instance's own echo (one atomic delete)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from outpost_emulator import Emulator
from outpost_sync import Outpost
from tests.drivers._sync._helpers import count_meter
from tests.support.redis_server import RedisServer

LOCK_FREE = {"own_echo"}
"""The subscriber asks it of every message, without the lock."""


class LockChecked:
    """The core, recording each method called on it without the lock held."""

    def __init__(self, core: Any, lock: Any) -> None:
        self._core = core
        self._lock = lock
        self.unlocked: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._core, name)
        if not callable(value):
            return value

        def checked(*args: Any, **kwargs: Any) -> Any:
            if not self._lock._is_owned():
                self.unlocked.add(name)
            return value(*args, **kwargs)

        return checked


def test_every_call_into_the_core_holds_the_lock(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    meter = count_meter(emulator, credits=100)
    outpost = Outpost(
        access_token=emulator.token,
        server_url=emulator.url,
        redis_url=redis_server.url,
        linger=0.02,
        telemetry_interval=0.05,  # the telemetry flush reads the core too
    )
    context = outpost._context
    checked = LockChecked(context.session, context.lock)
    context.session = checked  # type: ignore[assignment]
    calls: list[Callable[[], object]] = [
        lambda: outpost.balance(meter, external_customer_id="c1"),
        lambda: outpost.track("api_call", external_customer_id="c1"),
        lambda: outpost.balance(meter, external_customer_id="c2", fresh=True),
        lambda: outpost.status,
        lambda: outpost.rejections,
        lambda: outpost.flush(10),
    ]
    with outpost:
        for call in calls:
            call()
    assert checked.unlocked - LOCK_FREE == set()
