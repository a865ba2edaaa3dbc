"""Auto-pipelining in the async driver (``CommandBatches``) where it has no shared connection
(no hiredis; ``shared_connection=False`` here): calls made while every send is busy wait, and go
together as one pipeline on one connection, in order. Against a real Redis. The shared
connection has its own tests (``test_multiplexed.py``); the instance-level ones here run on it.

The sync twin sends each call as it comes (a thread waits for its own reply); its scripts and
hash reads go on connections it keeps, without redis-py's command layers (the last tests here);
the driver tests run every script and fresh read through it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from outpost_async import AsyncOutpost
from outpost_async._batches import CommandBatches
from outpost_core import Customer
from outpost_core._replies import stream_entries
from outpost_sync import Outpost
from outpost_sync._batches import CommandBatches as SyncCommandBatches
from tests.drivers._async._helpers import COUNT
from tests.drivers._async.test_local_state import consumed, prepare
from tests.support.redis_cluster import RedisCluster
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until_async
from tests.support.wiring import shards_of


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[Any]:
    # No retries: a failed send is seen as it failed.
    yield redis.asyncio.Redis.from_url(redis_server.url, retry=Retry(NoBackoff(), 0))


async def _blocked(batches: CommandBatches, client: Any) -> asyncio.Task[Any]:
    """A call that holds the one slot until something is pushed on ``gate``."""
    blocker = asyncio.create_task(batches.execute("BLPOP", "gate", 10))
    await wait_until_async(lambda: _clients_blocked(client), "the blocker waiting in Redis")
    return blocker


async def _clients_blocked(client: Any) -> bool:
    info = await client.info("clients")
    return int(info["blocked_clients"]) == 1


@pytest.mark.anyio
async def test_calls_that_find_every_slot_busy_go_as_one_pipeline_in_order(client: Any) -> None:
    batches = CommandBatches(client, slots=1, shared_connection=False)
    blocker = await _blocked(batches, client)
    calls = [asyncio.create_task(batches.execute("RPUSH", "order", n)) for n in range(50)]
    ids = [asyncio.create_task(batches.execute("CLIENT", "ID")) for _ in range(5)]
    for _ in range(3):
        await asyncio.sleep(0)  # each task runs to its wait
    assert await client.llen("order") == 0  # waiting for the slot, not sent
    await client.rpush("gate", "go")
    assert list(await blocker) == [b"gate", b"go"]
    assert await asyncio.gather(*calls) == list(range(1, 51))
    assert await client.lrange("order", 0, -1) == [str(n).encode() for n in range(50)]
    assert len(set(await asyncio.gather(*ids))) == 1  # one connection carried them all
    await client.aclose()


@pytest.mark.anyio
async def test_a_lone_call_goes_at_once(client: Any) -> None:
    batches = CommandBatches(client, slots=1, shared_connection=False)
    assert await batches.execute("SET", "k", "v") is True
    assert await batches.execute("GET", "k") == b"v"
    await client.aclose()


@pytest.mark.anyio
async def test_an_error_fails_only_its_own_call(client: Any) -> None:
    batches = CommandBatches(client, slots=1, shared_connection=False)
    await client.set("text", "not a number")
    blocker = await _blocked(batches, client)
    before = asyncio.create_task(batches.execute("INCR", "n"))
    wrong = asyncio.create_task(batches.execute("INCR", "text"))
    after = asyncio.create_task(batches.execute("INCR", "n"))
    await client.rpush("gate", "go")
    await blocker
    assert await before == 1
    with pytest.raises(ResponseError):
        await wrong
    assert await after == 2
    await client.aclose()


@pytest.mark.anyio
async def test_a_cancelled_waiting_call_is_not_sent(client: Any) -> None:
    batches = CommandBatches(client, slots=1, shared_connection=False)
    blocker = await _blocked(batches, client)
    first = asyncio.create_task(batches.execute("INCR", "n"))
    cancelled = asyncio.create_task(batches.execute("INCR", "cancelled"))
    last = asyncio.create_task(batches.execute("INCR", "n"))
    await asyncio.sleep(0)
    cancelled.cancel()
    await client.rpush("gate", "go")
    await blocker
    assert (await first, await last) == (1, 2)
    assert cancelled.cancelled()
    assert await client.get("cancelled") is None
    await client.aclose()


@pytest.mark.anyio
async def test_a_broken_connection_fails_every_call_of_its_send(client: Any) -> None:
    batches = CommandBatches(client, slots=1, shared_connection=False)
    blocker = await _blocked(batches, client)
    calls = [asyncio.create_task(batches.execute("INCR", "n")) for _ in range(3)]
    # The pipeline's own connection is closed by Redis while it reads the replies.
    kill = ("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "no")
    killer = asyncio.create_task(batches.execute(*kill))
    after = [asyncio.create_task(batches.execute("INCR", "n")) for _ in range(2)]
    await client.rpush("gate", "go")
    outcomes = await asyncio.gather(blocker, *calls, killer, *after, return_exceptions=True)
    assert any(isinstance(outcome, RedisConnectionError) for outcome in outcomes)
    for outcome in outcomes[-2:]:
        assert isinstance(outcome, RedisConnectionError)  # sent with the killer, failed with it
    # The slot is free again: a new call goes (on a new connection).
    assert isinstance(await batches.execute("PING"), bool)
    await client.aclose()


@pytest.mark.anyio
async def test_many_tasks_tracking_at_once_share_a_few_connections(
    redis_or_cluster: RedisServer | RedisCluster,
) -> None:
    """128 tasks track at once: every event counts exactly, and the instance's scripts went
    over a handful of connections (one each, without pipelining)."""
    server = redis_or_cluster
    prepare(server, Customer("external", "c1"))  # type: ignore[arg-type]
    async with AsyncOutpost(
        redis_url=server.url, telemetry=False, shards=shards_of(server)
    ) as outpost:
        assert await consumed(outpost, COUNT, "c1") == 0

        async def one() -> None:
            await outpost.track("api_call", external_customer_id="c1")

        for _ in range(3):
            await asyncio.gather(*(one() for _ in range(128)))
        assert await consumed(outpost, COUNT, "c1") == 3 * 128
    _assert_few_connections(server, "384 tracks")


@pytest.mark.anyio
async def test_many_fresh_reads_and_loads_at_once_share_a_few_connections(
    redis_or_cluster: RedisServer | RedisCluster,
) -> None:
    """Reads that go to Redis are sent the same way: 300 fresh reads at once, then 300 first
    reads of customers nobody read before (one load each), neither opening a connection per
    read (redis-py's pool refuses a 101st: every read failed then)."""
    customers = [Customer("external", f"c{n}") for n in range(300)]
    server = redis_or_cluster
    prepare(server, *customers)  # type: ignore[arg-type]
    async with AsyncOutpost(
        redis_url=server.url, telemetry=False, shards=shards_of(server)
    ) as outpost:
        await outpost.track("api_call", external_customer_id="c0")

        async def fresh() -> float:
            return (await outpost.balance(COUNT, external_customer_id="c0", fresh=True)).consumed

        assert await asyncio.gather(*(fresh() for _ in range(300))) == [1.0] * 300
        firsts = [consumed(outpost, COUNT, customer.id) for customer in customers[1:]]
        assert await asyncio.gather(*firsts) == [0.0] * 299
    _assert_few_connections(server, "600 reads")


def _assert_few_connections(server: RedisServer | RedisCluster, what: str) -> None:
    """On one Redis, the connections it was asked for since it started (a cluster's client
    keeps a pool per node: what counts there is that nothing failed)."""
    if isinstance(server, RedisServer):
        opened = int(server.client().info("stats")["total_connections_received"])
        assert opened < 20, f"{opened} connections for {what}"


@pytest.mark.anyio
async def test_several_commands_of_one_call_go_together_in_order(client: Any) -> None:
    batches = CommandBatches(client, slots=1, shared_connection=False)
    await client.set("a", "1")
    assert await batches.execute_all(("GET", "a"), ("INCR", "a"), ("GET", "a")) == [
        b"1",
        2,
        b"2",
    ]
    blocker = await _blocked(batches, client)
    several = asyncio.create_task(batches.execute_all(("INCR", "a"), ("CLIENT", "ID")))
    alone = asyncio.create_task(batches.execute("CLIENT", "ID"))
    await client.rpush("gate", "go")
    await blocker
    (count, first), second = await several, await alone
    assert count == 3
    assert first == second  # waiting, they went in the same pipeline
    with pytest.raises(ResponseError):
        await batches.execute_all(("GET", "a"), ("HGETALL", "a"))  # a string is not a hash
    await client.aclose()


@pytest.mark.parametrize("protocol", [2, 3])
def test_the_sync_twin_reads_a_stream_unparsed_too(
    redis_server: RedisServer, protocol: int
) -> None:
    client = redis.Redis.from_url(redis_server.url, protocol=protocol)
    client.xgroup_create("s", "g", id="0", mkstream=True)
    for n in range(2):
        client.xadd("s", {"n": str(n)})
    read = ("XREADGROUP", "GROUP", "g", "c", "COUNT", 1, "STREAMS", "s", ">")
    batches = SyncCommandBatches(client)
    parsed, raw = batches.execute(*read), batches.execute(*read, parsed=False)
    assert isinstance(_fields_of_first(parsed), dict)  # redis-py's callback made a dict
    assert _fields_of_first(raw) == [b"n", b"1"]  # not here: as Redis sent them
    assert [dict(f) for _, _, f in stream_entries(parsed) + stream_entries(raw)] == [
        {b"n": b"0"},
        {b"n": b"1"},
    ]
    client.close()


def _fields_of_first(reply: Any) -> Any:
    """The fields of the first entry of a one-stream read, in any of its shapes."""
    listing = reply[b"s"] if isinstance(reply, dict) else reply[0][1]
    entry = listing[0][0] if isinstance(listing[0][0], tuple) else listing[0]
    return entry[1]


def _client_ids(client: Any) -> set[int]:
    return {int(c["id"]) for c in client.client_list()}


@pytest.mark.parametrize("protocol", [2, 3])
def test_the_sync_twin_runs_scripts_on_connections_of_its_own(
    redis_server: RedisServer, protocol: int
) -> None:
    client = redis.Redis.from_url(redis_server.url, protocol=protocol)
    sha = client.script_load("return {KEYS[1], ARGV[1], tonumber(ARGV[2]) + 1}")
    batches = SyncCommandBatches(client)
    assert batches.execute("EVALSHA", sha, 1, "k", "é", 41) == [b"k", "é".encode(), 42]
    assert len(batches._idle) == 1  # kept for the next script, out of redis-py's pool
    kept = batches._idle[0]
    with pytest.raises(NoScriptError):
        batches.execute("EVALSHA", "0" * 40, 0)
    assert batches._idle == [kept]  # Redis answered: the line is fine
    # The kept connection is killed: the script goes once more through redis-py.
    kept.send_command("CLIENT", "ID")
    own_id = int(kept.read_response())
    client.client_kill_filter(_id=str(own_id))
    assert batches.execute("EVAL", "return ARGV[1]", 0, "again") == b"again"
    assert own_id not in _client_ids(client)
    batches.close()
    assert batches._idle == []
    client.close()


@pytest.mark.parametrize("protocol", [2, 3])
def test_the_sync_twin_reads_a_hash_on_its_own_connections_as_redis_py_does(
    redis_server: RedisServer, protocol: int
) -> None:
    client = redis.Redis.from_url(redis_server.url, protocol=protocol)
    client.hset("h", mapping={"rev": "3", "a:0": "1 1 1 1", "é": ""})
    client.set("s", "not a hash")
    batches = SyncCommandBatches(client)
    assert batches.execute("HGETALL", "h") == client.hgetall("h")
    assert batches.execute("HGETALL", "none") == {} == client.hgetall("none")
    assert len(batches._idle) == 1  # read on a kept connection, out of redis-py's pool
    with pytest.raises(ResponseError):
        batches.execute("HGETALL", "s")  # a string is not a hash
    assert len(batches._idle) == 1  # Redis answered: the line is fine
    batches.close()
    client.close()


def test_the_sync_twin_gives_each_cluster_nodes_kept_connections_back_at_close(
    redis_cluster: RedisCluster,
) -> None:
    """On a cluster client the application passed in (it outlives the instance), the
    connections kept for scripts on each node go back to that node's pool at close()."""
    prepare(redis_cluster, *(Customer("external", f"c{n}") for n in range(32)))  # type: ignore[arg-type]
    client = redis.RedisCluster.from_url(redis_cluster.url.replace("redis+cluster", "redis"))
    with Outpost(redis=client, telemetry=False, shards=shards_of(redis_cluster)) as outpost:
        for n in range(32):  # customers on every node
            outpost.track("api_call", external_customer_id=f"c{n}")
        in_use = _in_use_per_node(client)
        assert sum(in_use.values()) > 0, in_use  # kept while the instance runs
    assert sum(_in_use_per_node(client).values()) == 0, _in_use_per_node(client)
    client.close()


def _in_use_per_node(client: redis.RedisCluster) -> dict[str, int]:
    return {
        node.name: len(node.redis_connection.connection_pool._in_use_connections)
        for node in client.get_nodes()  # type: ignore[no-untyped-call,unused-ignore]
        if node.redis_connection is not None
    }


_ADD = "return redis.call('XADD', KEYS[1], '*', 'n', ARGV[1])"
_READ = ("XREADGROUP", "GROUP", "g", "c", "COUNT", 10, "STREAMS", "s", ">")


def _names(entries: Any) -> list[bytes]:
    return [fields[b"n"] for _, _, fields in stream_entries(entries)]


@pytest.mark.parametrize("kept", [True, False], ids=["kept connection", "redis-py pipeline"])
@pytest.mark.parametrize("protocol", [2, 3])
def test_the_sync_twin_sends_a_read_and_scripts_behind_it_in_one_trip(
    redis_server: RedisServer, protocol: int, kept: bool
) -> None:
    client = redis.Redis.from_url(redis_server.url, protocol=protocol)
    client.xgroup_create("s", "g", id="0", mkstream=True)
    client.xadd("s", {"n": "0"})
    sha = client.script_load(_ADD)
    batches = SyncCommandBatches(client)
    if not kept:
        batches._pool = None  # as without hiredis
    missing = ("EVALSHA", "0" * 40, 0)
    scripts = [("EVALSHA", sha, 1, "s", "1"), missing, ("EVALSHA", sha, 1, "s", "2")]
    read, replies = batches.first_then_scripts(_READ, _names, scripts)
    assert read == [b"0"]  # read as Redis sent it, before the scripts added theirs
    assert isinstance(replies[0], bytes) and isinstance(replies[2], bytes)
    assert isinstance(replies[1], NoScriptError)  # its own error: the others ran
    assert _names(client.xreadgroup("g", "c", {"s": ">"})) == [b"1", b"2"]
    # A read Redis refuses (no such group) is its error; the scripts behind it still run.
    refused, replies = batches.first_then_scripts(
        ("XREADGROUP", "GROUP", "none", "c", "STREAMS", "s", ">"), _names, scripts[:1]
    )
    assert isinstance(refused, ResponseError) and isinstance(replies[0], bytes)
    assert len(batches._idle) == (1 if kept else 0)
    batches.close()
    client.close()


def test_the_sync_twin_gives_the_errors_of_a_lost_connection_for_a_read_and_its_scripts(
    redis_server: RedisServer,
) -> None:
    client = redis.Redis.from_url(redis_server.url)
    client.xgroup_create("s", "g", id="0", mkstream=True)
    batches = SyncCommandBatches(client)
    assert batches.execute("EVAL", "return 1", 0) == 1
    kept = batches._idle[0]
    kept.send_command("CLIENT", "ID")
    client.client_kill_filter(_id=str(kept.read_response()))
    read, replies = batches.first_then_scripts(_READ, _names, [("EVAL", "return 1", 0)])
    assert isinstance(read, RedisConnectionError)
    assert len(replies) == 1 and isinstance(replies[0], RedisConnectionError)
    assert batches._idle == []  # dropped, not kept
    client.close()


@pytest.mark.anyio
@pytest.mark.parametrize("shared", [True, False], ids=["shared connection", "redis-py"])
async def test_a_read_and_scripts_behind_it_go_together(client: Any, shared: bool) -> None:
    await client.xgroup_create("s", "g", id="0", mkstream=True)
    await client.xadd("s", {"n": "0"})
    sha = await client.script_load(_ADD)
    batches = CommandBatches(client, shared_connection=shared)
    # Without the shared connection the calls go at once on connections of their own, in no
    # promised order: the script writes another stream than the one read.
    scripts = [("EVALSHA", sha, 1, "t", "1"), ("EVALSHA", "0" * 40, 0)]
    read, replies = await batches.first_then_scripts(_READ, _names, scripts)
    assert read == [b"0"]  # made by _names from the reply as Redis sent it
    assert isinstance(replies[0], bytes) and isinstance(replies[1], NoScriptError)
    assert await client.xlen("t") == 1
    refused, _ = await batches.first_then_scripts(
        ("XREADGROUP", "GROUP", "none", "c", "STREAMS", "s", ">"), _names, ()
    )
    assert isinstance(refused, ResponseError)
    await batches.aclose()
    await client.aclose()
