"""Commands to Redis for the sync driver: each sent as it comes, scripts and ``HGETALL`` straight
on kept connections (packed by hiredis), a read with scripts behind it in one round trip.

The twin of ``outpost_async/_batches.py``, with the same names.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

try:
    import hiredis
except ImportError:  # pragma: no cover - hiredis is an extra; without it redis-py does it all
    hiredis = None  # type: ignore[assignment,unused-ignore]

_T = TypeVar("_T")


def _read_or_error(read: Callable[[Any], _T], reply: Any) -> _T | BaseException:
    return reply if isinstance(reply, BaseException) else read(reply)


class CommandBatches:
    """Each command sent as it comes: a thread waits for its own reply (the async twin pipelines
    the commands of many tasks).

    Scripts (``EVALSHA``, ``EVAL``: no reply callback in redis-py) and ``HGETALL`` go, with
    hiredis, on connections this object keeps from the client's pool: packed by hiredis,
    written and read on the connection, without redis-py's command layers (its encoding of each
    argument, the pool's lock, its retry and event hooks), which cost a ``track()`` about as
    much as the script's own work in Redis, and a ``balance(fresh=True)`` a third of its
    ``HGETALL``. A connection that fails is dropped and the command goes once more the usual
    way, through redis-py (whose retry it would have had; both are safe to send twice: a track
    sent twice is counted once, by its id)."""

    def __init__(
        self, client: Redis, slots: int = 4, most: int = 512, shared_connection: bool = True
    ) -> None:
        self._client = client
        pool = getattr(client, "connection_pool", None)
        self._pool: Any = pool if _packs(pool) else None
        self._idle: list[Any] = []  # connections kept for scripts: list.pop/append are atomic
        self._pid = os.getpid()

    def execute(self, *command: Any, parsed: bool = True) -> Any:
        """``command``'s reply; not ``parsed``: as Redis sent it, where redis-py allows (a
        stream read's reply callback costs more than the read, in the GIL the callers want)."""
        if self._pool is not None and command[0] in _STRAIGHT:
            return self._straight(command)
        if not parsed:  # redis-py looks its reply callbacks up by a command name in text
            command = (str(command[0]).encode(), *command[1:])
        return self._client.execute_command(*command)  # type: ignore[no-untyped-call]

    def _borrow(self) -> Any:
        """A connection kept for scripts, or ``None`` when the pool cannot give one now."""
        if self._pid != os.getpid():  # forked: the parent's connections are not this process's
            self._idle, self._pid = [], os.getpid()
        try:
            return self._idle.pop()
        except IndexError:
            try:
                return self._pool.get_connection()
            except (RedisConnectionError, RedisTimeoutError, OSError):
                return None

    def _straight(self, command: tuple[Any, ...]) -> Any:
        connection = self._borrow()
        if connection is None:
            return self._client.execute_command(*command)  # type: ignore[no-untyped-call]
        try:
            connection.send_packed_command([hiredis.pack_command(command)])
            reply = connection.read_response()
        except ResponseError:  # Redis answered (NOSCRIPT, a script's error): the line is fine
            self._keep(connection)
            raise
        except (RedisConnectionError, RedisTimeoutError, OSError):
            # Lost on the way (a restarted Redis, a stale line): once more through redis-py, as
            # its retry would have sent it again.
            self._drop(connection)
            return self._client.execute_command(*command)  # type: ignore[no-untyped-call]
        except BaseException:
            self._drop(connection)
            raise
        self._keep(connection)
        shape = _STRAIGHT[command[0]]
        return reply if shape is None else shape(reply)

    def _drop(self, connection: Any) -> None:
        connection.disconnect()
        self._pool.release(connection)

    def _keep(self, connection: Any) -> None:
        if len(self._idle) < _KEPT:
            self._idle.append(connection)
        else:
            self._pool.release(connection)

    def scripts(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Each script's reply, or the error it met (never raised), all sent in one round trip:
        on a connection kept for scripts, else in one of redis-py's pipelines."""
        connection = self._borrow() if self._pool is not None else None
        if connection is None:
            try:
                return self._pipelined(commands, raise_on_error=False)
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                return [exc] * len(commands)
        replies: list[Any] = []
        try:
            connection.send_packed_command([hiredis.pack_command(c) for c in commands])
            for _ in commands:
                try:
                    replies.append(connection.read_response())
                except ResponseError as exc:  # this script's: the line is fine
                    replies.append(exc)
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            self._drop(connection)
            return replies + [exc] * (len(commands) - len(replies))
        except BaseException:
            self._drop(connection)
            raise
        self._keep(connection)
        return replies

    def first_then_scripts(
        self,
        first: tuple[Any, ...],
        read: Callable[[Any], _T],
        commands: Sequence[tuple[Any, ...]],
    ) -> tuple[_T | BaseException, list[Any]]:
        """``first`` (its reply as Redis sent it, made into ``read(reply)``) and the scripts
        ``commands`` behind it, in one round trip: Redis runs the scripts while ``read`` works on
        the first reply. Each result, or the error it met (never raised)."""
        unparsed = (str(first[0]).encode(), *first[1:])  # no reply callback in redis-py
        connection = self._borrow() if self._pool is not None else None
        if connection is None:
            try:
                replies = self._pipelined([unparsed, *commands], raise_on_error=False)
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                return exc, [exc] * len(commands)
            return _read_or_error(read, replies[0]), replies[1:]
        results: list[Any] = []  # the first's, then each script's
        try:
            connection.send_packed_command([hiredis.pack_command(c) for c in (first, *commands)])
            for n in range(len(commands) + 1):
                try:
                    reply = connection.read_response()
                except ResponseError as exc:  # this command's: the line is fine
                    reply = exc
                results.append(reply if n else _read_or_error(read, reply))
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            self._drop(connection)
            results += [exc] * (len(commands) + 1 - len(results))
        except BaseException:
            self._drop(connection)
            raise
        else:
            self._keep(connection)
        return results[0], results[1:]

    def execute_all(self, *commands: tuple[Any, ...]) -> list[Any]:
        """Each command's reply, in order, in one pipeline; the first error raises."""
        return self._pipelined(commands, raise_on_error=True)

    def _pipelined(self, commands: Sequence[tuple[Any, ...]], *, raise_on_error: bool) -> list[Any]:
        with self._client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)  # type: ignore[no-untyped-call]
            return list(pipe.execute(raise_on_error=raise_on_error))

    def close(self) -> None:
        """Give the connections kept back to the pool."""
        idle, self._idle = self._idle, []
        if self._pool is not None and self._pid == os.getpid():
            for connection in idle:
                self._pool.release(connection)


def _hash(reply: Any) -> Any:
    """An ``HGETALL`` reply as redis-py's callback makes it: a mapping (RESP3 sends one; RESP2
    a flat list of names and values)."""
    return dict(zip(reply[::2], reply[1::2], strict=True)) if isinstance(reply, list) else reply


# The commands sent straight on a kept connection, and what makes each reply redis-py's.
_STRAIGHT: dict[str, Callable[[Any], Any] | None] = {
    "EVALSHA": None,
    "EVAL": None,
    "HGETALL": _hash,
}
_KEPT = 16  # connections kept for scripts at most: more threads at once borrow from the pool


def _packs(pool: Any) -> bool:
    """Whether scripts can go straight on this pool's connections: hiredis is there to pack
    them."""
    return hiredis is not None and pool is not None and hasattr(pool, "get_connection")
