"""What happened, as the driver reports it to the core: frozen, past-tense, serialisable."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs


@attrs.frozen(slots=True)
class ConfigurationReceived:
    """Polar's configuration payload arrived (WebSocket) or was read from the Redis cache."""

    payload: object
    from_cache: bool = False


@attrs.frozen(slots=True)
class ScriptReplied:
    """A script of ours answered (the raw reply, bytes or text)."""

    reply: object


@attrs.frozen(slots=True)
class ChangePublished:
    """A message arrived on one of the shard channels."""

    data: object


@attrs.frozen(slots=True)
class SubscriberRestarted:
    """The pub/sub connection (re)subscribed: messages may have been missed while it was down."""


@attrs.frozen(slots=True)
class IdentityLoaded:
    """``HGETALL key`` answered."""

    key: str
    fields: Mapping[Any, Any]


@attrs.frozen(slots=True)
class LoadFailed:
    """``HGETALL key`` failed; the core asks again later."""

    key: str


@attrs.frozen(slots=True)
class Tick:
    """Time passed (monotonic seconds); deadlines at or before ``now`` fire."""

    now: float


Input = (
    ConfigurationReceived
    | ScriptReplied
    | ChangePublished
    | SubscriberRestarted
    | IdentityLoaded
    | LoadFailed
    | Tick
)
