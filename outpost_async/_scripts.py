"""Running the Lua scripts: ``EVALSHA`` through the command batches on one Redis, ``EVAL`` where
Redis does not hold the script; on a cluster, on one connection of the node owning the keys.

Used by ``track()``, by the session's ``RunScript`` effects and by delivery (settle, reclaim, the
shared request budget).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import NoScriptError

from outpost_async._backend import all_of
from outpost_async._cluster import on_owning_node
from outpost_async._context import DriverContext, redis_unavailable

if TYPE_CHECKING:
    from outpost_async._effects import SessionEffects

from outpost_core import (
    SCRIPT_SHA1,
    SCRIPT_TEXT,
    BudgetAnswered,
    Durability,
    RunScript,
    SettleScript,
    TakeRequest,
)

_T = TypeVar("_T")


async def run_script(ctx: DriverContext, name: str, keys: Any, args: Any) -> Any:
    """The script ``name``'s reply (or the error Redis gave it)."""
    if ctx.cluster is None:
        # EVALSHA straight on the client: redis-py's Script object adds a layer of calls to
        # every track(). EVAL where Redis does not hold the script (restarted, flushed)
        # caches it again.
        try:
            return await ctx.batches.execute("EVALSHA", SCRIPT_SHA1[name], len(keys), *keys, *args)
        except NoScriptError:  # as many tasks at once as got it: each goes in the batches
            return await ctx.batches.execute("EVAL", SCRIPT_TEXT[name], len(keys), *keys, *args)
    # redis-py's reload after NOSCRIPT loads the script on every primary, and fails while
    # one is down: EVAL runs it on the node that owns the keys, and caches it there.
    (reply,) = await script_calls(ctx, name, keys, args)
    return reply


async def run_or_fail(ctx: DriverContext, run: RunScript) -> Any:
    """The reply of ``run``'s script; a Redis failure raises :class:`RedisUnavailable`."""
    with redis_unavailable(f"running {run.script}"):
        return await run_script(ctx, run.script, run.keys, run.args)


async def take_request(ctx: DriverContext, action: TakeRequest) -> BudgetAnswered:
    """One request taken from the fleet's shared budget for Polar's API (``budget.lua``)."""
    args = [str(action.per_minute), str(action.capacity), ""]  # "": Redis's clock
    return BudgetAnswered(await run_script(ctx, "budget", (action.key,), args))


async def run_then(ctx: DriverContext, run: RunScript, command: tuple[Any, ...]) -> tuple[Any, Any]:
    """The script, then ``command`` on the same connection in the same round trip (WAIT
    counts the replicas that have that connection's writes)."""
    with redis_unavailable(f"running {run.script}"):
        reply, answer = await script_calls(ctx, run.script, run.keys, run.args, command)
    return reply, answer


async def run_echoed(
    ctx: DriverContext,
    effects: SessionEffects,
    run: RunScript,
    ticket: int,
    durability: Durability,
) -> tuple[Any, str | None]:
    """Run a script that writes a customer's state, waiting for a replica when ``durability``
    asks. Returns its reply and why it is less durable than asked (``None``: it is not). If it
    fails, the session applies what it held for it (``ticket``) before the error goes on."""
    wait = durability.wait()
    try:
        if wait is None:
            return await run_or_fail(ctx, run), None
        reply, acknowledged = await run_then(ctx, run, wait)
    except BaseException:
        effects.failed(ticket)
        raise
    return reply, durability.shortfall(acknowledged)


def _evalsha(call: SettleScript) -> tuple[Any, ...]:
    return ("EVALSHA", SCRIPT_SHA1[call.script], len(call.keys), *call.keys, *call.args)


async def run_scripts(ctx: DriverContext, calls: Sequence[SettleScript]) -> list[Any]:
    """Each call's reply, or the error it met (never raised): in one round trip on one Redis;
    on a cluster, each on the node owning its keys, all at once where the driver can."""
    if ctx.cluster is None:
        return await ctx.batches.scripts([_evalsha(c) for c in calls])
    replies: list[Any] = [None] * len(calls)

    async def one(index: int, call: SettleScript) -> None:
        try:
            replies[index] = await run_script(ctx, call.script, call.keys, call.args)
        except Exception as exc:
            replies[index] = exc

    await all_of([functools.partial(one, n, call) for n, call in enumerate(calls)])
    return replies


async def read_then_scripts(
    ctx: DriverContext,
    read: tuple[Any, ...],
    parse: Callable[[Any], _T],
    calls: Sequence[SettleScript],
) -> tuple[_T | BaseException, list[Any]]:
    """A read (``parse`` makes its reply, as Redis sent it, into what it found), then each
    call's script behind it in the same round trip, on one Redis (not a cluster): Redis runs the
    scripts while this process parses the read. Each result, or the error it met (never
    raised)."""
    return await ctx.batches.first_then_scripts(read, parse, [_evalsha(c) for c in calls])


async def script_calls(
    ctx: DriverContext, name: str, keys: Any, args: Any, *after: tuple[Any, ...]
) -> list[Any]:
    """The script ``name`` (EVALSHA, or EVAL where Redis does not hold it), then ``after``,
    on one connection in one round trip: on a cluster, one of the node owning the keys."""
    try:
        call = ("EVALSHA", SCRIPT_SHA1[name], len(keys), *keys, *args)
        return await _in_one_trip(ctx, keys[0], call, *after)
    except NoScriptError:
        call = ("EVAL", SCRIPT_TEXT[name], len(keys), *keys, *args)
        return await _in_one_trip(ctx, keys[0], call, *after)


async def _in_one_trip(ctx: DriverContext, key: str, *commands: tuple[Any, ...]) -> list[Any]:
    if ctx.cluster is not None:
        return await on_owning_node(ctx.cluster, ctx.node_calls, key, list(commands))
    pipeline: Any = ctx.redis.pipeline(transaction=False)
    async with pipeline as pipe:
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute())
