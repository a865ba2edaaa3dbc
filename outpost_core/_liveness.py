"""Which outbox consumers are dead, and what a live instance takes from them.

Every instance keeps a heartbeat key (``outpost:v2:{fleet}:alive:<consumer>``) that its delivery
loop refreshes every quarter of ``heartbeat`` seconds with a time to live of ``heartbeat``. A
consumer of the outbox group whose heartbeat key is gone is **dead**: its instance was killed, or
closed (a closing instance deletes its key so that others take what it holds at once). A live
instance surveys the group as often as it beats and, for each dead consumer, runs ``reclaim``,
which takes over the entries it holds and removes it from the group once it holds nothing, so the
group does not grow with every process that ever ran.

A consumer with no heartbeat at all (an instance of an SDK without heartbeats) counts as dead too:
its entries are taken and delivered again, which Polar de-duplicates by ``external_id``. The same
holds for a live instance that misses its heartbeats for ``heartbeat`` seconds (a stalled process):
both post the batch, Polar counts it once, and settling it twice changes nothing. ``claim_idle``
stays the fallback for a consumer whose instance beats but whose entries do not move.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from . import _keys
from ._replies import text_of

# -- actions --------------------------------------------------------------------------------------


@attrs.frozen(slots=True)
class Beat:
    """``SET key 1 PX ttl_ms``: this instance is alive for ``ttl_ms`` more milliseconds."""

    key: str
    ttl_ms: int


@attrs.frozen(slots=True)
class SurveyConsumers:
    """``XINFO CONSUMERS <each outbox stream> outpost``; report :class:`ConsumersListed`."""


@attrs.frozen(slots=True)
class CheckHeartbeats:
    """``MGET`` the heartbeat keys (one slot); report :class:`HeartbeatsChecked`."""

    keys: tuple[str, ...]


@attrs.frozen(slots=True)
class Reclaim:
    """Run ``reclaim`` on one stream: ``taker`` takes up to ``count`` entries of each of
    ``consumers`` (none when ``taker`` is empty) and those holding nothing are removed. Report
    :class:`Reclaimed`."""

    stream: str
    taker: str
    count: int
    consumers: tuple[str, ...]


@attrs.frozen(slots=True)
class ForgetHeartbeat:
    """``DEL key``: a closing instance is dead from now on."""

    key: str


# -- outcomes -------------------------------------------------------------------------------------


@attrs.frozen(slots=True)
class ConsumersListed:
    listing: Sequence[tuple[str, Any]]
    """(stream, ``XINFO CONSUMERS`` reply) for each outbox stream, as Redis answered."""


@attrs.frozen(slots=True)
class HeartbeatsChecked:
    values: Sequence[Any]
    """``MGET``'s reply: one value (``None`` when the key is gone) per key asked."""


@attrs.frozen(slots=True)
class Reclaimed:
    stream: str
    reply: Any
    """The ``reclaim`` script's reply, as Redis answered."""


# -- decisions ------------------------------------------------------------------------------------


def interval(heartbeat: float) -> float:
    """How often a loop beats and surveys: four beats per time to live, so one late beat (a slow
    request, a busy machine) never lets the key expire."""
    return heartbeat / 4


def beat(consumer: str, heartbeat: float) -> Beat:
    return Beat(_keys.heartbeat_key(consumer), max(1, round(heartbeat * 1000)))


def consumers_of(
    listing: Sequence[tuple[str, Any]], me: str, shards: int
) -> tuple[dict[str, set[str]], int]:
    """Every other consumer of each outbox stream, and how many listed items were unreadable."""
    out: dict[str, set[str]] = {}
    rejected = 0
    outboxes = _keys.shard_of_stream(shards)
    for stream, reply in listing:
        for item in reply if isinstance(reply, list) else [reply]:
            raw = item.get("name", item.get(b"name")) if isinstance(item, Mapping) else None
            name = text_of(raw)
            if name is None or stream not in outboxes:
                rejected += 1
            elif name != me:
                out.setdefault(stream, set()).add(name)
    return out, rejected


def check(consumers: dict[str, set[str]]) -> tuple[tuple[str, ...], CheckHeartbeats] | None:
    """The heartbeats to look at: one per consumer seen (``None`` when there is none)."""
    names = tuple(sorted(set().union(*consumers.values())))
    if not names:
        return None
    return names, CheckHeartbeats(tuple(_keys.heartbeat_key(n) for n in names))


def reclaims(
    consumers: dict[str, set[str]],
    names: tuple[str, ...],
    values: Sequence[Any],
    me: str,
    count: int,
) -> tuple[list[Reclaim], int]:
    """A :class:`Reclaim` for each stream where a consumer whose heartbeat is gone holds a place;
    an answer of the wrong length is rejected whole (nothing is taken: the next survey asks
    again)."""
    if not isinstance(values, Sequence) or len(values) != len(names):
        return [], 1
    dead = {name for name, value in zip(names, values, strict=True) if value is None}
    calls = [
        Reclaim(stream, me, count, tuple(sorted(members & dead)))
        for stream, members in sorted(consumers.items())
        if members & dead
    ]
    return calls, 0


def taken_entries(
    outcome: Reclaimed,
) -> tuple[list[tuple[str, str, dict[str, str]]], int] | None:
    """The entries ``reclaim`` took, as (stream, id, fields), and how many consumers it removed;
    ``None`` for an unreadable reply (taken entries then wait for the ``claim_idle`` fallback)."""
    try:
        reply = json.loads(outcome.reply)
    except (TypeError, ValueError, RecursionError):
        return None
    if not isinstance(reply, dict):
        return None
    entries, removed = reply.get("e"), reply.get("d")
    entries = [] if entries == {} else entries  # cjson writes an empty list as {}
    removed = [] if removed == {} else removed
    if not isinstance(entries, list) or not isinstance(removed, list):
        return None
    out: list[tuple[str, str, dict[str, str]]] = []
    for entry in entries:
        if (
            not isinstance(entry, list)
            or len(entry) != 2
            or not isinstance(entry[0], str)
            or not isinstance(entry[1], list)
            or len(entry[1]) % 2
        ):
            return None
        flat = entry[1]
        out.append((outcome.stream, entry[0], dict(zip(flat[::2], flat[1::2], strict=True))))
    return out, len(removed)


def hand_back(consumer: str, shards: int) -> list[ForgetHeartbeat | Reclaim]:
    """What a closing instance runs after its loops stopped: its heartbeat goes, so others take
    what it still holds at their next survey, and it leaves every group where it holds nothing."""
    return [
        ForgetHeartbeat(_keys.heartbeat_key(consumer)),
        *(Reclaim(stream, "", 0, (consumer,)) for stream in _keys.all_outboxes(shards)),
    ]
