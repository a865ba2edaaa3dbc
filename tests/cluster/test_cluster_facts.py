"""What Outpost relies on from Redis Cluster, checked on a real 4-primary + 4-replica cluster of
this machine's redis-server (docs/redis-layout.md, "Redis Cluster", states the same)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis
from redis.crc import key_slot
from redis.exceptions import RedisClusterException

from tests.support.redis_cluster import RedisCluster

SCRIPT = "redis.call('INCR', KEYS[1]); return redis.call('INCR', KEYS[2])"


def wait_for(condition: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_cluster_has_four_primaries_serving_every_slot(redis_cluster: RedisCluster) -> None:
    assert len(redis_cluster.primary_ports()) == 4
    client = redis_cluster.client()
    assert client.cluster_info()["cluster_state"] == "ok"


@pytest.mark.parametrize("shards", [16, 64])
def test_the_shard_tags_spread_over_every_primary(redis_cluster: RedisCluster, shards: int) -> None:
    owners = {redis_cluster.port_for_slot(key_slot(f"{{{s}}}".encode())) for s in range(shards)}
    assert owners == set(redis_cluster.primary_ports())


def test_64_shard_tags_are_64_slots_and_load_four_primaries_evenly_enough(
    redis_cluster: RedisCluster,
) -> None:
    slots = [key_slot(f"{{{shard}}}".encode()) for shard in range(64)]
    assert len(set(slots)) == 64  # no two shards share a slot: 64 can move apart
    per_primary: dict[int, int] = {}
    for slot in slots:
        port = redis_cluster.port_for_slot(slot)
        per_primary[port] = per_primary.get(port, 0) + 1
    assert min(per_primary.values()) >= 8  # of 16 on average


def test_a_script_runs_when_its_keys_share_a_slot_and_is_refused_across_slots(
    redis_cluster: RedisCluster,
) -> None:
    client = redis_cluster.client()
    script = client.register_script(SCRIPT)
    assert script(keys=["outpost:test:{3}:a", "outpost:test:{3}:b"]) == 1
    across = ["outpost:test:{3}:a", "outpost:test:{4}:b"]
    with pytest.raises(RedisClusterException, match="same key slot"):  # redis-py refuses first
        script(keys=across)
    node = redis_cluster.node_client(redis_cluster.port_for_slot(key_slot(across[0].encode())))
    with pytest.raises(redis.ResponseError, match="same slot"):  # and so does the node
        node.eval(SCRIPT, 2, *across)


DERIVED = """
redis.call('HSET', KEYS[1] .. ':ev:300000000', 'f', 'v')
return redis.call('HGET', KEYS[1] .. ':ev:300000000', 'f')
"""


def test_a_script_touches_undeclared_keys_of_its_slot_but_no_other(
    redis_cluster: RedisCluster,
) -> None:
    """Layout v2's scripts derive an identity's bucket hashes from its state key (lua/lib.lua):
    a script without a shebang may, on the node owning the slot; a key of another slot it may
    not touch, declared or not."""
    state = "outpost:test:{3}:external:c1:r1"
    client = redis_cluster.client()
    assert client.register_script(DERIVED)(keys=[state]) == b"v"
    assert client.hget(f"{state}:ev:300000000", "f") == b"v"
    node = redis_cluster.node_client(redis_cluster.port_for_slot(key_slot(state.encode())))
    other = "outpost:test:{4}:x"
    assert key_slot(other.encode()) != key_slot(state.encode())
    with pytest.raises(redis.ResponseError, match=r"slot|non local"):
        node.eval("return redis.call('GET', ARGV[1])", 1, state, other)


def test_multi_stream_xreadgroup_across_slots_is_refused(redis_cluster: RedisCluster) -> None:
    streams = ["outpost:test:{0}:outbox", "outpost:test:{1}:outbox"]
    assert key_slot(streams[0].encode()) != key_slot(streams[1].encode())
    client = redis_cluster.client()
    for stream in streams:
        client.xgroup_create(stream, "g", id="0", mkstream=True)
    node = redis_cluster.node_client(redis_cluster.port_for_slot(key_slot(streams[0].encode())))
    with pytest.raises(redis.ResponseError, match="same slot"):
        node.xreadgroup("g", "c", {stream: ">" for stream in streams})


def test_a_sharded_message_reaches_a_subscriber_on_the_owning_node(
    redis_cluster: RedisCluster,
) -> None:
    channel = "outpost:test:{5}:changes"
    owner = redis_cluster.node_client(redis_cluster.port_for_slot(key_slot(channel.encode())))
    pubsub = owner.pubsub()  # type: ignore[no-untyped-call,unused-ignore]
    pubsub.ssubscribe(channel)
    assert pubsub.get_sharded_message(timeout=5)["type"] == "ssubscribe"
    redis_cluster.client().spublish(channel, "hello")
    message = pubsub.get_sharded_message(timeout=5)
    assert message is not None and message["data"] == b"hello"
    pubsub.close()


def test_a_primary_with_a_replica_acknowledges_wait(redis_cluster: RedisCluster) -> None:
    key = "outpost:test:{7}:k"
    node = redis_cluster.node_client(redis_cluster.port_for_slot(key_slot(key.encode())))
    node.set(key, "1")
    assert node.execute_command("WAIT", 1, 2000) >= 1  # type: ignore[no-untyped-call]


def test_after_a_fail_over_the_promoted_replica_has_the_data_but_no_scripts(
    cluster: RedisCluster,
) -> None:
    key = "outpost:test:{2}:k"
    slot = key_slot(key.encode())
    old = cluster.port_for_slot(slot)
    node = cluster.node_client(old)
    sha = node.script_load(SCRIPT)
    node.evalsha(sha, 2, key, "outpost:test:{2}:other")
    assert node.execute_command("WAIT", 1, 2000) >= 1  # type: ignore[no-untyped-call]
    subscriber = node.pubsub()  # type: ignore[no-untyped-call,unused-ignore]
    subscriber.ssubscribe("outpost:test:{2}:changes")
    assert subscriber.get_sharded_message(timeout=5) is not None

    cluster.kill(old)
    cluster.wait_healthy()
    new = cluster.port_for_slot(slot)
    assert new != old
    promoted = cluster.node_client(new)
    assert promoted.get(key) == b"1"
    assert promoted.script_exists(sha) == [False]
    with pytest.raises(redis.ConnectionError):  # a subscriber does not follow the fail-over
        subscriber.get_sharded_message(timeout=1)
    subscriber.close()
    cluster.restart(old)  # the old primary comes back as a replica
    cluster.wait_healthy()
    assert cluster.port_for_slot(slot) == new
