"""Replicas and Redis Clusters of real redis-server processes for the tests and the benchmarks:
fail-overs, killed primaries and slot migrations, built on the shipped single-server launcher."""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import redis
from redis.crc import key_slot

from outpost_core import DEFAULT_SHARDS, SHARDS_KEY, Customer
from outpost_core import _keys as keys
from outpost_emulator.redis_server import REDIS_SERVER, RedisServer


def free_cluster_port() -> int:
    """A free port whose cluster bus port (10000 above) is free too, both below Linux's
    ephemeral range, so outgoing connections do not take them meanwhile. Client ports come from
    10000-16383 and bus ports so from 20000-26383: one node's bus port is never another's client
    port."""
    rng = random.Random()
    while True:
        port = rng.randrange(10000, 16384)
        if _bindable(port) and _bindable(port + 10000):
            return port


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class RedisReplica(RedisServer):
    """A replica of one :class:`RedisServer` (``--replicaof``), for ``durability="replica"``."""

    def __init__(self, primary: RedisServer) -> None:
        super().__init__(binary=primary.binary)
        self.primary = primary

    def extra_args(self) -> list[str]:
        return ["--replicaof", "127.0.0.1", str(self.primary.port)]

    def start(self) -> None:
        # The primary's first full sync would wait 5 s for more replicas to share it.
        client = redis.Redis(port=self.primary.port, socket_timeout=2)
        try:
            client.config_set("repl-diskless-sync-delay", 0)
        finally:
            client.close()
        super().start()

    def wait_in_sync(self, timeout: float = 10) -> None:
        """Until the primary counts this replica as online (``WAIT`` counts it from then on)."""
        deadline = time.monotonic() + timeout
        client = redis.Redis(port=self.primary.port, socket_timeout=2, decode_responses=True)
        try:
            while not _online(client.info("replication").get("slave0")):
                if time.monotonic() > deadline:
                    raise RuntimeError("the replica did not come in sync")
                time.sleep(0.02)
        finally:
            client.close()


def _online(replica: object) -> bool:
    """INFO's ``slave0`` line, which redis-py parses into a dict."""
    return isinstance(replica, dict) and replica.get("state") == "online"


_FAILOVER_RETRY = 6.0  # seconds: past Redis's own 5 s limit on a manual fail-over


