"""Reading balances when memory cannot answer at once: waiting for a copy (and Polar's
snapshot) to be ready, and reading Redis for a copy that does not follow it (or ``fresh=True``).

The warm path (a balance already in memory) stays in ``AsyncOutpost.balance``: it costs a dict
lookup, no call.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from outpost_async._backend import sleep
from outpost_async._context import DriverContext, redis_unavailable
from outpost_async._effects import SessionEffects
from outpost_core import Balance, Fetch, NotReady, RedisUnavailable, Session

_RECHECK = 0.1  # seconds a waiting read (or track) sleeps at most between two looks


class Reads:
    def __init__(
        self,
        context: DriverContext,
        effects: SessionEffects,
        start: Callable[[], Awaitable[None]],
    ) -> None:
        self._context = context
        self._effects = effects
        self._start = start  # the instance starts its loops at its first call
        self.public: Any = None
        """The public mode (``_public.PublicMode``): a read waiting for an anchor asks it."""

    async def wait_for_configuration(self) -> None:
        ctx = self._context
        deadline = time.monotonic() + ctx.session.settings.snapshot_timeout
        while ctx.session.configuration is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                with ctx.lock:
                    reason = ctx.session.unconfigured_reason()
                raise NotReady(f"{reason}: cannot tell which meters count the event")
            version = ctx.signal.version
            await self._effects.read_cached_configuration()
            await ctx.signal.wait(version, min(remaining, _RECHECK))

    async def when_ready(
        self,
        meter_id: str,
        external_customer_id: str | None,
        customer_id: str | None,
        fresh: bool = False,
    ) -> Balance:
        ctx = self._context
        deadline = time.monotonic() + ctx.session.settings.snapshot_timeout
        await self._started_by(deadline)
        while True:
            version = ctx.signal.version
            remaining = deadline - time.monotonic()
            # At the deadline, a copy still waiting for the subscription reads Redis.
            found, effects = self._effects.ask(
                _read, meter_id, external_customer_id, customer_id, fresh or remaining <= 0
            )
            if effects:
                # Run them whatever the read found: some may have been queued by another
                # thread or task, and dropping them would leave their flow waiting for good.
                await self._effects.run(effects)
            if isinstance(found, Fetch):
                fetched = await self._fetch(found, meter_id, external_customer_id, customer_id)
                if fetched is not None:
                    return fetched
            elif found is not None:
                return found
            elif effects:
                continue
            if self.public is not None:
                self.public.wanted(external_customer_id, customer_id)
            if remaining <= 0:
                with ctx.lock:
                    reason = ctx.session.not_ready_reason(
                        meter_id, external_customer_id, customer_id
                    )
                public = self.public is not None and self.public.mode == "public"
                if public and reason.startswith("no snapshot for "):
                    reason = self.public.not_ready_reason(external_customer_id or customer_id)
                timeout = ctx.session.settings.snapshot_timeout
                redis_error = ctx.state_outage.error or ctx.subscriber_outage.error
                cause = f" (Redis unreachable: {redis_error})" if redis_error else ""
                raise NotReady(f"{reason} after {timeout} s{cause}")
            if ctx.session.configuration is None:
                await self._effects.read_cached_configuration()
            await ctx.signal.wait(version, min(remaining, _RECHECK))

    async def _started_by(self, deadline: float) -> None:
        """Start the instance, trying again while Redis cannot answer until ``deadline``: a
        first read waits for Redis as long as for its snapshot, then is :class:`NotReady`."""
        ctx = self._context
        while True:
            try:
                await self._start()
                return
            except RedisUnavailable as exc:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timeout = ctx.session.settings.snapshot_timeout
                    raise NotReady(
                        f"the local state could not be loaded from Redis after {timeout} s "
                        f"(Redis unreachable: {ctx.state_outage.error or exc})"
                    ) from exc
                await sleep(min(remaining, _RECHECK))

    async def _fetch(
        self,
        fetch: Fetch,
        meter_id: str,
        external_customer_id: str | None,
        customer_id: str | None,
    ) -> Balance | None:
        """A read that must not come from memory: one ``HGETALL`` per key of the customer and
        its aliases, in one round trip, computed by the core."""
        with redis_unavailable(f"reading {fetch.keys}"):
            try:
                fields = await self._hgetall_each(fetch.keys)
            except RedisConnectionError:  # once more: a pooled connection may predate a restart
                fields = await self._hgetall_each(fetch.keys)
        found, effects = self._effects.ask(
            _read_fetched, meter_id, external_customer_id, customer_id, fields
        )
        if effects:
            await self._effects.run(effects)
        return found

    async def _hgetall_each(self, keys: tuple[str, ...]) -> dict[str, dict[Any, Any]]:
        if len(keys) == 1:  # the common case: no pipeline to build
            return {keys[0]: await self._context.batches.execute("HGETALL", keys[0])}
        replies = await self._context.batches.execute_all(*(("HGETALL", key) for key in keys))
        return dict(zip(keys, replies, strict=True))


# A read's questions, asked of the session object itself (a recording session records them).
def _read(
    session: Session, meter_id: str, external: str | None, customer: str | None, fresh: bool
) -> Balance | Fetch | None:
    return session.read(meter_id, external, customer, fresh=fresh)


def _read_fetched(
    session: Session,
    meter_id: str,
    external: str | None,
    customer: str | None,
    fields: dict[str, dict[Any, Any]],
) -> Balance | None:
    return session.read_fetched(meter_id, external, customer, fields)
