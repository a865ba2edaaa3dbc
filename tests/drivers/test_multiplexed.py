"""The async driver's shared connection (``MultiplexedConnection`` behind ``CommandBatches``):
the commands of every task on one connection, replies matched in order, and what happens when
that connection fails. Against real Redis servers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import pytest
import redis.asyncio
import trustme
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import DataError, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from outpost_async import _multiplexed
from outpost_async._backend import open_pubsub, read_pubsub
from outpost_async._batches import CommandBatches
from outpost_core._replies import stream_entries, text_of
from tests.support.redis_cluster import RedisReplica
from tests.support.redis_server import RedisServer, free_port
from tests.support.waiting import wait_until_async

SLOW = "local t = redis.call('TIME') repeat local n = redis.call('TIME') until (n[1] - t[1]) * 1e6 + n[2] - t[2] > 500000 return 1"  # noqa: E501 - busy for half a second


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[Any]:
    # No retries: a call that fails is seen failing.
    client = redis.asyncio.Redis.from_url(redis_server.url, retry=Retry(NoBackoff(), 0))
    yield client
    await client.aclose()


async def _answers(server: RedisServer) -> bool:
    try:
        return bool(await asyncio.to_thread(server.client().ping))
    except ResponseError:  # BUSY: still running a script
        return False


@pytest.mark.anyio
async def test_every_task_s_commands_share_one_connection_in_order(client: Any) -> None:
    batches = CommandBatches(client)
    pushes = [asyncio.create_task(batches.execute("RPUSH", "order", n)) for n in range(300)]
    ids = [asyncio.create_task(batches.execute("CLIENT", "ID")) for _ in range(20)]
    assert await asyncio.gather(*pushes) == list(range(1, 301))
    assert len(set(await asyncio.gather(*ids))) == 1
    assert await client.lrange("order", 0, -1) == [str(n).encode() for n in range(300)]
    await batches.aclose()


@pytest.mark.anyio
async def test_replies_are_read_as_redis_py_reads_them(client: Any) -> None:
    batches = CommandBatches(client)
    await client.hset("h", mapping={"a": "1", "b": "2"})
    assert await batches.execute("HGETALL", "h") == {b"a": b"1", b"b": b"2"}  # its callback
    assert await batches.execute("SET", "k", "v") is True
    assert await batches.execute("GET", "missing") is None
    assert await batches.execute_all(("HKEYS", "h"), ("GET", "k")) == [[b"a", b"b"], b"v"]
    await batches.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("options", [{"decode_responses": True}, {"protocol": 3}])
async def test_the_client_s_decoding_and_protocol_are_kept(
    redis_server: RedisServer, options: dict[str, Any]
) -> None:
    client = redis.asyncio.Redis.from_url(redis_server.url, **options)
    batches = CommandBatches(client)
    await client.hset("h", mapping={"a": "1"})
    expected = await client.hgetall("h")
    assert await batches.execute("HGETALL", "h") == expected
    assert await batches.execute("EVAL", "return {1, 'x'}", 0) == await client.eval(
        "return {1, 'x'}", 0
    )
    await batches.aclose()
    await client.aclose()


@pytest.mark.anyio
async def test_an_error_reply_fails_only_its_own_call(client: Any) -> None:
    batches = CommandBatches(client)
    await client.set("text", "not a number")
    calls = [batches.execute("INCR", "n"), batches.execute("INCR", "text")]
    before, wrong, after = await asyncio.gather(
        *calls, batches.execute("INCR", "n"), return_exceptions=True
    )
    assert (before, after) == (1, 2)
    assert isinstance(wrong, ResponseError)
    with pytest.raises(ResponseError):
        await batches.execute_all(("INCR", "n"), ("INCR", "text"))
    assert await client.get("n") == b"3"  # the other command of the call ran
    await batches.aclose()


@pytest.mark.anyio
async def test_a_call_cancelled_once_sent_leaves_the_replies_in_step(client: Any) -> None:
    batches = CommandBatches(client)
    await batches.execute("PING")
    first = asyncio.create_task(batches.execute("INCR", "n"))
    cancelled = asyncio.create_task(batches.execute("EVAL", SLOW, 0))
    last = asyncio.create_task(batches.execute("GET", "n"))
    await asyncio.sleep(0)  # each task has sent its command
    cancelled.cancel()
    assert (await first, await last) == (1, b"1")  # not the cancelled call's reply
    assert cancelled.cancelled()
    assert await batches.execute("INCR", "n") == 2
    await batches.aclose()


@pytest.mark.anyio
async def test_commands_a_killed_connection_lost_run_again_through_redis_py(
    client: Any, redis_server: RedisServer
) -> None:
    batches = CommandBatches(client)
    line = await batches.execute("CLIENT", "ID")
    calls = [batches.execute("INCR", "n") for _ in range(3)]
    # Redis closes the connection after this reply and runs nothing sent after it on it.
    kill = batches.execute("CLIENT", "KILL", "ID", line, "SKIPME", "no")
    after = [batches.execute("INCR", "n") for _ in range(2)]
    outcomes = await asyncio.gather(*calls, kill, *after, return_exceptions=True)
    assert outcomes[:3] == [1, 2, 3]
    assert sorted(cast(list[int], outcomes[4:])) == [4, 5]  # run once each, on another connection
    assert await client.get("n") == b"5"
    again = await batches.execute("CLIENT", "ID")
    assert again != line  # a new shared connection
    assert await batches.execute("INCR", "n") == 6
    await batches.aclose()


@pytest.mark.anyio
async def test_redis_down_then_back(client: Any, redis_server: RedisServer) -> None:
    batches = CommandBatches(client)
    assert await batches.execute("INCR", "n") == 1
    redis_server.restart()  # not durable: it comes back empty
    outcomes = await asyncio.gather(
        *(batches.execute("INCR", "n") for _ in range(5)), return_exceptions=True
    )
    # The shared connection died with the server; each call ran again through redis-py on a
    # new connection to the restarted server (at once: in no particular order).
    assert sorted(cast(list[int], outcomes)) == [1, 2, 3, 4, 5]
    redis_server.stop()
    with pytest.raises(redis.exceptions.ConnectionError):
        await batches.execute("INCR", "n")
    redis_server.start()
    assert await batches.execute("INCR", "n") == 1
    await batches.aclose()


@pytest.mark.anyio
async def test_a_reply_later_than_the_socket_timeout_fails_the_call(
    redis_server: RedisServer,
) -> None:
    client = redis.asyncio.Redis.from_url(
        redis_server.url, socket_timeout=0.3, retry=Retry(NoBackoff(), 0)
    )
    batches = CommandBatches(client)
    line = await batches.execute("CLIENT", "ID")
    with pytest.raises(RedisTimeoutError):
        await batches.execute("EVAL", SLOW, 0)  # times out here, then once in redis-py
    await wait_until_async(lambda: _answers(redis_server), "Redis done with the slow scripts")
    assert await batches.execute("CLIENT", "ID") != line  # the shared connection was replaced
    assert await batches.execute("INCR", "n") == 1
    await batches.aclose()
    await client.aclose()


@pytest.mark.anyio
async def test_without_a_socket_timeout_a_stalled_connection_is_given_up(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_multiplexed, "STALLED_AFTER", 0.1)
    client = redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=None)
    batches = CommandBatches(client)
    line = await batches.execute("CLIENT", "ID")
    # The line gives up after 0.1 s; redis-py, with no timeout, then waits for Redis's answer.
    assert await batches.execute("EVAL", SLOW, 0) == 1
    assert await batches.execute("CLIENT", "ID") != line
    await batches.aclose()
    await client.aclose()


@pytest.mark.anyio
async def test_a_read_only_replica_s_refusal_is_redis_py_s(redis_replica: RedisReplica) -> None:
    client = redis.asyncio.Redis.from_url(redis_replica.url, retry=Retry(NoBackoff(), 0))
    batches = CommandBatches(client)
    with pytest.raises(ReadOnlyError):
        await batches.execute("INCR", "n")
    assert await batches.execute("GET", "n") is None
    await batches.aclose()
    await client.aclose()


@pytest.mark.anyio
async def test_closing_gives_the_connection_back(client: Any) -> None:
    batches = CommandBatches(client)
    line = str(await batches.execute("CLIENT", "ID"))
    assert line in await _client_ids(client)
    await batches.aclose()
    await wait_until_async(lambda: _gone(client, line), "the shared connection closed")
    assert await batches.execute("PING") is True  # through redis-py from now on
    assert line not in await _client_ids(client)


async def _client_ids(client: Any) -> list[str]:
    return [entry["id"] for entry in await client.client_list()]


async def _gone(client: Any, line: str) -> bool:
    return line not in await _client_ids(client)


@pytest.mark.anyio
async def test_arguments_are_sent_as_redis_py_sends_them(client: Any) -> None:
    batches = CommandBatches(client)
    with pytest.raises(DataError):  # redis-py's refusal; nothing was sent
        await batches.execute("SET", "k", None)
    assert await batches.execute("SET", "k", 0.1) is True  # repr(), as redis-py writes a float
    assert await batches.execute("GET", "k") == b"0.1"
    assert await batches.execute("SET", "k", "é") is True
    assert await batches.execute("GET", "k") == "é".encode()
    assert await batches.execute("SET", "k", b"\xff") is True
    assert await batches.execute("GET", "k") == b"\xff"
    await batches.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("protocol", [2, 3])
async def test_an_unparsed_stream_read_gives_the_entries_redis_py_s_would(
    redis_server: RedisServer, protocol: int
) -> None:
    client = redis.asyncio.Redis.from_url(redis_server.url, protocol=protocol)
    batches = CommandBatches(client)
    for stream in ("s1", "s2"):
        for group in ("raw", "parsed"):
            await client.xgroup_create(stream, group, id="0", mkstream=True)
        for n in range(3):
            await client.xadd(stream, {"n": str(n)})

    def read(group: str) -> tuple[Any, ...]:
        return ("XREADGROUP", "GROUP", group, "c", "COUNT", 2, "STREAMS", "s1", "s2", ">", ">")

    raw = await batches.execute(*read("raw"), parsed=False)
    parsed = await client.execute_command(*read("parsed"))  # type: ignore[no-untyped-call]
    assert raw != parsed  # redis-py's callback was skipped, and the entries are the same:
    entries = [
        [(text_of(stream), text_of(entry), dict(fields)) for stream, entry, fields in listing]
        for listing in (stream_entries(raw), stream_entries(parsed))
    ]
    assert entries[0] == entries[1]
    assert [(stream, fields) for stream, _, fields in entries[0]] == [
        ("s1", {b"n": b"0"}),
        ("s1", {b"n": b"1"}),
        ("s2", {b"n": b"0"}),
        ("s2", {b"n": b"1"}),
    ]
    await batches.aclose()
    await client.aclose()


class _TlsRedisServer(RedisServer):
    """A redis-server that also listens with TLS (``tls_port``), its certificate from ``ca``."""

    def __init__(self) -> None:
        super().__init__()
        self.tls_port = free_port()
        self.ca = trustme.CA()
        self.ca.cert_pem.write_to_path(str(self.directory / "ca.pem"))
        server_cert = self.ca.issue_cert("127.0.0.1")
        server_cert.private_key_pem.write_to_path(str(self.directory / "key.pem"))
        server_cert.cert_chain_pems[0].write_to_path(str(self.directory / "cert.pem"))

    def extra_args(self) -> list[str]:
        files = self.directory
        return [
            "--tls-port", str(self.tls_port),
            "--tls-cert-file", str(files / "cert.pem"),
            "--tls-key-file", str(files / "key.pem"),
            "--tls-ca-cert-file", str(files / "ca.pem"),
            "--tls-auth-clients", "no",
        ]  # fmt: skip


@pytest.fixture
def tls_redis_server() -> Iterator[_TlsRedisServer]:
    server = _TlsRedisServer()
    server.start()
    yield server
    server.close()


@pytest.mark.anyio
async def test_the_shared_connection_and_the_subscription_work_over_tls(
    tls_redis_server: _TlsRedisServer,
) -> None:
    server = tls_redis_server
    client = redis.asyncio.Redis(
        host="127.0.0.1",
        port=server.tls_port,
        ssl=True,
        ssl_ca_certs=str(server.directory / "ca.pem"),
    )
    batches = CommandBatches(client)
    pubsub = open_pubsub(client)
    await pubsub.ssubscribe("news")
    assert [reply[0] for reply in await read_pubsub(pubsub, 5.0)] == [b"ssubscribe"]
    line = await batches.execute("CLIENT", "ID")
    assert await asyncio.gather(*(batches.execute("INCR", "n") for _ in range(50))) == list(
        range(1, 51)
    )
    await batches.execute("SPUBLISH", "news", "hello")
    assert await read_pubsub(pubsub, 5.0) == [[b"smessage", b"news", b"hello"]]
    await client.client_kill_filter(_id=line)
    assert await batches.execute("INCR", "n") == 51  # again through redis-py, then a new line
    assert await batches.execute("CLIENT", "ID") != line
    await pubsub.aclose()
    await batches.aclose()
    await client.aclose()
