"""What happened, as the driver reports it to the core: frozen, past-tense, serialisable."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs


@attrs.frozen(slots=True)
class ConfigurationReceived:
    """Polar's configuration payload arrived (WebSocket) or was read from the Redis cache (then
    ``payload`` may be the cached JSON text, bytes or str, which the core parses)."""

    payload: object
    from_cache: bool = False


@attrs.frozen(slots=True)
class ScriptReplied:
    """A script of ours answered (the raw reply: bytes or text, or a pair of them, see
    ``_changes``). ``ticket``: what :meth:`Session.script_sent` gave a script of this instance
    that writes customers' state (track, an admission); with one, ``reply`` may be ``None``: the
    script wrote nothing (an admission refused)."""

    reply: object
    tag: int | None = None
    ticket: int | None = None


@attrs.frozen(slots=True)
class ScriptFailed:
    """A script could not run (Redis failed): a tagged one the session asked for (``tag``), or a
    script of this instance with its ticket (``ticket``, from :meth:`Session.script_sent`)."""

    tag: int | None = None
    ticket: int | None = None


@attrs.frozen(slots=True)
class ChangePublished:
    """A message arrived on one of the shard channels."""

    data: object


@attrs.frozen(slots=True)
class SubscriberRestarted:
    """Redis confirmed the subscription to every shard channel (the first time, or again after
    a break): messages may have been missed before, so every copy reloads, and copies loaded from
    now on follow Redis."""


@attrs.frozen(slots=True)
class SubscriptionConfirmed:
    """Redis confirmed a subscription to a shard channel: ``count`` channels are subscribed now
    (Redis confirms one channel at a time). The core decides what that means: all of them is
    :class:`SubscriberRestarted`; a first one while subscribed is a re-subscription after a break
    (:class:`SubscriberLost` first)."""

    count: int


@attrs.frozen(slots=True)
class ChannelSubscribed:
    """Redis confirmed the subscription to one shard channel (``channel``, as Redis named it),
    on its own: a cluster driver subscribes each shard on the node that owns it. Messages of that
    shard may have been missed before, so that shard's copies reload and follow from now on; the
    other shards' copies are left alone."""

    channel: object


@attrs.frozen(slots=True)
class ChannelsLost:
    """The subscriptions to these shard channels broke (their node failed, or their slot moved):
    until each is confirmed again (:class:`ChannelSubscribed`), that shard's copies do not follow
    Redis and their reads go to Redis. The other shards' copies keep following."""

    channels: tuple[object, ...]


@attrs.frozen(slots=True)
class SubscriberLost:
    """The pub/sub connection broke: until :class:`SubscriberRestarted`, no copy is following
    Redis, and reads go to Redis instead of memory."""


@attrs.frozen(slots=True)
class IdentityLoaded:
    """``HGETALL key`` answered the load ``load_id`` (from :class:`LoadIdentity`)."""

    key: str
    fields: Mapping[Any, Any]
    load_id: int


@attrs.frozen(slots=True)
class LoadFailed:
    """``HGETALL key`` failed for the load ``load_id``; the core asks again later."""

    key: str
    load_id: int


@attrs.frozen(slots=True)
class Closing:
    """The client is closing: say goodbye to Polar (a close frame) and stop reconnecting."""


@attrs.frozen(slots=True)
class Tick:
    """Time passed: ``now`` is monotonic seconds (deadlines at or before it fire), ``wall_us``
    the wall clock in microseconds since the epoch."""

    now: float
    wall_us: int = 0


@attrs.frozen(slots=True)
class PendingListed:
    """The fields of each hash a :class:`ListPending` asked for."""

    tag: int
    fields: Mapping[str, list[Any]]


@attrs.frozen(slots=True)
class ListFailed:
    tag: int


@attrs.frozen(slots=True)
class ConnectionOpened:
    """The TCP (and TLS) connection to Polar is open."""

    now: float


@attrs.frozen(slots=True)
class ConnectionFailed:
    """Opening failed, or the open connection broke."""

    now: float
    reason: str


@attrs.frozen(slots=True)
class BytesReceived:
    """Bytes from the WebSocket connection; ``b""`` means the peer closed it."""

    now: float
    data: bytes


Input = (
    ConfigurationReceived
    | ScriptReplied
    | ScriptFailed
    | PendingListed
    | ListFailed
    | ConnectionOpened
    | ConnectionFailed
    | BytesReceived
    | ChangePublished
    | SubscriberRestarted
    | SubscriberLost
    | SubscriptionConfirmed
    | ChannelSubscribed
    | ChannelsLost
    | Closing
    | IdentityLoaded
    | LoadFailed
    | Tick
)
