"""Customer identities and the Redis key layout, version 2 (docs/redis-layout.md).

Every key of one customer carries the same hash tag, ``{<shard>}``, so one script can touch all of a
customer's reducers and its outbox stream, and the layout works on Redis Cluster unchanged. The
shard (CRC-32 of the identity, modulo the deployment's shard count) rather than the customer itself
is the tag so that the outbox is one stream per shard that every instance can read, instead of one
stream per customer. The count is the deployment's, chosen once and stored in Redis
(:data:`SHARDS_KEY`, ``_shards.py``); 16 unless the operator chose another.

External ids are arbitrary strings. They are percent-encoded where they could break the layout
(``%``, ``:``, ``{``, ``}``, whitespace and unprintable characters) and kept as they are otherwise,
so keys stay readable and no two ids share a key.
"""

from __future__ import annotations

import functools
import zlib
from typing import Literal

import attrs

VERSION = 2
PREFIX = f"outpost:v{VERSION}:"
DEFAULT_SHARDS = 16
"""The shard count of a deployment that never chose one (every deployment before it could)."""
MAX_SHARDS = 1024
"""The most shards a deployment may have: every loop reads, surveys and subscribes to each."""
_TAGS = tuple(f"{PREFIX}{{{shard}}}:" for shard in range(MAX_SHARDS))  # built once: every track()
CONFIGURATION_KEY = f"{PREFIX}configuration"

CustomerKind = Literal["external", "customer"]


@attrs.frozen(slots=True)
class Customer:
    """A customer identity as the merchant names it: by external id or by Polar customer id."""

    kind: CustomerKind
    id: str

    @property
    def tag(self) -> str:
        """``external:<id>`` (the merchant's id) or ``customer:<id>`` (Polar's id)."""
        return f"{self.kind}:{self.id}"

    def wire(self) -> dict[str, str]:
        """The identity field of Polar's API: ``external_customer_id`` or ``customer_id``."""
        field = "external_customer_id" if self.kind == "external" else "customer_id"
        return {field: self.id}

    def __str__(self) -> str:
        return self.tag


def encode_component(text: str) -> str:
    """Percent-encode what could break a key; everything else stays readable."""
    out: list[str] = []
    for char in text:
        if char in "%:{}" or char.isspace() or not char.isprintable():
            out.extend(f"%{byte:02X}" for byte in char.encode("utf-8"))
        else:
            out.append(char)
    return "".join(out)


# Keys are built on every track(): cache the hot customers, as many as a process follows by
# default (a bigger cache would hold more memory than the copies themselves).
@functools.lru_cache(maxsize=16384)
def _shard(kind: str, id: str, shards: int) -> int:
    return zlib.crc32(f"{kind}:{id}".encode()) % shards


def shard_of(customer: Customer, shards: int = DEFAULT_SHARDS) -> int:
    """The customer's shard among the deployment's ``shards``."""
    return _shard(customer.kind, customer.id, shards)


def tag_of(shard: int) -> str:
    """The hash tag of a shard (0 .. MAX_SHARDS - 1): the same for every count that has it."""
    return _TAGS[shard]


def customer_prefix(customer: Customer, shards: int = DEFAULT_SHARDS) -> str:
    return f"{tag_of(shard_of(customer, shards))}{customer.kind}:{encode_component(customer.id)}"


@functools.lru_cache(maxsize=16384)
def state_key(customer: Customer, reducer_id: str, shards: int = DEFAULT_SHARDS) -> str:
    """The hash of one identity: revision, Polar's totals, ``cold_until``, local aggregates."""
    return f"{customer_prefix(customer, shards)}:{encode_component(reducer_id)}"


def bucket_key(state: str, bucket: int | str) -> str:
    """The hash of the identity's pending events of one bucket (its start, µs), beside its state
    hash (same hash tag). The state hash's ``a:<bucket>`` fields say which buckets hold some."""
    return f"{state}:ev:{bucket}"


def acked_key(state: str) -> str:
    """The sorted set of the identity's acknowledged pending events (member: the events field,
    score: when Polar acknowledged it, µs)."""
    return f"{state}:acked"


def channel(shard: int, namespace: str = "") -> str:
    """The sharded pub/sub channel every change of the shard's identities is published on.

    Pub/sub ignores Redis's numbered databases, so instances on database N > 0 of a server use
    the namespace ``dbN``: deployments on different databases never hear each other's changes.
    """
    suffix = f":{namespace}" if namespace else ""
    return f"{tag_of(shard)}changes{suffix}"


@functools.cache  # a few (namespace, count) pairs per process
def all_channels(namespace: str = "", shards: int = DEFAULT_SHARDS) -> tuple[str, ...]:
    """Every shard's channel, in shard order."""
    return tuple(channel(shard, namespace) for shard in range(shards))


@functools.cache
def shard_of_channel(namespace: str, shards: int) -> dict[str, int]:
    """Each of the deployment's channels and its shard (a channel not there is none of ours)."""
    return {name: shard for shard, name in enumerate(all_channels(namespace, shards))}


def namespace_of_database(db: int) -> str:
    return f"db{db}" if db else ""


def outbox_key(shard: int) -> str:
    """The stream of events waiting for delivery to Polar."""
    return f"{tag_of(shard)}outbox"


FLEET_TAG = f"{PREFIX}{{fleet}}:"
"""The hash tag of the keys every instance shares (heartbeats, the request budget): one slot, so a
script or an ``MGET`` may touch several of them on Redis Cluster."""


def heartbeat_key(consumer: str) -> str:
    """A key that lives while the instance whose outbox consumer is ``consumer`` is alive."""
    return f"{FLEET_TAG}alive:{encode_component(consumer)}"


BUDGET_KEY = f"{FLEET_TAG}budget"
"""The request budget for Polar's API shared by every instance (a token bucket)."""

SHARDS_KEY = f"{FLEET_TAG}shards"
"""The deployment's shard count, in decimal: written once, by the first instance that finds it
missing or by the operator (``outpost shards``); an instance configured with another refuses to
start."""


@functools.cache
def all_outboxes(shards: int = DEFAULT_SHARDS) -> tuple[str, ...]:
    """Every shard's outbox stream, in shard order."""
    return tuple(outbox_key(shard) for shard in range(shards))


@functools.cache
def shard_of_stream(shards: int) -> dict[str, int]:
    """Each of the deployment's outbox streams and its shard (a stream not there is none of
    ours)."""
    return {stream: shard for shard, stream in enumerate(all_outboxes(shards))}
