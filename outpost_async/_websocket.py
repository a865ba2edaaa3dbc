"""The link loop: keeps the WebSocket to Polar open and moves its bytes to and from the session.

It opens the connection the session asks for (``OpenConnection``, handed over in the context),
feeds what it reads as ``BytesReceived``, and ticks the session at each of its deadlines.
"""

from __future__ import annotations

import time

from outpost_async._backend import open_stream
from outpost_async._context import DriverContext
from outpost_async._effects import SessionEffects
from outpost_core import BytesReceived, ConnectionFailed, ConnectionOpened
from outpost_io.tls import cannot_connect


class LinkLoop:
    def __init__(self, context: DriverContext, effects: SessionEffects) -> None:
        self._context = context
        self._effects = effects

    async def run(self) -> None:
        ctx, effects = self._context, self._effects
        while not ctx.closed:
            if ctx.session.remote is None:
                return  # the public mode took over: no WebSocket from now on
            await effects.tick()
            want, ctx.want_open = ctx.want_open, None
            if want is None:
                # Sleep until the session's next deadline; an OpenConnection handed over by
                # another loop meanwhile changes the signal's version and wakes this one.
                version = ctx.signal.version
                if ctx.want_open is None:
                    await ctx.signal.wait(version, ctx.until_deadline())
                continue
            try:
                tls = ctx.tls if want.tls else None
                stream = await open_stream(want.host, want.port, tls, timeout=want.timeout)
            except (OSError, TimeoutError) as exc:
                reason = cannot_connect(exc, want.host, want.port)
                await effects.feed(ConnectionFailed(time.monotonic(), reason))
                continue
            ctx.stream, ctx.drop_stream = stream, False
            try:
                await effects.feed(ConnectionOpened(time.monotonic()))
                while not ctx.closed and not ctx.drop_stream:
                    data = await stream.receive(ctx.until_deadline())
                    if data is None:
                        await effects.tick()
                    else:
                        await effects.feed(BytesReceived(time.monotonic(), data))
                        if not data:
                            break
            except (OSError, TimeoutError) as exc:
                await effects.feed(ConnectionFailed(time.monotonic(), f"connection lost: {exc}"))
            finally:
                ctx.stream = None
                await stream.close()

    async def failed(self) -> None:
        """The loop failed (its supervisor restarts it): the connection it held is gone, and the
        session reconnects after its backoff."""
        ctx = self._context
        ctx.want_open, ctx.drop_stream = None, False
        await self._effects.feed(ConnectionFailed(time.monotonic(), "the link loop failed"))
