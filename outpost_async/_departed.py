"""The nodes that left a cluster client's slot map, whose connections nobody else closes.

redis-py's cluster client drops a node that left its slot map (a killed primary) and closes what
it finds open then. A call that took the node before (from the slot map, or waiting for a turn at
``node_calls``) may still connect to it afterwards: a killed primary restarted as a replica
answers, with ``MOVED``. The client's ``aclose()`` closes only the nodes of its slot map now, so
those connections stayed open until the garbage collector found them. The topology loop sweeps
after each look at the slot map, and ``close()`` closes them all.
"""

from __future__ import annotations

import contextlib
from typing import Any

from redis.exceptions import RedisError

from outpost_async._backend import close_cluster_node, node_connections

KEPT = 60.0
"""Seconds a node is still swept after it left: a call that took it before is over by then."""


class DepartedNodes:
    def __init__(self) -> None:
        self._known: dict[int, Any] = {}
        """The nodes of the slot map at the last sweep, by identity (a node that comes back
        at the same address is another object, with connections of its own)."""
        self._departed: dict[int, tuple[Any, float]] = {}
        """Nodes that left, and when they were seen gone."""

    async def sweep(self, cluster: Any, now: float) -> None:
        """Close the connections of the nodes that left ``cluster``'s slot map, now and in the
        last ``KEPT`` seconds (a late call may have opened one since)."""
        self._note_departures(cluster, now)
        for key, (node, since) in list(self._departed.items()):
            await self._close_unless_shared(node)
            if now - since > KEPT:
                del self._departed[key]

    async def close(self, cluster: Any) -> None:
        """At ``close()``: the connections of every node that left, however long ago."""
        self._note_departures(cluster, 0.0)
        for node, _ in self._departed.values():
            await self._close_unless_shared(node)
        self._departed.clear()

    async def _close_unless_shared(self, node: Any) -> None:
        """Close what holds a departed node's connections, unless a node of the slot map holds
        them too (a slot map read again gives each address a new node with the same client:
        closing it would cut the calls in flight on every connection of that address)."""
        held = node_connections(node)
        if held is None or any(node_connections(n) is held for n in self._known.values()):
            return
        await _close(node)

    def _note_departures(self, cluster: Any, now: float) -> None:
        current = {id(node): node for node in cluster.nodes_manager.nodes_cache.values()}
        for key, node in self._known.items():
            if key not in current:
                self._departed[key] = (node, now)
        self._known = current


async def _close(node: Any) -> None:
    with contextlib.suppress(RedisError, OSError):
        await close_cluster_node(node)
