"""Which node of a Redis Cluster holds the subscription to each shard channel.

A sharded subscription lives on the node that owns the channel's slot, and no client follows a
fail-over or a slot migration by itself. The driver reads the slot map (after a break, and
every so often) and tells this machine who owns what; the machine answers with the
subscriptions to make and drop on each node, and with what the session must hear: a channel
stops counting as followed as soon as its node breaks or gives the slot away
(:class:`ChannelsLost`), and counts again once its owner confirmed it
(:class:`ChannelSubscribed`). A confirmation that comes from a node that no longer holds the
channel (it moved meanwhile) changes nothing.

Sans-IO like the session: the driver feeds :meth:`ChannelPlacement.handle` and runs what
:meth:`ChannelPlacement.effects` gives, in order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from ._inputs import ChannelsLost, ChannelSubscribed
from .errors import UsageError

# -- what the driver saw -------------------------------------------------------------------------


@attrs.frozen(slots=True)
class SlotMapRead:
    """The slot map as the cluster client sees it now: each channel's owning node by name
    (``host:port``), or ``None`` where no node serves its slot yet."""

    owners: Mapping[str, str | None]


@attrs.frozen(slots=True)
class NodeConfirmed:
    """``node`` confirmed its subscription to ``channel``."""

    node: str
    channel: str


@attrs.frozen(slots=True)
class NodeGaveUp:
    """``node`` stopped serving these channels while its connection lives on: it refused a
    subscription, or told of a slot that moved away. ``None``: every channel it held (a client
    that says a slot moved without saying which)."""

    node: str
    channels: tuple[str, ...] | None = None


@attrs.frozen(slots=True)
class NodeBroke:
    """The subscription connection to ``node`` broke; the driver has dropped it."""

    node: str


PlacementInput = SlotMapRead | NodeConfirmed | NodeGaveUp | NodeBroke

# -- what the driver does --------------------------------------------------------------------------


@attrs.frozen(slots=True)
class SubscribeOnNode:
    """Subscribe ``channel`` on ``node`` (one slot per command), opening a subscription
    connection to the node if there is none."""

    node: str
    channel: str


@attrs.frozen(slots=True)
class UnsubscribeOnNode:
    """The slots of ``channels`` moved away from ``node``: unsubscribe them there (a fail-over no
    call saw fail)."""

    node: str
    channels: tuple[str, ...]


@attrs.frozen(slots=True)
class RetireNode:
    """``node`` holds no channel any more: close its subscription connection."""

    node: str


PlacementEffect = (
    SubscribeOnNode | UnsubscribeOnNode | RetireNode | ChannelsLost | ChannelSubscribed
)


class ChannelPlacement:
    def __init__(self, channels: Sequence[str]) -> None:
        self.channels = tuple(channels)
        self._held: dict[str, set[str]] = {}  # node -> the channels given to it
        self._effects: list[PlacementEffect] = []

    def handle(self, event: PlacementInput) -> None:
        if isinstance(event, SlotMapRead):
            self._place(event.owners)
        elif isinstance(event, NodeConfirmed):
            if self.held_by(event.node, event.channel):
                self._effects.append(ChannelSubscribed(event.channel))
        elif isinstance(event, NodeGaveUp):
            held = self._held.get(event.node, set())
            gone = set(held) if event.channels is None else held & set(event.channels)
            held -= gone
            self._lose(gone)
        elif isinstance(event, NodeBroke):
            self._lose(self._held.pop(event.node, set()))
        else:
            raise UsageError(f"not an input of the channel placement: {event!r}")

    def effects(self) -> list[PlacementEffect]:
        """What to do, in order; each call hands out what came since the last."""
        effects, self._effects = self._effects, []
        return effects

    def unplaced(self) -> bool:
        """Whether a channel has no node (its slot unserved, its node broke or refused it): the
        driver then looks at the slot map again soon."""
        return sum(len(channels) for channels in self._held.values()) < len(self.channels)

    def held_by(self, node: str, channel: str) -> bool:
        """Whether ``channel`` is given to ``node`` now."""
        return channel in self._held.get(node, ())

    def _place(self, owners: Mapping[str, str | None]) -> None:
        missing = [channel for channel in self.channels if channel not in owners]
        if missing:
            raise UsageError(f"the slot map read names no owner for {missing}")
        for node, held in list(self._held.items()):
            moved = {channel for channel in held if owners[channel] != node}
            if moved:
                held -= moved
                self._effects.append(UnsubscribeOnNode(node, tuple(sorted(moved))))
                self._lose(moved)
        placed = {channel for held in self._held.values() for channel in held}
        for channel in self.channels:
            owner = owners[channel]
            if channel in placed or owner is None:  # an unserved slot is looked at again
                continue
            self._held.setdefault(owner, set()).add(channel)
            self._effects.append(SubscribeOnNode(owner, channel))
        for node in [node for node, held in self._held.items() if not held]:
            del self._held[node]  # every slot it served went elsewhere
            self._effects.append(RetireNode(node))

    def _lose(self, channels: set[str]) -> None:
        if channels:
            self._effects.append(ChannelsLost(tuple(sorted(channels))))
