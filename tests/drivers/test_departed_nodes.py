"""Closing the connections of cluster nodes that left the slot map, and only those: redis-py's
sync cluster client gives the new node object of an address the old one's client when it reads
the slot map again, so closing the old node's pool cut every call in flight to that address
(seen as "Bad file descriptor" and "'NoneType' object has no attribute 'sendall'")."""

from __future__ import annotations

import redis

from outpost_sync._departed import DepartedNodes
from tests.support.redis_cluster import RedisCluster


def test_a_slot_map_read_again_leaves_the_connections_in_use_open(
    redis_cluster: RedisCluster,
) -> None:
    client = redis.RedisCluster.from_url(redis_cluster.url.replace("redis+cluster", "redis"))
    departed = DepartedNodes()
    departed.sweep(client, 0.0)  # the nodes of the slot map now
    node = client.get_nodes()[0]  # type: ignore[no-untyped-call,unused-ignore]
    connection = node.redis_connection.connection_pool.get_connection()
    connection.send_command("PING")
    assert connection.read_response() in (b"PONG", "PONG", True)
    client.nodes_manager.initialize()  # new node objects, the same clients
    departed.sweep(client, 1.0)
    departed.close(client)
    assert connection._sock is not None, "a connection of a node still in the slot map closed"
    connection.send_command("PING")
    assert connection.read_response() in (b"PONG", "PONG", True)
    node.redis_connection.connection_pool.release(connection)
    client.close()
