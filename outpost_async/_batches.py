"""Commands to Redis for the async driver: the commands many tasks send at once go together
(auto-pipelining), and a read with scripts behind it in one round trip.

The twin of ``outpost_sync/_batches.py``, with the same names.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.exceptions import RedisError

from outpost_async._multiplexed import LineLost, MultiplexedConnection
from outpost_async._multiplexed import available as multiplexing_available

_T = TypeVar("_T")
_REOPEN_AFTER = 1.0  # seconds without the shared connection after it could not be opened


class CommandBatches:
    """Commands that many tasks send at once, sent together (auto-pipelining): the scripts, and
    the reads of state hashes.

    With hiredis, every command goes on one shared connection (:class:`MultiplexedConnection`):
    written with the others of its loop turn, its reply matched in order. A command that
    connection loses runs again through redis-py (its retries), and redis-py does the work alone
    while the connection cannot be opened (a second later it is tried again).

    Without hiredis, a call that finds fewer than ``slots`` sends in flight goes at once, alone;
    one that finds them all busy waits, and when a send returns, every call waiting goes as the
    next send, one redis-py pipeline. Either way Redis runs them in the order they were called,
    and 64 tasks tracking at once cost this process a few round trips' work instead of 64, on a
    few connections, not one each: redis-py's pool refuses more than 100.

    A waiting call that is cancelled is not sent; one cancelled once sent may still run, as any
    call cancelled while Redis runs it.
    """

    def __init__(
        self, client: Redis, slots: int = 4, most: int = 512, shared_connection: bool = True
    ) -> None:
        self._client = client
        self._slots = slots
        self._most = most
        self._in_flight = 0
        self._waiting: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        self._sends: set[asyncio.Task[None]] = set()
        self._line: MultiplexedConnection | None = None
        self._opening: asyncio.Task[MultiplexedConnection | None] | None = None
        self._reopen_at = 0.0
        # a cluster's commands go to the node of their keys: redis-py routes them
        self._multiplexed = (
            shared_connection and multiplexing_available() and isinstance(client, Redis)
        )

    async def execute(self, *command: Any, parsed: bool = True) -> Any:
        """``command``'s reply, or the error Redis or the connection gave it. ``parsed=False``:
        the caller reads the reply as Redis sent it, or as redis-py makes it (on the shared
        connection, redis-py's reply callback is then skipped: a stream read's costs more
        than the read)."""
        line = self._line
        if (line is not None and not line.lost) or (line := await self._open_line()) is not None:
            try:
                return await line.send(command, parsed)
            except LineLost:
                return await self._client.execute_command(*command)  # type: ignore[no-untyped-call]
        if self._slot_free():
            try:
                return await self._client.execute_command(*command)  # type: ignore[no-untyped-call]
            finally:
                self._returned()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append((command, future))
        return await future

    async def scripts(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Each script's reply, or the error it met (never raised): sent at once, so they go
        together in the line's next write."""
        return list(
            await asyncio.gather(*(self.execute(*c) for c in commands), return_exceptions=True)
        )

    async def first_then_scripts(
        self,
        first: tuple[Any, ...],
        read: Callable[[Any], _T],
        commands: Sequence[tuple[Any, ...]],
    ) -> tuple[_T | BaseException, list[Any]]:
        """``first`` (its reply as Redis sent it, made into ``read(reply)``) and the scripts
        ``commands`` behind it, sent together: Redis runs the scripts while ``read`` works on the
        first reply. Each result, or the error it met (never raised)."""

        async def first_read() -> _T:
            return read(await self.execute(*first, parsed=False))

        done = await asyncio.gather(
            first_read(), *(self.execute(*c) for c in commands), return_exceptions=True
        )
        return done[0], list(done[1:])

    async def execute_all(self, *commands: tuple[Any, ...]) -> list[Any]:
        """Each command's reply, in order, sent together (one pipeline, or in the next one);
        the first error raises."""
        line = self._line
        if (line is not None and not line.lost) or (line := await self._open_line()) is not None:
            try:
                replies = await asyncio.gather(
                    *(line.send(c) for c in commands), return_exceptions=True
                )
            except LineLost:  # lost before all were sent
                replies = [LineLost()]
            if any(isinstance(reply, LineLost) for reply in replies):
                return await self._pipelined(commands, raise_on_error=True)
            for reply in replies:
                if isinstance(reply, BaseException):
                    raise reply
            return replies
        if self._slot_free():
            try:
                return await self._pipelined(commands, raise_on_error=True)
            finally:
                self._returned()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Any]] = []
        for command in commands:
            futures.append(loop.create_future())
            self._waiting.append((command, futures[-1]))
        return [await future for future in futures]

    async def aclose(self) -> None:
        """Give the shared connection back to the pool; later calls go through redis-py."""
        self._multiplexed = False
        if self._opening is not None:
            with contextlib.suppress(Exception):
                await self._opening
        if self._line is not None:
            line, self._line = self._line, None
            await line.close()

    async def _open_line(self) -> MultiplexedConnection | None:
        """The shared connection, opened now if it may be (one opening for every caller)."""
        if not self._multiplexed or asyncio.get_running_loop().time() < self._reopen_at:
            return None
        if self._opening is None:
            self._opening = asyncio.get_running_loop().create_task(self._reopen())
        return await asyncio.shield(self._opening)  # a caller cancelled leaves it opening

    async def _reopen(self) -> MultiplexedConnection | None:
        try:
            if self._line is not None:  # lost: back to the pool, which reconnects it when used
                line, self._line = self._line, None
                await line.close()
            self._line = await MultiplexedConnection.open(self._client)
        except (RedisError, OSError):  # Redis is down: redis-py's own path, retried in a second
            self._reopen_at = asyncio.get_running_loop().time() + _REOPEN_AFTER
        finally:
            self._opening = None
        return self._line

    def _slot_free(self) -> bool:
        """Whether a call may go now, alone (then it holds a slot until it returns)."""
        if self._in_flight < self._slots and not self._waiting:
            self._in_flight += 1
            return True
        return False

    async def _pipelined(
        self, commands: Sequence[tuple[Any, ...]], raise_on_error: bool
    ) -> list[Any]:
        pipeline: Any = self._client.pipeline(transaction=False)
        async with pipeline as pipe:
            for command in commands:
                pipe.execute_command(*command)
            return list(await pipe.execute(raise_on_error=raise_on_error))

    def _returned(self) -> None:
        self._in_flight -= 1
        while self._waiting and self._in_flight < self._slots:
            batch = [call for call in self._waiting[: self._most] if not call[1].done()]
            del self._waiting[: self._most]
            if batch:
                self._in_flight += 1
                send = asyncio.get_running_loop().create_task(self._send(batch))
                self._sends.add(send)  # a task nothing holds may be collected mid-send
                send.add_done_callback(self._sends.discard)

    async def _send(self, batch: list[tuple[tuple[Any, ...], asyncio.Future[Any]]]) -> None:
        try:
            replies = await self._pipelined([command for command, _ in batch], False)
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:  # the connection failed: every call of the send did
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        else:
            for (_, future), reply in zip(batch, replies, strict=True):
                if future.done():
                    continue
                if isinstance(reply, Exception):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)
        finally:
            self._returned()
