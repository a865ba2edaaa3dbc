"""The subscriber's skipping of this instance's own echoes (shared by both drivers)."""

from __future__ import annotations

import outpost_async._client as async_client
import outpost_sync._client as sync_client


def test_an_echo_is_recognised_once_and_only_its_own_text() -> None:
    for Echoes in (async_client.Echoes, sync_client.Echoes):
        echoes = Echoes(size=3)
        echoes.expect(b'{"c":[{"k":"s","r":2}]}')
        assert not echoes.seen(b'{"c":[{"k":"s","r":3}]}')
        assert echoes.seen(b'{"c":[{"k":"s","r":2}]}')
        assert not echoes.seen(b'{"c":[{"k":"s","r":2}]}')  # once
        assert not echoes.seen(None)
        assert not echoes.seen(["unhashable"])
        echoes.expect(None)  # not a reply: ignored


def test_echoes_that_never_come_are_forgotten() -> None:
    echoes = async_client.Echoes(size=2)
    for n in range(5):
        echoes.expect(f"reply {n}")
    assert not echoes.seen("reply 0")
    assert echoes.seen("reply 3") and echoes.seen("reply 4")
