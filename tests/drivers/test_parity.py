"""The two drivers offer the same public surface, method for method."""

from __future__ import annotations

import inspect
import typing

import outpost_async
import outpost_sync
from outpost_async import AsyncOutpost
from outpost_sync import Outpost

# Deliberate differences, one line each with its reason.
ONLY_SYNC: dict[str, str] = {"__enter__": "with", "__exit__": "with"}
ONLY_ASYNC: dict[str, str] = {"__aenter__": "async with", "__aexit__": "async with"}


def public(cls: type) -> dict[str, object]:
    return {
        name: member
        for name, member in vars(cls).items()
        if not name.startswith("_") or name in {*ONLY_SYNC, *ONLY_ASYNC, "__init__"}
    }


def test_same_public_methods_and_signatures() -> None:
    sync, asyn = public(Outpost), public(AsyncOutpost)
    assert set(sync) - set(ONLY_SYNC) == set(asyn) - set(ONLY_ASYNC)
    for name in set(sync) - set(ONLY_SYNC):
        a, b = sync[name], asyn[name]
        if isinstance(a, property):
            assert isinstance(b, property), name
            continue
        assert callable(a) and callable(b), name
        sig_a, sig_b = inspect.signature(a), inspect.signature(b)
        assert list(sig_a.parameters) == list(sig_b.parameters), name
        for p_a, p_b in zip(sig_a.parameters.values(), sig_b.parameters.values(), strict=True):
            assert (p_a.kind, p_a.default) == (p_b.kind, p_b.default), f"{name}.{p_a.name}"
        if name != "__init__":
            assert not inspect.iscoroutinefunction(a), name
            assert inspect.iscoroutinefunction(b), name


def test_same_exports() -> None:
    renamed = {"Outpost", "Reservation"}  # AsyncOutpost, AsyncReservation in the async driver
    asynchronous = {"AsyncOutpost", "AsyncReservation"}
    assert set(outpost_sync.__all__) - renamed == set(outpost_async.__all__) - asynchronous


def test_each_driver_does_every_effect_the_core_asks_for_and_no_other() -> None:
    """A driver is dispatch tables (docs/driver-howto.md): one method for each effect."""
    from outpost_async import _cluster as async_cluster
    from outpost_async import _delivery as async_delivery
    from outpost_async import _effects as async_effects
    from outpost_core import (
        ChannelsLost,
        ChannelSubscribed,
        DeliveryEffect,
        Effect,
        PlacementEffect,
    )
    from outpost_sync import _cluster as sync_cluster
    from outpost_sync import _delivery as sync_delivery
    from outpost_sync import _effects as sync_effects

    session = set(typing.get_args(Effect))
    delivery = set(typing.get_args(DeliveryEffect))  # hand_back()'s effects among them
    # The placement's own effects; what it tells the session goes to the session.
    placement = set(typing.get_args(PlacementEffect)) - {ChannelsLost, ChannelSubscribed}
    for effects in (async_effects, sync_effects):
        assert set(effects._SESSION_EFFECTS) == session
    for deliveries in (async_delivery, sync_delivery):
        assert set(deliveries._DELIVERY_EFFECTS) == delivery
    for cluster in (async_cluster, sync_cluster):
        assert set(cluster._PLACEMENT_EFFECTS) == placement
