"""The channel placement: which cluster node holds each shard channel's subscription, and what
the session hears of it."""

from __future__ import annotations

import pytest

from outpost_core import (
    ChannelPlacement,
    ChannelsLost,
    ChannelSubscribed,
    NodeBroke,
    NodeConfirmed,
    NodeGaveUp,
    RetireNode,
    SlotMapRead,
    SubscribeOnNode,
    UnsubscribeOnNode,
    UsageError,
)

CHANNELS = ("c0", "c1", "c2")


def placed(owners: dict[str, str | None]) -> ChannelPlacement:
    placement = ChannelPlacement(CHANNELS)
    placement.handle(SlotMapRead(owners))
    return placement


def test_a_first_slot_map_subscribes_each_channel_on_its_owner() -> None:
    placement = placed({"c0": "a", "c1": "b", "c2": "a"})
    assert placement.effects() == [
        SubscribeOnNode("a", "c0"),
        SubscribeOnNode("b", "c1"),
        SubscribeOnNode("a", "c2"),
    ]
    assert not placement.unplaced()
    assert placement.effects() == []


def test_the_session_hears_a_channel_once_its_owner_confirmed_it() -> None:
    placement = placed({"c0": "a", "c1": "b", "c2": "a"})
    placement.effects()
    placement.handle(NodeConfirmed("a", "c0"))
    placement.handle(NodeConfirmed("b", "c0"))  # not b's: a stale confirmation
    placement.handle(NodeConfirmed("z", "c1"))  # no such node
    assert placement.effects() == [ChannelSubscribed("c0")]


def test_a_moved_slot_is_unsubscribed_lost_then_subscribed_on_its_new_owner() -> None:
    placement = placed({"c0": "a", "c1": "b", "c2": "a"})
    placement.effects()
    placement.handle(SlotMapRead({"c0": "a", "c1": "b", "c2": "b"}))
    assert placement.effects() == [
        UnsubscribeOnNode("a", ("c2",)),
        ChannelsLost(("c2",)),
        SubscribeOnNode("b", "c2"),
    ]
    assert placement.held_by("b", "c2") and not placement.held_by("a", "c2")
    placement.handle(SlotMapRead({"c0": "a", "c1": "b", "c2": "b"}))
    assert placement.effects() == []  # nothing moved


def test_a_node_left_with_no_channel_is_retired() -> None:
    placement = placed({"c0": "a", "c1": "b", "c2": "b"})
    placement.effects()
    placement.handle(SlotMapRead({"c0": "b", "c1": "b", "c2": "b"}))
    assert placement.effects() == [
        UnsubscribeOnNode("a", ("c0",)),
        ChannelsLost(("c0",)),
        SubscribeOnNode("b", "c0"),
        RetireNode("a"),
    ]


def test_a_node_that_gave_everything_up_and_owns_it_again_is_not_retired() -> None:
    placement = placed({"c0": "a", "c1": "a", "c2": "a"})
    placement.effects()
    placement.handle(NodeGaveUp("a"))  # a client that says only that a slot moved
    assert placement.effects() == [ChannelsLost(("c0", "c1", "c2"))]
    assert placement.unplaced()
    placement.handle(SlotMapRead({"c0": "a", "c1": "a", "c2": "a"}))
    assert placement.effects() == [SubscribeOnNode("a", c) for c in CHANNELS]


def test_a_node_gives_up_only_the_channels_it_held() -> None:
    placement = placed({"c0": "a", "c1": "b", "c2": "a"})
    placement.effects()
    placement.handle(NodeGaveUp("a", ("c1", "c2")))
    assert placement.effects() == [ChannelsLost(("c2",))]
    placement.handle(NodeGaveUp("a", ("c2",)))  # told twice: lost once
    placement.handle(NodeGaveUp("z", ("c0",)))  # no such node
    assert placement.effects() == []
    assert placement.unplaced()


def test_a_broken_node_loses_its_channels_and_they_go_to_their_owner_at_the_next_look() -> None:
    placement = placed({"c0": "a", "c1": "b", "c2": "a"})
    placement.effects()
    placement.handle(NodeBroke("a"))
    assert placement.effects() == [ChannelsLost(("c0", "c2"))]
    placement.handle(NodeBroke("a"))  # dropped already
    placement.handle(NodeConfirmed("a", "c0"))  # a confirmation that came late
    assert placement.effects() == []
    placement.handle(SlotMapRead({"c0": "c", "c1": "b", "c2": "c"}))
    assert placement.effects() == [SubscribeOnNode("c", "c0"), SubscribeOnNode("c", "c2")]
    assert not placement.unplaced()


def test_a_slot_no_node_serves_stays_unplaced_until_one_does() -> None:
    placement = placed({"c0": "a", "c1": None, "c2": "a"})
    assert placement.effects() == [SubscribeOnNode("a", "c0"), SubscribeOnNode("a", "c2")]
    assert placement.unplaced()
    placement.handle(SlotMapRead({"c0": "a", "c1": "b", "c2": "a"}))
    assert placement.effects() == [SubscribeOnNode("b", "c1")]


def test_a_channel_whose_slot_becomes_unserved_is_lost() -> None:
    placement = placed({"c0": "a", "c1": "b", "c2": "a"})
    placement.effects()
    placement.handle(SlotMapRead({"c0": "a", "c1": None, "c2": "a"}))
    assert placement.effects() == [
        UnsubscribeOnNode("b", ("c1",)),
        ChannelsLost(("c1",)),
        RetireNode("b"),
    ]


def test_the_driver_misusing_the_placement_is_told_at_once() -> None:
    placement = ChannelPlacement(CHANNELS)
    with pytest.raises(UsageError, match="names no owner"):
        placement.handle(SlotMapRead({"c0": "a"}))
    with pytest.raises(UsageError, match="not an input"):
        placement.handle("tick")  # type: ignore[arg-type]