class RedisCluster:
    """A Redis Cluster of real redis-server processes: ``primaries`` primaries, each with
    ``replicas`` replicas, on free loopback ports, each in its own temporary directory.
    ``node_timeout_ms`` is how long a node may go unheard before its replica takes over: short
    for a test that kills a primary (a fail-over in a second or two), long for a cluster that no
    test kills, so that a loaded machine, whose nodes answer late, never fails one over."""

    NODE_TIMEOUT_MS = 1000

    def __init__(
        self,
        *,
        primaries: int = 3,
        replicas: int = 1,
        binary: str | None = None,
        node_timeout_ms: int = NODE_TIMEOUT_MS,
        shards: int = DEFAULT_SHARDS,
    ) -> None:
        self.shards = shards
        """The deployment's shard count the tests configure their instances with (``make``,
        ``connect``); stored in the cluster as an operator would, when not the default."""
        self.binary = binary or REDIS_SERVER
        if self.binary is None:
            raise RuntimeError("redis-server is not on PATH; see the README for how to get Redis")
        self.cli = shutil.which("redis-cli")
        if self.cli is None:
            raise RuntimeError("redis-cli is not on PATH; see the README for how to get Redis")
        self.replicas = replicas
        self.nodes = [
            _ClusterNode(self.binary, node_timeout_ms) for _ in range(primaries * (1 + replicas))
        ]
        self._clients: list[redis.RedisCluster] = []

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        """The URL the drivers take for a cluster (any node is a start-up node)."""
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def client(self) -> redis.RedisCluster:
        """A cluster client, closed with the cluster."""
        client = redis.RedisCluster(host="127.0.0.1", port=self.live_ports()[0], socket_timeout=10)
        self._clients.append(client)
        return client

    def node_client(self, port: int) -> redis.Redis:
        """A plain client to one node (closed with the cluster)."""
        client = redis.Redis(port=port, socket_timeout=10)
        self._clients.append(client)  # type: ignore[arg-type]  # closed the same way
        return client

    def live_ports(self) -> list[int]:
        return [node.port for node in self.nodes if node.running]

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        assert self.cli is not None
        create = [self.cli, "--cluster", "create"]
        create += [f"127.0.0.1:{port}" for port in self.ports]
        create += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
        done = subprocess.run(create, capture_output=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout[-2000:]!r}")
        self.wait_healthy()
        self.store_shards()

    def store_shards(self) -> None:
        """Store the deployment's shard count, as ``outpost shards set`` does (after a flush)."""
        if self.shards == DEFAULT_SHARDS:
            return  # the first instance stores it
        client = redis.RedisCluster(host="127.0.0.1", port=self.live_ports()[0], socket_timeout=10)
        try:
            client.set(SHARDS_KEY, str(self.shards))
        finally:
            client.close()

    def wait_healthy(self, timeout: float = 30) -> None:
        """Until every live node reports ``cluster_state:ok`` and every slot is served by a live
        primary that every live node agrees on (after a start, a kill or a migration)."""
        deadline = time.monotonic() + timeout
        while not self._healthy():
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not become healthy")
            time.sleep(0.05)

    def _healthy(self) -> bool:
        views = []
        for port in self.live_ports():
            client = redis.Redis(port=port, socket_timeout=2, decode_responses=True)
            try:
                if client.cluster("info")["cluster_state"] != "ok":
                    return False
                replication = client.info("replication")
                if replication["role"] != "master" and replication["master_link_status"] != "up":
                    return False  # a replica still syncing: WAIT would not count it
                views.append(sorted(_slot_owners(client)))
            except redis.RedisError:
                return False
            finally:
                client.close()
        live = {f"127.0.0.1:{port}" for port in self.live_ports()}
        first = views[0] if views else []
        covered = sum(end - start + 1 for start, end, _ in first)
        return (
            covered == 16384
            and all(view == first for view in views)
            and all(owner in live for _, _, owner in first)
        )

    def primary_ports(self) -> list[int]:
        """The ports of the primaries serving slots now, as a live node sees them."""
        client = redis.Redis(port=self.live_ports()[0], socket_timeout=2, decode_responses=True)
        try:
            owners = {owner for _, _, owner in _slot_owners(client)}
        finally:
            client.close()
        return sorted(int(owner.rsplit(":", 1)[1]) for owner in owners)

    def port_for_slot(self, slot: int) -> int:
        client = redis.Redis(port=self.live_ports()[0], socket_timeout=2, decode_responses=True)
        try:
            for start, end, owner in _slot_owners(client):
                if start <= slot <= end:
                    return int(owner.rsplit(":", 1)[1])
        finally:
            client.close()
        raise LookupError(slot)

    def slot_of(self, customer: Customer) -> int:
        """The slot of the customer's keys in this deployment (its ``shards``)."""
        return key_slot(keys.tag_of(keys.shard_of(customer, self.shards)).encode())

    def port_of(self, customer: Customer) -> int:
        """The port of the primary that serves the customer's keys now."""
        return self.port_for_slot(self.slot_of(customer))

    def node(self, port: int) -> _ClusterNode:
        return next(node for node in self.nodes if node.port == port)

    def kill(self, port: int) -> None:
        """SIGKILL one node; its replica takes over after ``cluster-node-timeout``."""
        self.node(port).kill()

    def stop(self, port: int) -> None:
        self.node(port).stop()

    def fail_over(self, primary: int, timeout: float = 30) -> int:
        """A manual fail-over (``CLUSTER FAILOVER`` on a replica of ``primary``): the replica
        takes over once it holds every write, and the primary becomes its replica; clients get
        ``MOVED``, no error. Returns the new primary's port once every node agrees."""
        client = redis.Redis(port=primary, socket_timeout=2, decode_responses=True)
        try:
            replica = int(client.info("replication")["slave0"]["port"])
        finally:
            client.close()
        deadline = time.monotonic() + timeout
        asked_at = -_FAILOVER_RETRY
        while replica not in self.primary_ports() or primary in self.primary_ports():
            now = time.monotonic()
            if now > deadline:
                raise RuntimeError(f"{replica} did not take over from {primary}")
            if now - asked_at >= _FAILOVER_RETRY:
                # Redis gives a manual fail-over up silently when it does not complete within
                # 5 s (the primaries' votes late on a busy machine): ask again.
                self._cluster(replica, "FAILOVER")
                asked_at = now
            time.sleep(0.05)
        self.wait_healthy(timeout)
        return replica

    def restart(self, port: int) -> None:
        """Starts a stopped or killed node again (it rejoins with its nodes.conf)."""
        self.node(port).start()

    def node_id(self, port: int) -> str:
        client = redis.Redis(port=port, socket_timeout=2, decode_responses=True)
        try:
            return str(client.execute_command("CLUSTER", "MYID"))  # type: ignore[no-untyped-call]
        finally:
            client.close()

    def begin_migration(self, slot: int, to_port: int) -> None:
        """Marks ``slot`` as leaving its primary for ``to_port`` (``CLUSTER SETSLOT ... MIGRATING``
        and ``IMPORTING``): its keys are still served by the source, new keys go to the target."""
        source = self.port_for_slot(slot)
        self._cluster(to_port, "SETSLOT", slot, "IMPORTING", self.node_id(source))
        self._cluster(source, "SETSLOT", slot, "MIGRATING", self.node_id(to_port))

    def move_keys(self, slot: int, to_port: int) -> None:
        """``MIGRATE`` every key of ``slot`` to the target: the source answers ``ASK`` for them."""
        source = self.port_for_slot(slot)
        client = redis.Redis(port=source, socket_timeout=10)
        try:
            while keys := client.execute_command(  # type: ignore[no-untyped-call]
                "CLUSTER", "GETKEYSINSLOT", slot, 100
            ):
                client.execute_command(  # type: ignore[no-untyped-call]
                    "MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "KEYS", *keys
                )
        finally:
            client.close()

    def end_migration(self, slot: int, to_port: int) -> None:
        """Gives ``slot`` to the target (``CLUSTER SETSLOT ... NODE`` on the target, the source,
        then every other primary), and waits until every node agrees."""
        target = self.node_id(to_port)
        source = self.port_for_slot(slot)
        self._cluster(to_port, "SETSLOT", slot, "NODE", target)
        self._cluster(source, "SETSLOT", slot, "NODE", target)
        for port in self.primary_ports():
            if port not in (to_port, source):
                self._cluster(port, "SETSLOT", slot, "NODE", target)
        self.wait_healthy()

    def migrate_slot(self, slot: int, to_port: int) -> None:
        """Moves ``slot`` and its keys to the primary on ``to_port``, as ``redis-cli --cluster
        reshard`` does for each slot it moves."""
        self.begin_migration(slot, to_port)
        self.move_keys(slot, to_port)
        self.end_migration(slot, to_port)

    def _cluster(self, port: int, *args: object) -> None:
        client = redis.Redis(port=port, socket_timeout=10)
        try:
            client.execute_command("CLUSTER", *args)  # type: ignore[no-untyped-call]
        finally:
            client.close()

    def flush(self) -> None:
        """Empties every primary (between tests sharing one cluster)."""
        for port in self.primary_ports():
            client = redis.Redis(port=port, socket_timeout=10)
            try:
                client.flushall()
                client.script_flush()
            finally:
                client.close()

    def close(self) -> None:
        """Kill every node, then remove its files: a shut-down primary would first wait for its
        replicas (a second or more per cluster), and nothing a node holds is read again."""
        for client in self._clients:
            client.close()
        for node in self.nodes:
            node.kill()
            node.close()


def _slot_owners(client: redis.Redis) -> list[tuple[int, int, str]]:
    """(first slot, last slot, "host:port" of its primary) for every served slot range."""
    out = []
    for entry in client.execute_command("CLUSTER", "SLOTS"):  # type: ignore[no-untyped-call]
        start, end, primary = entry[0], entry[1], entry[2]
        host = primary[0].decode() if isinstance(primary[0], bytes) else primary[0]
        out.append((int(start), int(end), f"{host}:{int(primary[1])}"))
    return out


class _ClusterNode(RedisServer):
    """One cluster-enabled redis-server; its nodes.conf lives in its temporary directory, so a
    restarted node rejoins the cluster it was part of."""

    def __init__(self, binary: str, node_timeout_ms: int) -> None:
        super().__init__(binary=binary, port=free_cluster_port())
        self.node_timeout_ms = node_timeout_ms
        self._joined = False

    def start(self) -> None:
        """Start it. Its first start picks its port just before (the cluster's other nodes
        started meanwhile) and gives up a port another process took between the pick and the
        bind (other test workers start clusters too) for a new one; once started, the node
        keeps its port, which the cluster knows it by."""
        for attempt in range(3):
            if not self._joined:
                self.port = free_cluster_port()
            try:
                super().start()
            except RuntimeError as error:
                if self._joined or "Address already in use" not in str(error) or attempt == 2:
                    raise
            else:
                self._joined = True
                return

    @property
    def running(self) -> bool:
        return self._process is not None

    def extra_args(self) -> list[str]:
        return [
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(self.directory / "nodes.conf"),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            # A replica whose primary was down a while still takes over: the tests kill on purpose.
            "--cluster-replica-validity-factor", "0",
            # A killed primary restarted as a replica syncs at once, not 5 s later.
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip


@contextlib.contextmanager
def cluster_running(*, primaries: int = 3, replicas: int = 1) -> Iterator[RedisCluster]:
    cluster = RedisCluster(primaries=primaries, replicas=replicas)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
